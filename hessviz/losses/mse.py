r"""The mean squared error of a block's output against a target: :class:`MSE`.

For ``Z, Y (L, d)``:

.. math::
    ℓ = ‖Z − Y‖_F^2 / (L d),\qquad ∇_Z ℓ = 2 (Z − Y) / (L d),\qquad
    N_t = ∇^2_{Z_t} ℓ = 2 I_d / (L d),\qquad N Ż = 2 Ż / (L d).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch.nn.functional as F
from torch import Tensor

from hessviz.losses.base import TargetLoss
from hessviz.ops.base import eye


@dataclass(frozen=True, eq=False)
class MSE(TargetLoss):
    """``‖Z − Y‖²_F / (L·d)`` against the target ``Y (L, d)`` (``MSE(Y)``); :meth:`at` places it at ``Z``."""

    @cached_property
    def value(self) -> Tensor:
        Z = self.point
        L, d = Z.shape
        return ((Z - self.target) ** 2).sum() / (L * d)

    @cached_property
    def grad(self) -> Tensor:
        Z = self.point
        L, d = Z.shape
        return 2.0 * (Z - self.target) / (L * d)

    def token_curvature(self) -> Tensor:
        """``(L, d, d)``: ``2 I / (L d)`` for every token (a read-only expanded identity)."""
        Z = self.point
        L, d = Z.shape
        return (2.0 / (L * d)) * eye(d, Z, L)

    def product(self, dZ: Tensor) -> Tensor:
        L, d = self.point.shape
        return dZ * (2.0 / (L * d))

    def reference_value(self, Z: Tensor) -> Tensor:
        """``F.mse_loss(Z, Y)``: torch's own, for the autograd reference."""
        return F.mse_loss(Z, self.target, reduction="mean")
