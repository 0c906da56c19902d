"""The autograd ground truth: a plain torch forward differentiated by ``torch.func``.

Nothing here is used by the closed form; it exists to check it and to time it.
The forward is written with stock torch ops (``torch.softmax``, ``F.layer_norm``,
``F.gelu``), independently of :mod:`hessviz.ops`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from hessviz.block.config import BlockConfig, layer_name, parse_name
from hessviz.losses import CustomLoss, Loss, block_loss
from hessviz.ops.layernorm import refuse_undefined


def torch_forward(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, *, check: bool = True) -> Tensor:
    """``Z (L, d)`` from stock torch ops, for every block of ``MODEL.md`` (parts 1 to 3, and part 5's
    ``peri``, ``attn_scale``, ``window``, ``softcap``); a stack applies its blocks in layer order, each
    with its own weights and its own config (:meth:`~hessviz.block.config.BlockConfig.layer`).

    With ``ln_eps = 0`` a norm whose input row is constant (RMSNorm: zero), such as a Peri-LN output
    norm after a ReLU sublayer that is zero in a row, divides by ``σ = 0``: ``check`` raises
    :class:`~hessviz.errors.InputError` naming the norm (``l1.ln2_out``) and the rows instead of a NaN.
    The check reads values, so a caller inside a ``torch.func`` transform passes ``check=False``
    (having checked the point eagerly, as :func:`loss_of_theta` and :func:`model_jacobian` do)."""
    if not cfg.is_stack:
        return _block_forward(cfg, params, X, "" if check else None)
    for layer in range(cfg.n_layers):
        weights = {n: params[layer_name(layer, n)] for n in cfg.block.param_names}
        X = _block_forward(cfg.layer(layer), weights, X, layer_name(layer, "") if check else None)
    return X


def torch_norm(
    z: Tensor,
    norm_type: str,
    eps: float,
    gamma: Tensor | None = None,
    beta: Tensor | None = None,
    where: str | None = None,
) -> Tensor:
    """The reference LayerNorm (``norm_type="layernorm"``) or RMSNorm (``"rmsnorm"``) of ``z (…, d)``
    over its last axis, then ``· γ + β`` where given. With ``where`` (the norm's name) and ``eps = 0``, a
    row where ``σ = 0`` raises :class:`~hessviz.errors.InputError` naming ``where`` and the rows."""
    if where is not None and eps == 0:
        rms = norm_type == "rmsnorm"
        var = (z * z).mean(-1, keepdim=True) if rms else z.var(-1, correction=0, keepdim=True)
        refuse_undefined(var.detach(), f"{where} input", centre=not rms)
    # γ and β applied by hand: torch.func.hessian (forward over reverse) through
    # F.layer_norm(weight=γ) gives a wrong, asymmetric γ Hessian in torch 2.13
    # (reverse over reverse agrees with this form); tests/test_block_real_layers.py checks it
    if norm_type == "rmsnorm":
        out = z * torch.rsqrt((z * z).mean(-1, keepdim=True) + eps)
    else:
        out = F.layer_norm(z, (z.shape[-1],), eps=eps)
    out = out if gamma is None else out * gamma
    return out if beta is None else out + beta


def _block_forward(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, prefix: str | None) -> Tensor:
    """One block; ``prefix`` (``""``, ``"l1."``) names its norms in the refusal of a row with ``σ = 0``,
    ``None`` checks nothing (inside a ``torch.func`` transform)."""
    eps, L = cfg.ln_eps, X.shape[0]
    H, dk, dv = cfg.n_heads, cfg.d_k, cfg.value_width
    p = params.get

    def ln(z: Tensor, which: str) -> Tensor:
        where = None if prefix is None else prefix + which
        return torch_norm(z, cfg.norm_type, eps, p(f"{which}_gamma"), p(f"{which}_beta"), where)

    def linear(x: Tensor, w: str, b: str) -> Tensor:
        out = x @ params[w]
        return out if p(b) is None else out + params[b]

    def heads(x: Tensor, width: int) -> Tensor:  # (L, H*width) -> (H, L, width)
        return x.reshape(L, H, width).transpose(0, 1)

    def heads_kv(x: Tensor, width: int) -> Tensor:  # (L, G*width) -> (H, L, width)
        G = cfg.kv_heads
        return x.reshape(L, G, width).transpose(0, 1).repeat_interleave(H // G, dim=0)

    def rms(u: Tensor, gamma: str) -> Tensor:  # qk_norm, over each head's row
        return u / torch.sqrt((u * u).mean(-1, keepdim=True) + eps) * params[gamma]

    def rotate(u: Tensor) -> Tensor:  # Hugging Face's rotate_half layout
        r = cfg.rotary_width
        omega = cfg.rope_theta ** (-torch.arange(0, r, 2, dtype=torch.float64, device=X.device) / r)
        angle = torch.arange(L, dtype=torch.float64, device=X.device)[:, None] * omega
        cos, sin = torch.cat([angle.cos()] * 2, -1).to(u.dtype), torch.cat([angle.sin()] * 2, -1).to(u.dtype)
        a, rest = u[..., :r], u[..., r:]
        half = torch.cat([-a[..., r // 2 :], a[..., : r // 2]], -1)
        return torch.cat([a * cos + half * sin, rest], -1)

    def sa(x: Tensor) -> Tensor:
        q, k = heads(linear(x, "W_Q", "b_Q"), dk), heads_kv(linear(x, "W_K", "b_K"), dk)
        v = heads_kv(linear(x, "W_V", "b_V"), dv)
        if cfg.qk_norm:
            q, k = rms(q, "q_norm_gamma"), rms(k, "k_norm_gamma")
        if cfg.rope:
            q, k = rotate(q), rotate(k)
        scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(dk) if cfg.attn_scale is None else cfg.attn_scale)
        if cfg.softcap is not None:
            scores = cfg.softcap * torch.tanh(scores / cfg.softcap)
        if cfg.causal:
            future = torch.ones(L, L, dtype=torch.bool, device=X.device).triu(1)
            if cfg.window is not None:  # t − window < s ≤ t
                future |= torch.ones(L, L, dtype=torch.bool, device=X.device).tril(-cfg.window)
            scores = scores.masked_fill(future, float("-inf"))
        out = (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(L, H * dv)
        return linear(out, "W_O", "b_O") if cfg.out_proj else out

    def ffn(z: Tensor) -> Tensor:
        act = {
            "relu": torch.relu,
            "gelu": F.gelu,
            "gelu_tanh": lambda u: F.gelu(u, approximate="tanh"),
            "silu": F.silu,
        }[cfg.activation]
        if cfg.mlp == "gated":
            return linear(act(linear(z, "W_G", "b_G")) * linear(z, "W_1", "b_1"), "W_2", "b_2")
        return linear(act(linear(z, "W_1", "b_1")), "W_2", "b_2")

    if cfg.norm == "attention":
        return sa(X)
    if cfg.norm == "post":
        z1 = ln(X + sa(X), "ln1")
        return ln(z1 + ffn(z1), "ln2")
    if cfg.norm == "parallel":
        return X + sa(ln(X, "ln1")) + ffn(ln(X, "ln2"))
    if cfg.norm == "pre":
        z1 = X + sa(ln(X, "ln1"))
        return z1 + ffn(ln(z1, "ln2"))
    if cfg.norm == "peri":
        z1 = X + ln(sa(ln(X, "ln1")), "ln1_out")
        return z1 + ln(ffn(ln(z1, "ln2")), "ln2_out")
    z1 = X + sa(X)
    return z1 + ffn(z1)


def torch_loss(cfg: BlockConfig, Z: Tensor, Y: Tensor | Loss) -> Tensor:
    """``ℓ(Z)`` in torch's own functions (``F.mse_loss``, ``F.cross_entropy``; a custom loss: its
    second-order model at the point), for autograd to differentiate."""
    return block_loss(cfg.loss, Y).reference_value(Z)


def _materialize(Y: Tensor | Loss) -> None:
    """Form a custom loss's dense curvature now, outside any ``torch.func`` transform."""
    if isinstance(Y, CustomLoss):
        Y.dense_hessian()


