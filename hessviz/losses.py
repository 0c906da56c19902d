r"""The losses in ``Z (L, d)``: value, gradient, and Hessian per token.

* ``mse``: ``ℓ = ‖Z − Y‖²_F / (L d)``; ``∇ = 2 (Z − Y) / (L d)``; ``∇²_{Z_t} = 2 I / (L d)``.
* ``ce``:  ``ℓ = (1/L) Σ_t −log softmax(Z_t)[y_t]``; ``∇_{Z_t} = (p_t − e_{y_t}) / L``;
  ``∇²_{Z_t} = (diag(p_t) − p_t p_tᵀ) / L`` with ``p_t = softmax(Z_t)``.

Both losses are sums over tokens, so the Hessian in ``Z`` is block diagonal: one
``(d, d)`` block per token, returned as ``(L, d, d)``.

Where a target ``Y`` is taken, a :class:`~hessviz.custom_loss.CustomLoss` may stand in its
place (the API puts it there): its own gradient and curvature are used, whatever ``kind``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hessviz.custom_loss import CustomLoss
from hessviz.ops import softmax
from hessviz.ops.base import eye


def value(kind: str, Z: Tensor, Y: Tensor | CustomLoss) -> Tensor:
    if isinstance(Y, CustomLoss):
        return Y.model(Z)
    L, d = Z.shape
    if kind == "mse":
        return ((Z - Y) ** 2).sum() / (L * d)
    logp = torch.log_softmax(Z, dim=-1)
    return -logp.gather(1, Y[:, None]).sum() / L


def gradient(kind: str, Z: Tensor, Y: Tensor | CustomLoss) -> Tensor:
    """``(L, d)``."""
    if isinstance(Y, CustomLoss):
        return Y.grad_Z
    L, d = Z.shape
    if kind == "mse":
        return 2.0 * (Z - Y) / (L * d)
    p = softmax.value(Z)
    return (p - torch.nn.functional.one_hot(Y, d).to(Z.dtype)) / L


def hessian(kind: str, Z: Tensor, Y: Tensor | CustomLoss) -> Tensor:
    """``(L, d, d)``: the Hessian of the loss in each token's ``Z_t`` (a custom loss: token-wise only)."""
    if isinstance(Y, CustomLoss):
        if Y.token_hessian() is None:
            raise ValueError("the curvature of this custom loss couples tokens: it has no (L, d, d) form")
        return Y.token_hessian()
    L, d = Z.shape
    if kind == "mse":
        return (2.0 / (L * d)) * eye(d, Z, L)
    return softmax.jacobian(softmax.value(Z)) / L


def token_wise(Y: Tensor | CustomLoss) -> bool:
    """Whether the curvature in ``Z`` is block diagonal over tokens (the built-in losses, or a
    custom loss given as ``(L, d, d)``)."""
    return not isinstance(Y, CustomLoss) or Y.kind == "token"


def hvp(kind: str, Z: Tensor, Y: Tensor | CustomLoss):
    """``Ż (k, L, d) ↦ ∇²_Z ℓ · Ż``: ``2Ż/(Ld)`` (mse), ``(p⊙Ż − p (pᵀŻ))/L`` per token (ce),
    or the custom loss's own product."""
    if isinstance(Y, CustomLoss):
        return Y.hvp
    L, d = Z.shape
    if kind == "mse":
        return lambda dZ: dZ * (2.0 / (L * d))
    p = Z.softmax(-1)
    return lambda dZ: (p * dZ - p * (p * dZ).sum(-1, keepdim=True)) / L
