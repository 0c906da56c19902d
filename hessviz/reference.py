"""The autograd ground truth: a plain torch forward differentiated by ``torch.func``.

Nothing here is used by the closed form; it exists to check it and to time it.
The forward is written with stock torch ops (``torch.softmax``, ``F.layer_norm``,
``F.gelu``), independently of :mod:`hessviz.components`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from hessviz.config import BlockConfig


def torch_forward(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """``Z (L, d)`` from stock torch ops."""
    eps, d = cfg.ln_eps, cfg.d_model

    def ln(z: Tensor) -> Tensor:
        return F.layer_norm(z, (d,), eps=eps)

    def sa(x: Tensor) -> Tensor:
        scores = (x @ params["W_Q"]) @ (x @ params["W_K"]).T / math.sqrt(cfg.d_k)
        return torch.softmax(scores, dim=-1) @ x @ params["W_V"]

    def ffn(z: Tensor) -> Tensor:
        act = torch.relu if cfg.activation == "relu" else F.gelu
        return act(z @ params["W_1"]) @ params["W_2"]

    if cfg.norm == "attention":
        return sa(X)
    if cfg.norm == "post":
        z1 = ln(X + sa(X))
        return ln(z1 + ffn(z1))
    if cfg.norm == "pre":
        z1 = X + sa(ln(X))
        return z1 + ffn(ln(z1))
    z1 = X + sa(X)
    return z1 + ffn(z1)


def torch_loss(cfg: BlockConfig, Z: Tensor, Y: Tensor) -> Tensor:
    if cfg.loss == "mse":
        return F.mse_loss(Z, Y, reduction="mean")
    return F.cross_entropy(Z, Y, reduction="mean")


def _unflatten(cfg: BlockConfig, names: tuple[str, ...], theta: Tensor,
               params: dict[str, Tensor]) -> dict[str, Tensor]:
    out = dict(params)
    for n, sl in cfg.offsets(names).items():
        out[n] = theta[sl].reshape(cfg.param_shapes[n])
    return out


def flatten(params: dict[str, Tensor], names: tuple[str, ...]) -> Tensor:
    return torch.cat([params[n].reshape(-1) for n in names])


def loss_of_theta(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor,
                  names: tuple[str, ...]) -> Callable[[Tensor], Tensor]:
    """``θ' ↦ ℓ``: the loss as a function of the flattened weights ``names`` (others fixed)."""
    def f(theta: Tensor) -> Tensor:
        return torch_loss(cfg, torch_forward(cfg, _unflatten(cfg, names, theta, params), X), Y)
    return f


def model_jacobian(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor,
                   names: tuple[str, ...]) -> Tensor:
    """``∂ vec_r(Z)/∂θ``, ``(L*d, P')``, by ``torch.func.jacrev``."""
    def f(theta: Tensor) -> Tensor:
        return torch_forward(cfg, _unflatten(cfg, names, theta, params), X).reshape(-1)
    return torch.func.jacrev(f)(flatten(params, names))


def full_hessian(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor,
                 names: tuple[str, ...]) -> Tensor:
    """``∇²_θ ℓ`` by ``torch.func.hessian`` (forward-over-reverse)."""
    return torch.func.hessian(loss_of_theta(cfg, params, X, Y, names))(flatten(params, names))


def outer_hessian(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor,
                  names: tuple[str, ...]) -> Tensor:
    """``Jᵀ (∇²_Z ℓ) J`` with both factors from autograd."""
    J = model_jacobian(cfg, params, X, names)
    Z = torch_forward(cfg, params, X)
    H_Z = torch.func.hessian(lambda z: torch_loss(cfg, z.reshape(Z.shape), Y))(Z.reshape(-1))
    return J.T @ H_Z @ J


def gradient(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor,
             names: tuple[str, ...]) -> Tensor:
    """``∇_θ ℓ`` by ``torch.func.grad``."""
    return torch.func.grad(loss_of_theta(cfg, params, X, Y, names))(flatten(params, names))
