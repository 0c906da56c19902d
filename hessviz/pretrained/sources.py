"""Every kind of ``source`` (``MODEL.md`` parts 2 and 4), opened as one :class:`Checkpoint`.

- a checkpoint folder, or a bundled name of one (:meth:`Checkpoint.open`);
- a GGUF file, or the bundled ``"smollm2-135m"`` (:mod:`hessviz.pretrained.gguf_file`);
- a model object in memory (:mod:`hessviz.pretrained.module_source`).

The readers of each kind build on :mod:`hessviz.pretrained.checkpoint`; this module sits above them
all, so the imports run one way.
"""

from __future__ import annotations

import os

from hessviz.pretrained.checkpoint import Checkpoint, _installed_gguf, resolve_source
from hessviz.pretrained.gguf_file import GGUFCheckpoint
from hessviz.pretrained.module_source import open_object


def open_source(source: object) -> Checkpoint:
    """The checkpoint ``source`` names: a folder, a GGUF file, a bundled name or a model object."""
    if not isinstance(source, (str, os.PathLike)):
        return open_object(source)
    path = resolve_source(source)
    if path.is_file():
        return GGUFCheckpoint.open_file(path, _installed_gguf().get(path))
    return Checkpoint.open(path)
