r"""Precomputed views of one layer of a real model on one text, kept in one ``.npz`` file.

A hosted server (1 GB, a few seconds of work per view) cannot compute the Real model page's
default views while a class waits, so ``scripts/precompute_real.py`` computes them once, with
the same functions the page calls live (:mod:`hessviz.pretrained.explore`), and writes them
to :data:`FILE`. The page reads an entry when its view matches it exactly, and computes
otherwise.

**Entries.** Each entry is one result of one *kind* for one *view*:

==============  ===========================================  ===============================
kind            what                                         arrays
==============  ===========================================  ===============================
``tokens``      the token strings of the text                ``tokens (L,)`` str
``attention``   every head's attention weights               ``A (H, L, L)``
``window``      the exact Hessian block of a head slice      ``B (size, size)``
``gradients``   ``‖g_b‖_F`` of every block                   ``names``, ``norms``, ``sizes``
``table``       top eigenvalue and trace of every block      as :func:`explore.curvature_table`
==============  ===========================================  ===============================

The view of an entry is its key: a tuple of plain values, ``(kind, model, text, …)`` exactly
as :mod:`hessviz.app.cache` builds it (the text in full, so that a changed default text
never matches an old entry). Arrays are stored as float64 (the page's figures and the
statistics under them are then the same numbers as a fresh computation's); a manifest
(JSON, in the array ``manifest``) lists each entry's key, its array names and, under
``"made"``, how the file was made (the script's command line, versions, seconds per entry).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from hessviz.resources import data

FILE = data("real_views.npz")
"""The package's precomputed views (``scripts/precompute_real.py``)."""
KINDS = ("tokens", "attention", "window", "gradients", "table")

Key = tuple
Entry = dict[str, object]


def _plain(key: Iterable) -> list:
    """A key as JSON values (tuples become lists; bools, ints, floats and strings stay)."""
    return [_plain(k) if isinstance(k, tuple | list) else k for k in key]


def _tuple(key: list) -> Key:
    return tuple(_tuple(k) if isinstance(k, list) else k for k in key)


def made(version: str, command: str, models: Sequence[str], text: str, seconds: dict, **settings) -> dict:
    """How a precomputed file was made, for its ``"made"`` record: the script's ``command`` line, the
    ``models``, the ``text``, the ``settings`` that shaped the entries, the ``seconds`` each took, the
    versions of hessviz (``version``: the caller's ``hessviz.__version__``, a layer above this one),
    torch and Python, torch's thread count and the date (UTC)."""
    import platform
    import time

    import torch

    return {
        "command": command,
        "models": list(models),
        "text": text,
        **settings,
        "seconds": seconds,
        "hessviz": version,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def save(path: Path, entries: dict[Key, Entry], made: dict) -> int:
    """Write ``entries`` (key -> ``{name: array, list or number}``) to ``path``; returns its bytes."""
    arrays, manifest = {}, {"made": made, "entries": []}
    for i, (key, entry) in enumerate(entries.items()):
        if key[0] not in KINDS:
            raise ValueError(f"an entry's key must start with one of {KINDS}, got {key[0]!r}")
        names = {}
        for name, value in entry.items():
            a = np.asarray(value)
            if a.dtype.kind == "f":
                a = a.astype(np.float64)
            elif a.dtype.kind == "U":
                a = a.astype(str)
            names[name] = f"e{i}_{name}"
            arrays[names[name]] = a
        manifest["entries"].append({"key": _plain(key), "arrays": names})
    arrays["manifest"] = np.array(json.dumps(manifest, ensure_ascii=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)
    return path.stat().st_size


def _value(a: np.ndarray) -> object:
    """An array as the cache holds it: 0-d numbers as Python numbers, string arrays as lists."""
    if a.ndim == 0:
        return a.item()
    if a.dtype.kind == "U":
        return a.tolist()
    a.flags.writeable = False
    return a


def read(path: Path) -> tuple[dict[Key, Entry], dict]:
    """``(entries, made)`` of a file written by :func:`save`."""
    with np.load(path, allow_pickle=False) as z:
        manifest = json.loads(str(z["manifest"]))
        entries = {
            _tuple(e["key"]): {name: _value(z[a]) for name, a in e["arrays"].items()}
            for e in manifest["entries"]
        }
    return entries, manifest["made"]


@lru_cache(maxsize=4)
def _entries(path: str, mtime_ns: int) -> dict[Key, Entry]:
    return read(Path(path))[0]


def lookup(key: Key, path: Path = FILE) -> Entry | None:
    """The entry of ``key`` in ``path`` (read once per file state), or None (no entry, no file)."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return None
    return _entries(str(path), mtime).get(_tuple(_plain(key)))
