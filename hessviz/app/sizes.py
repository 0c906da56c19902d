"""What a stored result weighs, and how it is kept from change: the store's two helpers.

:func:`nbytes` counts the bytes a result holds (arrays by their buffers, containers by what they
hold, small objects ~64 bytes), the figure the store charges the
:class:`~hessviz.app.gates.Ledger`; :func:`readonly` marks its numpy arrays read-only, since one
stored result is shared by every visitor.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch


def nbytes(value: object) -> int:
    """Bytes held by a result (arrays counted by their buffers; small objects ~64 bytes)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes) + 112
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size()) + 112
    if isinstance(value, dict):
        return 64 + sum(nbytes(k) + nbytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 64 + sum(nbytes(v) for v in value)
    if isinstance(value, str | bytes):
        return 49 + len(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return 64 + sum(nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    if hasattr(value, "to_plotly_json"):  # a plotly figure: its data and layout as dicts and lists
        return 64 + nbytes(value.to_plotly_json())
    return 64


def readonly(value):
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, dict):
        for v in value.values():
            readonly(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            readonly(v)
    return value