def _unflatten(
    cfg: BlockConfig, names: tuple[str, ...], theta: Tensor, params: dict[str, Tensor]
) -> dict[str, Tensor]:
    """``params`` with the entries of ``names`` (whole weights or head slices) taken from ``θ'``."""
    out = dict(params)
    for n, sl in cfg.offsets(names).items():
        base = parse_name(n).base
        flat = out[base].reshape(-1).index_copy(0, cfg.head_indices(n).to(theta.device), theta[sl])
        out[base] = flat.reshape(cfg.param_shapes[base])
    return out


def flatten(cfg: BlockConfig, params: dict[str, Tensor], names: tuple[str, ...]) -> Tensor:
    """``θ'``: the entries of ``names`` (whole weights or head slices) in order."""
    pieces = []
    for n in names:
        whole = params[parse_name(n).base].reshape(-1)
        pieces.append(whole[cfg.head_indices(n).to(whole.device)])
    return torch.cat(pieces)


def loss_of_theta(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor | Loss, names: tuple[str, ...]
) -> Callable[[Tensor], Tensor]:
    """``θ' ↦ ℓ``: the loss as a function of the flattened weights ``names`` (others fixed)."""
    _materialize(Y)
    torch_forward(cfg, params, X)  # refuses a norm row with σ = 0 now, outside the transforms

    def f(theta: Tensor) -> Tensor:
        return torch_loss(cfg, torch_forward(cfg, _unflatten(cfg, names, theta, params), X, check=False), Y)

    return f


