r"""What every loss in hessviz offers: :class:`Loss`.

A loss ``ℓ(Z)`` of an output ``Z (L, d)`` (a block's, or a whole model's last hidden states) enters
the Hessian in the weights through two things only, its gradient and its curvature at ``Z``:

.. math::
    H = J^⊤ N J + \textstyle\sum_i g_i ∇^2_θ Z_i,\qquad g = ∇_Z ℓ\ (L, d),\qquad N = ∇^2_Z ℓ,

``N`` the Gauss–Newton middle factor, an ``(L·d × L·d)`` matrix in ``vec_r`` order of ``Z`` (row
``t·d + j`` is feature ``j`` of token ``t``). A loss that is a sum over tokens has a block-diagonal
``N = blockdiag(N_1 … N_L)``, one ``(d, d)`` block per token: it is *token-wise*.

A loss is either defined by what it is measured against (``MSE(Y)``, ``CrossEntropy(y)``,
``Classifier(W, b, labels)``) and placed at a point by :meth:`Loss.at`, or built at its point
(``NextToken(Z, ids, head)``, ``CustomLoss(grad_Z, hess_Z)``). At a point it answers:

=========================  =====================================================================
``value``                  ``ℓ(Z)``, 0-dim
``grad``                   ``g = ∇_Z ℓ``, ``(L, d)``
``token_wise``             whether ``N`` is block diagonal over tokens
``token_curvature()``      ``(N_1 … N_L)``, ``(L, d, d)`` (token-wise losses only)
``product(dZ)``            ``N Ż`` for ``Ż (k, L, d)``, ``(k, L, d)``, without forming ``N``
``dense_hessian()``        ``N``, ``(L·d, L·d)``
``reference_value(Z')``    ``ℓ(Z')`` in torch's own functions, what the autograd reference differentiates
=========================  =====================================================================

A model's own objective (``NextToken()``, ``Classifier(…)``, ``Cosine(e)``) is a loss with a little
more, :class:`hessviz.losses.objective.ModelObjective`: placed at one text, handed over as a
:class:`~hessviz.losses.CustomLoss`. A name (``"next_token"``) becomes one of these objects in one
place, :mod:`hessviz.losses.names`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from hessviz.errors import InputError


class Loss(ABC):
    """A loss of an output ``Z (L, d)``: value, gradient, token curvature and its product at a point.

    Subclasses give ``value`` and ``grad`` (attributes or properties), :attr:`token_wise`,
    :meth:`at`, :meth:`token_curvature` and :meth:`product`; :meth:`dense_hessian` and
    :meth:`reference_value` follow from them unless a subclass knows better.
    """

    value: Tensor
    """``ℓ(Z)`` at the point, 0-dim."""
    grad: Tensor
    """``∇_Z ℓ`` at the point, ``(L, d)``."""
    read_tokens: Tensor | None = None
    """The tokens outside which ``g`` and ``N`` are exactly zero, when known and not all (``None``:
    every token is read). :class:`~hessviz.losses.custom.CustomLoss` knows its own."""

    @property
    def token_wise(self) -> bool:
        """Whether ``N`` is block diagonal over tokens (the loss is a sum of per-token terms)."""
        return True

    @abstractmethod
    def at(self, Z: Tensor) -> Loss:
        """This loss at the point ``Z (L, d)``. A loss built at its point returns itself."""

    @abstractmethod
    def token_curvature(self) -> Tensor:
        """``(L, d, d)``: the blocks ``N_t = ∇²_{Z_t} ℓ``; an error when :attr:`token_wise` is false."""

    @abstractmethod
    def product(self, dZ: Tensor) -> Tensor:
        """``N Ż``: ``(k, L, d) -> (k, L, d)``."""

    def dense_hessian(self) -> Tensor:
        """``N (L·d, L·d)``: the token blocks on the diagonal, or read from :meth:`product` column by
        column (``L·d`` products) when the loss couples tokens."""
        if self.token_wise:
            return torch.block_diag(*self.token_curvature())
        g = self.grad
        n = g.numel()
        eye = torch.eye(n, dtype=g.dtype, device=g.device)
        return self.product(eye.reshape(n, *g.shape)).reshape(n, n)

    def reference_value(self, Z: Tensor) -> Tensor:
        """``ℓ(Z')`` at another point ``Z'``, for the autograd reference to differentiate."""
        return self.at(Z).value


@dataclass(frozen=True, eq=False)
class TargetLoss(Loss):
    """A loss measured against a ``target`` (``MSE``'s ``Y``, ``CrossEntropy``'s classes): defined
    before its point, placed at ``Z`` by :meth:`at`."""

    target: Tensor
    Z: Tensor | None = field(default=None, repr=False)

    def at(self, Z: Tensor) -> TargetLoss:
        return replace(self, Z=Z)

    @property
    def point(self) -> Tensor:
        """``Z (L, d)``; an error before :meth:`at`."""
        if self.Z is None:
            raise unplaced(self, "value")
        return self.Z


def unplaced(loss: Loss, what: str) -> InputError:
    """The error of asking a loss that has no point yet for ``what``."""
    return InputError(f"{type(loss).__name__} has no point yet: its {what} is taken at Z, use .at(Z)")


def check_Z(Z: Tensor) -> Tensor:
    """``Z``, when it is a floating ``(L, d)`` tensor with ``L ≥ 1``; else an :class:`InputError`."""
    if not isinstance(Z, Tensor) or Z.dim() != 2 or Z.shape[0] < 1 or not Z.is_floating_point():
        raise InputError(f"Z must be a floating (L, d) tensor, got {getattr(Z, 'shape', type(Z).__name__)}")
    return Z
