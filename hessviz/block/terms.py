r"""The three terms of the Hessian, stated once: ``full``, ``outer`` (Gauss–Newton) and ``functional``.

``MODEL.md``: ``H = Jᵀ ∇²_Z ℓ J + Σ_i (∂ℓ/∂Z_i) ∇²Z_i``. A term is a pair of weights
``(outer, functional)`` on the two parts:

==============  =========  ==============  ===========================================
term            ``outer``  ``functional``  what it keeps
==============  =========  ==============  ===========================================
``full``        1          1               both parts
``outer``       1          0               ``Jᵀ ∇²_Z ℓ J``: the loss curvature through Jacobians
``functional``  0          1               ``Σ_i (∂ℓ/∂Z_i) ∇²Z_i``: the model's second derivatives
==============  =========  ==============  ===========================================

Both engines read this table: the dense assembler (:mod:`hessviz.dense.assembly`,
:mod:`hessviz.dense.stack`) weighs the two parts with ``(outer, functional)``; the product sweep
(:mod:`hessviz.products.tape`) seeds the loss curvature when ``outer`` is on and keeps the
second-order parts of every node when ``functional`` is on (:data:`SWEEP_RULES`).
"""

from __future__ import annotations

from typing import NamedTuple

from hessviz.errors import ConfigError


class Weights(NamedTuple):
    outer: float
    """weight of the Gauss–Newton part ``Jᵀ ∇²_Z ℓ J``."""
    functional: float
    """weight of the model's second derivatives ``Σ_i (∂ℓ/∂Z_i) ∇²Z_i``."""


TERMS: dict[str, Weights] = {
    "full": Weights(1.0, 1.0),
    "outer": Weights(1.0, 0.0),
    "functional": Weights(0.0, 1.0),
}
"""term -> its weights on the two parts; the keys in the order of ``MODEL.md`` (``full`` first)."""

NAMES: tuple[str, ...] = tuple(TERMS)
"""``("full", "outer", "functional")``."""

PARTS_FIRST: tuple[str, ...] = ("outer", "functional", "full")
"""The two parts, then their sum: the order in which a dense engine computes them (``full`` is
``outer + functional`` once both are cached) and in which sweeps and figures list them."""

SWEEP_RULES: dict[str, tuple[bool, bool]] = {
    name: (w.outer != 0.0, w.functional != 0.0) for name, w in TERMS.items()
}
"""term -> (seed the adjoint tangent with the loss curvature, keep the second-order parts)."""


def check_term(term: str) -> str:
    """``term`` if it is one of :data:`NAMES`; a :class:`~hessviz.errors.ConfigError` naming them if not."""
    if term not in TERMS:
        raise ConfigError(f"term must be one of {', '.join(map(repr, TERMS))}, got {term!r}")
    return term
