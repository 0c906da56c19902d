"""The activation table: ``activation`` setting -> its :class:`~hessviz.ops.elementwise.Elementwise`.

A new elementwise activation is one file in :mod:`hessviz.ops` and one entry here; the settings
(:data:`hessviz.block.config.ACTIVATIONS`), both engines and the titles read this table. (The autograd
reference, :mod:`hessviz.reference`, writes its own ``φ`` with stock torch ops, on purpose.)
"""

from __future__ import annotations

from hessviz.ops.elementwise import Elementwise
from hessviz.ops.gelu import GELU
from hessviz.ops.gelu_tanh import GELUTanh
from hessviz.ops.relu import ReLU
from hessviz.ops.silu import SiLU

ACTIVATIONS: dict[str, type[Elementwise]] = {op.name: op for op in (ReLU, GELU, GELUTanh, SiLU)}


def get(name: str) -> type[Elementwise]:
    """The activation called ``name`` (a checked ``cfg.activation``)."""
    return ACTIVATIONS[name]
