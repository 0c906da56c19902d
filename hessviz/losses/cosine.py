r"""Sentence similarity of a mean-pooled embedding against a fixed one: :class:`Cosine`.

all-MiniLM-L6-v2's training objective. For ``Z (L, d)``, the mean-pooled embedding
``m = (1/L) Σ_t Z_t`` (sentence-transformers' pooling, no padding: :func:`mean_pooled`), the other
sentence's embedding ``e (d,)`` fixed, ``u = m/‖m‖``, ``ê = e/‖e‖`` and ``c = uᵀê``:

.. math::
    ℓ = 1 − c,\qquad ∇_m ℓ = −\frac{ê − c\,u}{‖m‖},\qquad
    ∇^2_m ℓ = \frac{u ê^⊤ + ê u^⊤ + c\,(I − 3 u u^⊤)}{‖m‖^2},

and through the pooling ``∇_{Z_t} ℓ = ∇_m ℓ / L`` for every token, ``N = (1 1ᵀ ⊗ ∇^2_m ℓ) / L²``:
every pair of tokens is coupled (not token-wise), so ``N`` is given as its product,
``(N Ż)_t = ∇^2_m ℓ\, Σ_s Ż_s / L²`` (``O(k L d + k d²)``), and formed only on request
(:meth:`Cosine.dense_hessian`, ``(L·d)²``: 1.2 GB at 32 tokens of MiniLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from hessviz.errors import InputError
from hessviz.losses.base import TargetLoss, check_Z
from hessviz.losses.objective import ModelObjective


def mean_pooled(Z: Tensor) -> Tensor:
    """``(d,)``: the sentence embedding of sentence-transformers' mean pooling (no padding)."""
    return check_Z(Z).mean(0)


@dataclass(frozen=True, eq=False)
class Cosine(TargetLoss, ModelObjective):
    """``1 − cos(mean_pooled(Z), other)`` against the other sentence's fixed embedding
    ``target (d,)`` (``Cosine(other)``); :meth:`at` places it at ``Z``. Checked when built and
    when placed: an :class:`InputError` naming ``other`` or ``Z``."""

    def __post_init__(self):
        e = self.target
        if not isinstance(e, Tensor) or e.dim() != 1 or not bool(e.norm() > 0):
            raise InputError(f"other must be a non-zero (d,) embedding, got {getattr(e, 'shape', e)}")
        if self.Z is not None:
            d = check_Z(self.Z).shape[1]
            if e.shape != (d,):
                raise InputError(f"other must be a non-zero ({d},) embedding, got {tuple(e.shape)}")
            if not bool(self._terms[1] > 0):
                raise InputError("Z's mean-pooled embedding is zero: the cosine is not differentiable there")

    @property
    def token_wise(self) -> bool:
        return False

    @cached_property
    def _terms(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(u, ‖m‖, ê, c)`` at the point."""
        Z = self.point
        m = Z.mean(0)
        r = m.norm()
        u, e = m / r, (self.target / self.target.norm()).to(Z)
        return u, r, e, u @ e

    @cached_property
    def value(self) -> Tensor:
        return 1.0 - self._terms[3]

    @cached_property
    def grad(self) -> Tensor:
        """``−(ê − c u) / (‖m‖ L)`` for every token, ``(L, d)``."""
        u, r, e, c = self._terms
        L, d = self.point.shape
        return (-(e - c * u) / r).expand(L, d) / L

    @cached_property
    def hess_m(self) -> Tensor:
        """``∇²_m ℓ (d, d)``."""
        u, r, e, c = self._terms
        eye = torch.eye(u.shape[0], dtype=u.dtype, device=u.device)
        return (torch.outer(u, e) + torch.outer(e, u) + c * (eye - 3.0 * torch.outer(u, u))) / r**2

    def token_curvature(self) -> Tensor:
        raise ValueError("the cosine objective couples tokens: it has no (L, d, d) form")

    def product(self, dZ: Tensor) -> Tensor:
        """``(k, L, d)``: every token gets ``∇²_m ℓ Σ_t Ż_t / L²``."""
        L = self.point.shape[0]
        return (dZ.sum(1) @ self.hess_m / L**2).unsqueeze(1).expand_as(dZ)

    def dense_hessian(self) -> Tensor:
        """``(1 1ᵀ ⊗ ∇²_m ℓ) / L²``, ``(L·d, L·d)``."""
        Z = self.point
        L = Z.shape[0]
        return torch.kron(torch.ones(L, L, dtype=Z.dtype, device=Z.device), self.hess_m) / L**2
