"""The files hessviz ships inside its package (``hessviz/data/``), found the same way in a checkout and
in an installed wheel.

``hessviz/data/`` holds, read-only:

- ``models/``: the bundled pydoc models (``pydoc-postln``, ``pydoc-preln``, ``pydoc-llama``), each a
  folder of ``model.safetensors``, ``config.json`` and ``tokenizer.json``;
- ``claims/``: the papers' claims as measured and committed (``claims.json``, ``report.md``, ``data/``,
  ``real_weights/``, ``smollm2/``, ``gemma3/``; no HTML figures: the app draws them from ``data/``);
- ``real_views.npz`` and ``whole_tables.json``: the Real and Whole model pages' stored default views.

Nothing writes here: commands that produce files take ``--out`` (default: the working directory).
The folder is located through :mod:`importlib.resources`, never through ``__file__``'s parents,
so it is the installed package's own copy wherever the package lives.

>>> (data("models") / "pydoc-llama" / "config.json").is_file()
True
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from hessviz.errors import HessvizError


def cache_dir() -> Path:
    """Where hessviz keeps what it computed once and may reuse: ``$HESSVIZ_CACHE``, else
    ``$XDG_CACHE_HOME/hessviz``, else ``~/.cache/hessviz`` (created by whoever writes there)."""
    if os.environ.get("HESSVIZ_CACHE"):
        return Path(os.environ["HESSVIZ_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "hessviz"


def data(*parts: str) -> Path:
    """The path of ``hessviz/data/<parts…>`` (which may not exist: callers check what they need).

    hessviz reads its data as files (safetensors maps them, NumPy opens archives lazily), so the
    package must be installed as a folder, as pip always does; a zipped install is refused here.
    """
    root = resources.files("hessviz").joinpath("data")
    if not isinstance(root, Path):
        raise HessvizError(
            f"hessviz's data folder is not on the file system ({root!r}): install hessviz as a folder "
            "(pip install hessviz), not zipped"
        )
    return root.joinpath(*parts)
