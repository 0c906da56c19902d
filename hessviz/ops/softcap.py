r"""Attention soft-capping (Gemma 2): ``y = c·tanh(s/c)`` on every score, before the mask and the softmax.

With ``τ = tanh(s/c)``:

.. math::
    y = c τ, \qquad y' = 1 − τ^2, \qquad y'' = −\frac{2}{c}\, τ (1 − τ^2).

``y' > 0`` and ``|y| < c``: the cap bounds the scores smoothly. For ``|s| ≫ c`` the float ``τ`` is
``±1`` and both derivatives are exactly ``0`` (the true values are below the float's resolution).

It enters the attention's chain rule as an elementwise map ``S₀ ↦ S`` between the bilinear score
``S₀ = c_s Q Kᵀ`` and the softmax:

* dense face: the score Jacobian is ``diag(y') ∂S₀/∂θ`` (folded into the softmax side,
  ``Mᵀ Σ_t diag(y'_t)``), and the curvature between two score-side units is
  ``J₀ᵀ (diag(y') Q_softmax(g) diag(y') + diag(ḡ ⊙ y'')) J₀`` (:class:`CappedCurvature`), with
  ``ḡ = ∂/∂S`` the softmax's VJP; the bilinear score's own second derivative is contracted with
  ``∂/∂S₀ = y' ⊙ ḡ``;
* node face (the attention core's tangent and adjoint rules):

.. math::
    \dot S = y' \dot S_0, \qquad \bar S_0 = y' \bar S, \qquad
    \dot{\bar S}_0 = y' \dot{\bar S} + [y''\, \bar S\, \dot S_0].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Softcap:
    """The cap at one point ``s``: ``y``, ``y'`` and ``y''`` from one ``tanh``."""

    y: Tensor
    d1: Tensor
    d2: Tensor

    @classmethod
    def at(cls, s: Tensor, cap: float) -> Softcap:
        """``y'`` as ``1/cosh²(s/c)``: the same number as ``1 − τ²``, without its cancellation where
        ``τ → ±1`` (there ``1 − τ²`` keeps only ``1e-16/(1 − τ²)`` of its relative precision)."""
        x = s / cap
        t = torch.tanh(x)
        d1 = torch.cosh(x).square().reciprocal()  # cosh overflows to inf past |x| ≈ 710: y' = 0 there
        return cls(cap * t, d1, (-2.0 / cap) * t * d1)

    def tangent(self, ds: Tensor) -> Tensor:
        """``Ṡ = y' ⊙ Ṡ₀``."""
        return self.d1 * ds

    def adjoint(self, g: Tensor) -> Tensor:
        """``S̄₀ = y' ⊙ S̄``."""
        return self.d1 * g

    def adjoint_tangent(self, dg: Tensor | None, g: Tensor, ds: Tensor | None) -> Tensor | None:
        """``y' ⊙ S̄̇ + [y'' ⊙ S̄ ⊙ Ṡ₀]`` (either part left out where its input is ``None``)."""
        out = None if dg is None else self.d1 * dg
        if ds is not None:
            second = self.d2 * g * ds
            out = second if out is None else out + second
        return out


@dataclass(frozen=True)
class CappedCurvature:
    """The curvature of ``ℓ(softmax(cap(S₀)))`` in ``S₀`` per row, kept factored:
    ``diag(y') Q diag(y') + diag(ḡ ⊙ y'')`` with ``Q`` the softmax's (a
    :class:`~hessviz.ops.softmax.ContractedHessian`) and ``ḡ`` the gradient at ``S``."""

    softmax: object
    d1: Tensor
    e: Tensor
    """``ḡ ⊙ y''``, ``(..., n)``."""

    symmetric = True

    def sandwich(self, Ma: Tensor, Mb: Tensor) -> Tensor:
        """``Maᵀ N Mb`` for ``Ma (..., n, p)``, ``Mb (..., n, q)`` -> ``(..., p, q)``."""
        d1 = self.d1.unsqueeze(-1)
        capped = self.softmax.sandwich(d1 * Ma, d1 * Mb)
        return capped + Ma.transpose(-1, -2) @ (self.e.unsqueeze(-1) * Mb)

    def gram(self, Ma: Tensor, Mb: Tensor) -> list[tuple[Tensor, Tensor]]:
        """``Σ_t Ma_tᵀ N_t Mb_t`` as GEMM operands (:meth:`~hessviz.ops.softmax.ContractedHessian.gram`)."""
        d1 = self.d1.unsqueeze(-1)
        return self.softmax.gram(d1 * Ma, d1 * Mb) + [
            (Ma.flatten(0, 1), (self.e.unsqueeze(-1) * Mb).flatten(0, 1))
        ]

    def dense(self) -> Tensor:
        """``(..., n, n)``."""
        Q = self.softmax.dense()
        return self.d1.unsqueeze(-1) * Q * self.d1.unsqueeze(-2) + torch.diag_embed(self.e)
