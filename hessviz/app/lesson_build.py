r"""The app's "Download as a page": a lesson page priced, gated and made in a process of its own.

A lesson page (:mod:`hessviz.app.lesson_page`) computes every combination of its baked controls:
one click can ask for many views. In the app it is treated as one more heavy computation:

* **Priced first** (:func:`verdict`). Its cost is the sum of its combinations' views, each priced
  as its page prices it (:meth:`hessviz.app.lesson_page.LessonSpec.cost`), plus
  :data:`FIGURE_SECONDS` per combination and the builder's own start (:data:`START_SECONDS`,
  :data:`CHILD_BYTES`). It is offered only when :func:`hessviz.app.budget.check` accepts that cost
  under the server's profile, and refused with the budget's one line otherwise: a refused build
  starts nothing, whoever asks and however often.
* **Gated and shared** (:func:`make`). It goes through the server's store
  (:data:`hessviz.app.cache.STORE`): it waits for a heavy slot like any view, reserves its builder's
  memory in the ledger, and the visitors who ask for the same link share one build and its bytes.
  One build per session at a time.
* **Made where a runaway cannot take the server** (:func:`run`). The page is made by a fresh Python
  process, started from the visitor's script thread (never one of Streamlit's executors), whose
  CPU time is limited by the kernel (``RLIMIT_CPU``: :data:`hessviz.app.budget.WORK_FACTOR` times
  the per-view seconds, the bound every view has) and its data segment by ``RLIMIT_DATA``. It dies
  with its parent thread (``PR_SET_PDEATHSIG``). Its progress lines become the page's progress bar;
  between them the script thread asks whether the visitor is still there, and kills the builder
  when not (:class:`hessviz.app.progress.Cancelled`) or when a wall-clock bound passes.
* **Downloaded without work, and never an error file.** The download button is drawn only once the
  page is made (:func:`built`), and its callable (Streamlit runs it on the event loop's shared
  executor) returns the very bytes the button was drawn with: it never computes, and a page that
  has left the store since is still the page, not a line saying so. The file is named after the
  view (:func:`hessviz.app.lesson_page.file_name`).

The command line (``hessviz lesson``) makes its page in its own process already and calls
:func:`hessviz.app.lesson_page.write` directly.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import hessviz as hv
from hessviz.app import address, budget, cache, lesson_page, progress
from hessviz.app.profiles import Limits
from hessviz.checks.cost import Cost

START_SECONDS = 2.0
"""CPU seconds a builder spends before its first view: Python, torch, scipy and plotly imported
(measured 1.5–1.6 s on the 2-core development machine, ``python -c "import hessviz.app.lesson_page"``)."""
FIGURE_SECONDS = 0.05
"""CPU seconds per combination for its figures written as compact JSON (measured: the three views
of a small Scaling lesson took 0.48 s, their sweeps priced at 0.43 s)."""
CHILD_BYTES = 224 << 20
"""Private memory of a builder once imported (measured RssAnon: 201 MiB after the imports, of them
torch 146 MiB; 218 MiB after a small build). Reserved in the ledger while it runs: the server's
process and its builder share one host."""
DATA_SLACK_BYTES = 128 << 20
"""What ``RLIMIT_DATA`` allows a builder beyond its reservation: private mappings it reserves but does
not touch (VmData − RssAnon: 70 MiB measured after the imports)."""
PAGE_COPIES = 3
"""Copies of a page a builder holds at its end (the figures' JSON, the page's text, its bytes)."""
WALL_FACTOR = 4.0
"""A builder is also stopped after ``WALL_SECONDS + WALL_FACTOR × its CPU limit`` of wall time: a
machine shared by every visitor runs it slower than its CPU time, but never this much slower."""
WALL_SECONDS = 30.0
POLL_SECONDS = 0.25
"""How often the script thread asks whether the visitor is still there while the builder runs."""

_LOG = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- the price


def store_key(url: str) -> tuple:
    """The store's key of a lesson link's page: its page and its query, keys sorted."""
    page, query = lesson_page.split_url(url)
    return ("lesson_page", f"{page}?{address.encode_query(dict(sorted(query.items())))}")


def cpu_limit(lim: Limits) -> int:
    """Whole CPU seconds a builder may use under ``lim``: the work bound of a view."""
    return max(1, math.ceil(budget.WORK_FACTOR * lim.max_seconds))


def price(url: str) -> tuple[Cost, list[lesson_page.Baked]]:
    """What making the lesson page of ``url`` costs, before anything is computed, and the controls it
    bakes. Raises :class:`hessviz.app.lesson_page.LessonError` with the app's line for a link the app
    does not offer, or whose first combination the block cannot take (as the build would)."""
    spec, s = lesson_page.settle(url)
    baked = spec.bake(s)
    combos = list(itertools.product(*(range(len(b.values)) for b in baked)))
    seconds, peak = START_SECONDS, 0
    for n, combo in enumerate(combos):
        try:
            c = spec.cost(*lesson_page._combination(spec, s, baked, combo))
        except hv.HessvizError as err:
            if n == 0:
                raise lesson_page.LessonError(str(err)) from None
            continue  # shown as unavailable in the page: nothing computed
        seconds += c.seconds + FIGURE_SECONDS
        peak = max(peak, c.bytes)
    views = f"{len(combos)} view{'s' if len(combos) != 1 else ''}"
    nbytes = CHILD_BYTES + peak + PAGE_COPIES * lesson_page.LIMIT_BYTES
    return Cost(seconds, nbytes, f"the lesson page ({views})"), baked


@functools.lru_cache(maxsize=256)
def verdict(url: str, lim: Limits) -> budget.Verdict:
    """The budget's verdict on making the lesson page of ``url`` under ``lim`` (one line, with what to
    change when it is refused). Cached per link: every run of a page with the lesson panel asks."""
    cost, baked = price(url)
    if baked:
        keys = ", ".join(b.key for b in baked)
        advice = (
            f"It bakes every combination of {keys}: add one of them to hide= to bake fewer views, "
            "or make the page on your own machine with the hessviz lesson command."
        )
    else:
        advice = "Lower d, d_ff or L, or make the page on your own machine with the hessviz lesson command."
    return budget.check(cost, lim, advice=advice)


# ----------------------------------------------------------------------------- the builder process

BOOTSTRAP = """\
import os, sys
cpu, data, parent = (int(a) for a in sys.argv[1:4])
try:
    import resource