def model_jacobian(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, names: tuple[str, ...]) -> Tensor:
    """``∂ vec_r(Z)/∂θ``, ``(L*d, P')``, by ``torch.func.jacrev``."""

    torch_forward(cfg, params, X)  # refuses a norm row with σ = 0 now, outside the transforms

    def f(theta: Tensor) -> Tensor:
        return torch_forward(cfg, _unflatten(cfg, names, theta, params), X, check=False).reshape(-1)

    return torch.func.jacrev(f)(flatten(cfg, params, names))


def full_hessian(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor | Loss, names: tuple[str, ...]
) -> Tensor:
    """``∇²_θ ℓ`` by ``torch.func.hessian`` (forward-over-reverse)."""
    return torch.func.hessian(loss_of_theta(cfg, params, X, Y, names))(flatten(cfg, params, names))


def full_hessian_rr(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor, names: tuple[str, ...]
) -> Tensor:
    """``∇²_θ ℓ`` by ``torch.func.jacrev`` of ``torch.func.grad`` (reverse over reverse): the reference
    that stays right through ``F.layer_norm`` with a weight, where forward over reverse does not."""
    grad = torch.func.grad(loss_of_theta(cfg, params, X, Y, names))
    return torch.func.jacrev(grad)(flatten(cfg, params, names))


def outer_hessian(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor | Loss, names: tuple[str, ...]
) -> Tensor:
    """``Jᵀ (∇²_Z ℓ) J`` with both factors from autograd."""
    _materialize(Y)
    J = model_jacobian(cfg, params, X, names)
    Z = torch_forward(cfg, params, X)
    H_Z = torch.func.hessian(lambda z: torch_loss(cfg, z.reshape(Z.shape), Y))(Z.reshape(-1))
    return J.T @ H_Z @ J


def gradient(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor, names: tuple[str, ...]
) -> Tensor:
    """``∇_θ ℓ`` by ``torch.func.grad``."""
    return torch.func.grad(loss_of_theta(cfg, params, X, Y, names))(flatten(cfg, params, names))
