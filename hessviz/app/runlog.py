"""Where a re-render's time goes on the server: one line per script run, when asked for.

With ``HESSVIZ_RUN_LOG=1`` in the server's environment, ``app.py`` wraps each script run in
:func:`timed` and prints one line to standard error when it ends::

    hessviz-run {"page": "spectrum", "session": "3f2a9c1e", "wall_s": 0.912, "cpu_s": 0.874,
                 "end": "finished", "t": 1764525600.123}

``wall_s`` is the script run from its first line to its last (queueing for a heavy slot
included), ``cpu_s`` the CPU time of the script thread alone (with one torch thread, the
computation runs there; Streamlit's event loop, which serialises and sends the messages, is
another thread and not counted), ``end`` is ``finished``, ``stopped`` (``st.stop``, e.g. a
refused view) or ``rerun`` (a control moved mid-run and the run was dropped), ``t`` the Unix
time at the end. The load test (``tests/test_app_profiles.py``) reads these lines from the
server's log to report the server's share of a re-render. Without the variable nothing is
measured or printed.

With the same variable the cache (:mod:`hessviz.app.cache`) prints one line per result it
computes (not per result it serves from the store or from another visitor's computation)::

    hessviz-compute {"what": "sweep_point", "key": "9c0e1f2a3b4d", "heavy": false,
                     "start": 1764525599.873, "wall_s": 0.031, "session": "3f2a9c1e"}

``key`` is a digest of the whole cache key, so two lines with the same ``key`` are the same
result computed twice; the load test (``tests/test_app_load.py``) checks that thirty
visitors of one view share each computation, and ``heavy`` (it held a slot of the
:class:`hessviz.app.gates.Gate`) how many heavy ones ran at once.

The background warmer (:mod:`hessviz.app.warm`) prints one line per view it worked on, with the
CPU its thread used, so that its work is told apart from the visitors'::

    hessviz-warm {"key": "5d1c0a9e7b2f", "end": "made", "start": 1764525601.2,
                  "wall_s": 0.42, "cpu_s": 0.35}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator

ENV = "HESSVIZ_RUN_LOG"
PREFIX = "hessviz-run "
COMPUTE_PREFIX = "hessviz-compute "
WARM_PREFIX = "hessviz-warm "


def enabled(env: dict[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(ENV, "") not in ("", "0")


def _session() -> str:
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id[:8] if ctx is not None else "-"


@contextlib.contextmanager
def timed(page: str) -> Iterator[None]:
    """Time the script run inside (``page``: its URL path) and print one line when it ends."""
    if not enabled():
        yield
        return
    from streamlit.runtime.scriptrunner_utils.exceptions import RerunException, StopException

    t0, c0, end = time.perf_counter(), time.thread_time(), "finished"
    try:
        yield
    except StopException:
        end = "stopped"
        raise
    except RerunException:
        end = "rerun"
        raise
    except BaseException:
        end = "error"
        raise
    finally:
        _write(
            PREFIX,
            {
                "page": page,
                "session": _session(),
                "wall_s": round(time.perf_counter() - t0, 4),
                "cpu_s": round(time.thread_time() - c0, 4),
                "end": end,
                "t": round(time.time(), 3),
            },
        )


def _digest(key: tuple) -> str:
    return hashlib.sha1(repr(key).encode(), usedforsecurity=False).hexdigest()[:12]


def computed(key: tuple, start: float, wall_s: float, heavy: bool) -> None:
    """One line for a result the cache computed (``start``: Unix time; nothing unless enabled)."""
    if not enabled():
        return
    _write(
        COMPUTE_PREFIX,
        {
            "what": str(key[0]),
            "key": _digest(key),
            "heavy": bool(heavy),
            "start": round(start, 3),
            "wall_s": round(wall_s, 4),
            "session": _session(),
        },
    )


def warmed(key: tuple, start: float, wall_s: float, cpu_s: float, end: str) -> None:
    """One line for a view the background warmer (:mod:`hessviz.app.warm`) worked on: ``end`` is
    ``made``, ``stopped``, ``memory`` or ``failed: <error>`` (nothing unless enabled)."""
    if not enabled():
        return
    _write(
        WARM_PREFIX,
        {
            "key": _digest(key),
            "end": end,
            "start": round(start, 3),
            "wall_s": round(wall_s, 4),
            "cpu_s": round(cpu_s, 4),
        },
    )


def _write(prefix: str, line: dict) -> None:
    text = prefix + json.dumps(line) + "\n"
    try:  # one write, so other threads' log lines cannot land inside it
        os.write(sys.stderr.fileno(), text.encode())
    except (OSError, ValueError):
        print(text, end="", file=sys.stderr, flush=True)


def parse(text: str, prefix: str = PREFIX) -> list[dict]:
    """The run lines (or, with ``prefix=COMPUTE_PREFIX``, the computation lines) of a server log,
    in order (anything else on a line is ignored)."""
    decoder, out = json.JSONDecoder(), []
    for line in text.splitlines():
        at = line.find(prefix)
        if at >= 0:
            with contextlib.suppress(ValueError):
                out.append(decoder.raw_decode(line, at + len(prefix))[0])
    return out