except ImportError:  # no rlimits on this platform: the parent's wall-clock bound still holds
    resource = None
if resource is not None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))
    if sys.platform.startswith("linux"):
        resource.setrlimit(resource.RLIMIT_DATA, (data, data))
if sys.platform.startswith("linux"):
    import ctypes, signal
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: die with the parent thread
    if os.getppid() != parent:
        sys.exit(1)
from hessviz.app.lesson_build import child
sys.exit(child(sys.argv[4:]))
"""
"""What the builder runs first (``python -c``): its limits, before anything is imported."""


def child(argv: list[str]) -> int:
    """The builder: make the page of ``argv = [url, out, limit]``, write it to ``out``; on stdout one
    JSON line per step (``{"step": [done, total, text]}``), then ``{"done": size}`` or ``{"error": line}``."""
    url, out, limit = argv[0], argv[1], int(argv[2])
    import torch

    torch.set_num_threads(1)  # one heavy slot: one core

    def emit(**message: object) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    try:
        size = lesson_page.write(url, out, limit=limit, progress=lambda d, t, text: emit(step=[d, t, text]))
    except hv.HessvizError as err:
        emit(error=" ".join(str(err).split()))
        return 2
    except MemoryError:
        emit(error="The lesson page ran out of the memory this server gives it: bake fewer views.")
        return 3
    emit(done=size)
    return 0


def _environment() -> dict[str, str]:
    """The server's environment, with this ``hessviz`` importable and one thread per library."""
    env = dict(os.environ)
    root = str(Path(hv.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = "1"
    return env


def _message(line: bytes) -> dict:
    """One line of the builder's output as a message (anything else: none)."""
    try:
        message = json.loads(line)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def _stopped(lim_seconds: float, used: float, profile: str) -> budget.OverBudget:
    return budget.OverBudget(
        f"The lesson page was stopped after {used:,.0f} s of computation: this server allows about "
        f"{lim_seconds:g} s per view ({profile} profile). Add a baked control to hide= to bake fewer "
        "views, or make the page on your own machine with the hessviz lesson command."
    )


def run(
    url: str,
    *,
    cpu_seconds: int,
    data_bytes: int,
    limit: int = lesson_page.LIMIT_BYTES,
    step: Callable[[int, int, str], None] | None = None,
    checkpoint: Callable[[], None] | None = None,
    started: Callable[[subprocess.Popen], None] | None = None,
    per_view: float | None = None,
    profile: str = "",
) -> bytes:
    """Make the lesson page of ``url`` in a builder process (:data:`BOOTSTRAP`, :func:`child`) held to
    ``cpu_seconds`` of CPU and ``data_bytes`` of data, from the calling thread; return its bytes.

    ``step(done, total, text)`` on each of its progress lines; ``checkpoint()`` every
    :data:`POLL_SECONDS` (it raises to give up: the builder is killed, whatever the exception);
    ``started(process)`` once it runs. A builder past its CPU limit, or past the wall-clock bound,
    raises :class:`hessviz.app.budget.OverBudget` (``per_view``, ``profile``: the line's numbers);
    one that cannot make the page raises :class:`hessviz.app.lesson_page.LessonError` with its line.
    """
    wall = WALL_SECONDS + WALL_FACTOR * cpu_seconds
    per_view = cpu_seconds / budget.WORK_FACTOR if per_view is None else per_view
    with tempfile.TemporaryDirectory(prefix="hessviz-lesson-") as tmp:
        out, log = Path(tmp) / "lesson.html", Path(tmp) / "stderr.txt"
        args = [str(cpu_seconds), str(data_bytes), str(os.getpid()), url, str(out), str(limit)]
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", BOOTSTRAP, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env=_environment(),
                start_new_session=True,
            )
        lines: queue.Queue[bytes | None] = queue.Queue()

        def read() -> None:  # a plain thread of this run: it only moves lines
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read, name="hessviz-lesson-reader", daemon=True)
        reader.start()
        said: dict[str, object] = {}
        deadline = time.monotonic() + wall
        try:
            if started is not None:
                started(proc)
            while True:
                try:
                    line = lines.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    line = b""
                if line is None:  # its output closed: it has ended
                    break
                message = _message(line)
                said.update(message)
                if "step" in message and step is not None:
                    step(*message["step"])
                if checkpoint is not None:
                    checkpoint()
                if time.monotonic() > deadline:
                    raise _stopped(per_view, wall, profile)
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            reader.join(5)
        if rc == 0 and "done" in said:
            return out.read_bytes()
        signals = {getattr(signal, name, None): name for name in ("SIGXCPU", "SIGKILL")}  # POSIX only
        if signals.get(-rc) == "SIGXCPU":  # the kernel's CPU limit
            raise _stopped(per_view, cpu_seconds, profile)
        if signals.get(-rc) == "SIGKILL" and "error" not in said:  # the hard CPU limit, or OOM
            _LOG.warning("lesson builder killed (SIGKILL): %s", url)
            raise _stopped(per_view, cpu_seconds, profile)
        if "error" in said:
            raise lesson_page.LessonError(str(said["error"]))
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        _LOG.warning("lesson builder failed (exit %s): %s %s", rc, url, " ".join(tail))
        raise lesson_page.LessonError(
            f"the lesson page could not be made (its builder stopped with code {rc})."
        )


