r"""The losses in ``Z (L, d)``: value, gradient, and Hessian per token.

* ``mse``: ``ℓ = ‖Z − Y‖²_F / (L d)``; ``∇ = 2 (Z − Y) / (L d)``; ``∇²_{Z_t} = 2 I / (L d)``.
* ``ce``:  ``ℓ = (1/L) Σ_t −log softmax(Z_t)[y_t]``; ``∇_{Z_t} = (p_t − e_{y_t}) / L``;
  ``∇²_{Z_t} = (diag(p_t) − p_t p_tᵀ) / L`` with ``p_t = softmax(Z_t)``.

Both losses are sums over tokens, so the Hessian in ``Z`` is block diagonal: one
``(d, d)`` block per token, returned as ``(L, d, d)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hessviz.components import softmax
from hessviz.components.base import eye


def value(kind: str, Z: Tensor, Y: Tensor) -> Tensor:
    L, d = Z.shape
    if kind == "mse":
        return ((Z - Y) ** 2).sum() / (L * d)
    logp = torch.log_softmax(Z, dim=-1)
    return -logp.gather(1, Y[:, None]).sum() / L


def gradient(kind: str, Z: Tensor, Y: Tensor) -> Tensor:
    """``(L, d)``."""
    L, d = Z.shape
    if kind == "mse":
        return 2.0 * (Z - Y) / (L * d)
    p = softmax.value(Z)
    return (p - torch.nn.functional.one_hot(Y, d).to(Z.dtype)) / L


def hessian(kind: str, Z: Tensor, Y: Tensor) -> Tensor:
    """``(L, d, d)``: the Hessian of the loss in each token's ``Z_t``."""
    L, d = Z.shape
    if kind == "mse":
        return (2.0 / (L * d)) * eye(d, Z, L)
    return softmax.jacobian(softmax.value(Z)) / L
