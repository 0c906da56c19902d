"""``hessviz app``: Streamlit serving the package's own script, settings and pages, from any folder.

Streamlit reads ``.streamlit/config.toml`` from the working directory, which an install does not
have; so the package keeps the one copy of the app's settings (``hessviz/app/config.toml``; the
checkout's ``.streamlit/config.toml`` is a link to it, for ``streamlit run app.py``) and passes each
as a command-line flag. A flag the user gives wins over the file's, and anything Streamlit accepts
passes through (``hessviz app --server.port 8600``).

The app serves on loopback (``127.0.0.1``) unless ``--server.address`` says otherwise: the local
profile reads server paths, which are no business of the room's network.

>>> argv = streamlit_argv(["--server.port", "8600"])
>>> argv[:2], argv[2].endswith("streamlit_app.py")
(['streamlit', 'run'], True)
>>> "--server.address=127.0.0.1" in argv, "--server.headless=true" in argv, argv[-2:]
(True, True, ['--server.port', '8600'])
>>> "--server.address=127.0.0.1" in streamlit_argv(["--server.address=0.0.0.0"])
False
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "streamlit_app.py"
"""The script Streamlit runs (two lines: :func:`hessviz.app.main.main`)."""
CONFIG = HERE / "config.toml"
"""The app's Streamlit settings, the one copy."""
DEFAULTS = {"server.address": "127.0.0.1"}
"""Settings ``hessviz app`` adds to the file's: loopback unless the user binds elsewhere."""


def _flatten(table: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
    """``{"server": {"port": 1}}`` -> ``("server.port", 1)``."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _flag_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings() -> dict[str, object]:
    """The app's settings, ``section.key -> value``: :data:`CONFIG`, then :data:`DEFAULTS`."""
    with CONFIG.open("rb") as f:
        return dict(_flatten(tomllib.load(f))) | DEFAULTS


def streamlit_argv(user: Sequence[str]) -> list[str]:
    """``streamlit run SCRIPT --section.key=value … USER…``: every setting the user did not give."""
    given = {a[2:].split("=", 1)[0] for a in user if a.startswith("--")}
    flags = [f"--{k}={_flag_value(v)}" for k, v in settings().items() if k not in given]
    return ["streamlit", "run", str(SCRIPT), *flags, *user]


def run(user: Sequence[str]) -> int:
    """Serve the app until interrupted; the exit status of Streamlit's command line."""
    from streamlit.web import cli as stcli

    sys.argv = streamlit_argv(user)
    try:
        stcli.main()  # click: raises SystemExit when it is done
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0