# ----------------------------------------------------------------------------- in the app

BUILDS: dict[str, subprocess.Popen | None] = {}
"""Session id -> its builder (None while it waits for a slot): one build per session at a time."""
_BUILDS_LOCK = threading.Lock()


def _session_id() -> str | None:
    """This script run's session (None outside a Streamlit server: the command line, tests)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    return None if ctx is None else ctx.session_id


@contextlib.contextmanager
def one_per_session(session: str | None) -> Iterator[None]:
    """Hold this session's one build (none to hold without a session)."""
    if session is None:
        yield
        return
    with _BUILDS_LOCK:
        if session in BUILDS:
            raise lesson_page.LessonError(
                "this tab is already making a lesson page: wait for it, then ask for the next."
            )
        BUILDS[session] = None
    try:
        yield
    finally:
        with _BUILDS_LOCK:
            BUILDS.pop(session, None)


def make(url: str, lim: Limits | None = None, *, session: str | None = None) -> bytes:
    """The lesson page of ``url`` for a visitor of the app (module docstring): refused in one line,
    before any work, when its price does not fit ``lim`` (:func:`verdict`: raises
    :class:`hessviz.app.budget.OverBudget`, or :class:`hessviz.app.lesson_page.LessonError` for a
    link the app does not offer); else made once under the heavy-slot gate in a builder process,
    with the progress and cancellation of :func:`hessviz.app.progress.current`, and shared from the
    store. ``session``: this run's session (default: Streamlit's)."""
    lim = lim or cache.LIMITS
    v = verdict(url, lim)
    if not v.ok:
        raise budget.OverBudget(v.message)
    known = cache.STORE.peek(store_key(url))
    if known is not None:
        return known
    session = session if session is not None else _session_id()
    status = progress.current()

    def started(proc: subprocess.Popen) -> None:
        if session is not None:
            with _BUILDS_LOCK:
                BUILDS[session] = proc

    def build() -> bytes:
        status.checkpoint()
        return run(
            url,
            cpu_seconds=cpu_limit(lim),
            data_bytes=v.cost.bytes + DATA_SLACK_BYTES,
            step=lambda done, total, text: status.step(done, total, f"Making the lesson page: {text}"),
            checkpoint=status.checkpoint,
            started=started,
            per_view=lim.max_seconds,
            profile=lim.profile,
        )

    with one_per_session(session):
        return cache.STORE.get(store_key(url), build, v.cost.bytes, "the lesson page", v.cost.seconds)


def built(url: str) -> bytes | None:
    """The made page of ``url`` from the store, or None; never computes or waits."""
    try:
        return cache.STORE.peek(store_key(url))
    except hv.HessvizError:
        return None
