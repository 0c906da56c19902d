r"""The mean cross-entropy of a block's output read as logits: :class:`CrossEntropy`.

For ``Z (L, d)``, classes ``y (L,)`` in ``[0, d)`` and ``p_t = softmax(Z_t)``:

.. math::
    ℓ = \tfrac1L \textstyle\sum_t −\log p_{t, y_t},\qquad ∇_{Z_t} ℓ = (p_t − e_{y_t}) / L,

    N_t = ∇^2_{Z_t} ℓ = (\mathrm{diag}\,p_t − p_t p_t^⊤) / L,\qquad
    (N Ż)_t = (p_t ⊙ Ż_t − p_t\,(p_t^⊤ Ż_t)) / L.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import Tensor

from hessviz.losses.base import TargetLoss
from hessviz.ops import softmax


@dataclass(frozen=True, eq=False)
class CrossEntropy(TargetLoss):
    """``(1/L) Σ_t −log softmax(Z_t)[y_t]`` against the classes ``y (L,)`` (int64, ``CrossEntropy(y)``);
    :meth:`at` places it at ``Z``."""

    @cached_property
    def value(self) -> Tensor:
        Z = self.point
        logp = torch.log_softmax(Z, dim=-1)
        return -logp.gather(1, self.target[:, None]).sum() / Z.shape[0]

    @cached_property
    def grad(self) -> Tensor:
        Z = self.point
        L, d = Z.shape
        return (softmax.value(Z) - F.one_hot(self.target, d).to(Z.dtype)) / L

    def token_curvature(self) -> Tensor:
        """``(L, d, d)``: ``(diag p_t − p_t p_tᵀ) / L``."""
        Z = self.point
        return softmax.jacobian(softmax.value(Z)) / Z.shape[0]

    @cached_property
    def _p(self) -> Tensor:
        return self.point.softmax(-1)

    def product(self, dZ: Tensor) -> Tensor:
        p, L = self._p, self.point.shape[0]
        return (p * dZ - p * (p * dZ).sum(-1, keepdim=True)) / L

    def reference_value(self, Z: Tensor) -> Tensor:
        """``F.cross_entropy(Z, y)``: torch's own, for the autograd reference."""
        return F.cross_entropy(Z, self.target, reduction="mean")
