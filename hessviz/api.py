"""The public API of ``MODEL.md``: forward, loss, jacobian, gradient, hessian.

Every function validates its arguments first (names, shapes, dtypes, finiteness,
LayerNorm variance, dense size) and raises a ``ValueError`` subclass naming the field;
results are on the device and in the dtype of ``params``.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from hessviz import assembly, losses, memory, reference
from hessviz.block import BlockTrace, trace
from hessviz.config import ATTENTION_PARAMS, BlockConfig
from hessviz.errors import ConfigError
from hessviz.inputs import check_params, check_X, check_Y
from hessviz.matfree.operator import MatrixFreeHessian
from hessviz.memory import check_fits
from hessviz.result import HessianResult

METHODS = ("closed_form", "autograd")
_SIZE_ADVICE = "lower seq_len, d_model, d_k or d_ff, or pass fewer names in wrt"


def _prepare(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor,
             Y: Tensor | None = None) -> tuple[dict[str, Tensor], Tensor, Tensor | None]:
    if not isinstance(cfg, BlockConfig):
        raise ConfigError(f"cfg must be a hessviz.BlockConfig, got {type(cfg).__name__}")
    dtype, device = check_params(cfg, params)
    X = check_X(cfg, X, dtype, device)
    if Y is not None:
        Y = check_Y(cfg, Y, dtype, device)
    return params, X, Y


def _check_wrt(cfg: BlockConfig, wrt: tuple[str, ...] | list[str] | str | None) -> tuple[str, ...]:
    """``wrt`` checked and in θ order: whole names and head slices such as ``"W_Q[1]"``."""
    if wrt is None:
        return cfg.param_names
    names = cfg.sort_names(wrt)
    if not names:
        raise ConfigError(f"wrt must name at least one of {', '.join(cfg.param_names)}")
    return names


def _require_closed_form(cfg: BlockConfig, names: tuple[str, ...] = ()) -> None:
    """Refuse what the closed-form engine does not cover yet (real-layer fields, head slices)."""
    if not cfg.is_paper_block or any("[" in n for n in names):
        raise ConfigError("the closed form covers the papers' block (n_heads = 1, no out_proj, bias, "
                          "ln_affine or causal) and whole weights so far; use method='autograd' "
                          "for this block")


def forward(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """``Z (L, d)``: the block of ``cfg`` applied to ``X (L, d)``."""
    params, X, _ = _prepare(cfg, params, X)
    if not cfg.is_paper_block:     # a forward pass needs no derivatives: stock torch ops
        return reference.torch_forward(cfg, params, X)
    return trace(cfg, params, X).Z


def loss(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor) -> Tensor:
    """The 0-dim loss ``ℓ(Z, Y)``."""
    params, X, Y = _prepare(cfg, params, X, Y)
    return losses.value(cfg.loss, forward(cfg, params, X), Y)


def _dense_jacobian(cfg: BlockConfig, tr: BlockTrace, names: tuple[str, ...]) -> Tensor:
    """``(L*d, P')``: each weight's factored Jacobian, chained to ``Z``, written into its columns."""
    L, d = tr.Z.shape
    out = memory.empty(L * d, sum(cfg.param_size(n) for n in names), dtype=tr.Z.dtype, device=tr.Z.device)
    for n, columns in cfg.offsets(names).items():
        if n in ATTENTION_PARAMS:
            J = tr.attention.jacobian[n].lmul(tr.sa_to_z)       # ∂Z/∂SA · ∂SA/∂W
        else:
            J = tr.ffn.jacobian[n].lmul(tr.post.jac)            # ∂Z/∂R · ∂f/∂W
        J.dense_into(out[:, columns])
    return out


def jacobian(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor,
             wrt: tuple[str, ...] | None = None, *, method: str = "closed_form") -> Tensor:
    """``∂ vec_r(Z)/∂θ``, ``(L*d, P')``, closed form (or ``method="autograd"``)."""
    params, X, _ = _prepare(cfg, params, X)
    names = _check_wrt(cfg, wrt)
    method = _check_method(method)
    P = sum(cfg.param_size(n) for n in names)
    itemsize = X.element_size()
    check_fits(f"the Jacobian ({cfg.seq_len * cfg.d_model} x {P})",
               2 * cfg.seq_len * cfg.d_model * P * itemsize, X.device, _SIZE_ADVICE)
    if method == "autograd":
        return reference.model_jacobian(cfg, params, X, names)
    _require_closed_form(cfg, names)
    return _dense_jacobian(cfg, trace(cfg, params, X), names)


def gradient(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor,
             wrt: tuple[str, ...] | None = None, *, method: str = "closed_form") -> dict[str, Tensor]:
    """``∂ℓ/∂W`` for each name, ``name -> (rows, cols)``, closed form (or autograd)."""
    params, X, Y = _prepare(cfg, params, X, Y)
    names = _check_wrt(cfg, wrt)
    if _check_method(method) == "autograd":
        flat = reference.gradient(cfg, params, X, Y, names)
        return {n: flat[sl].reshape(cfg.shape_of(n)) for n, sl in cfg.offsets(names).items()}
    _require_closed_form(cfg, names)
    tr = trace(cfg, params, X)
    g_R = tr.post.vjp(losses.gradient(cfg.loss, tr.Z, Y))     # reverse mode, gradients only
    grads = tr.attention.weight_gradients(tr.sa_to_r.vjp(g_R))
    if tr.ffn is not None:
        grads |= tr.ffn.weight_gradients(g_R)
    return {n: grads[n] for n in names}


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    return method


def hessian_bytes(cfg: BlockConfig, names: tuple[str, ...], itemsize: int, method: str) -> int:
    """Estimated peak bytes to compute one ``(P', P')`` term."""
    sizes = [cfg.param_size(n) for n in names]
    P = sum(sizes)
    L, d = cfg.seq_len, cfg.d_model
    largest_block = max(sizes) ** 2
    working = 8 * L * (L + d) * (d + cfg.d_ff + cfg.d_k)      # per-token factors
    if method == "autograd":                                   # vmapped tangents of every activation
        working += 6 * P * L * (L + 3 * d + 2 * cfg.d_ff + cfg.d_k)
    return (P * P + largest_block + working) * itemsize


def hessian(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor,
            wrt: tuple[str, ...] | None = None, *, method: str = "closed_form") -> HessianResult:
    """The Hessian of the loss in the weights ``wrt`` (all by default, in cfg order).

    Returns a :class:`~hessviz.hessian.HessianResult` whose ``full``, ``outer`` and
    ``functional`` terms are computed when first read.
    """
    params, X, Y = _prepare(cfg, params, X, Y)
    names = _check_wrt(cfg, wrt)
    method = _check_method(method)
    P = sum(cfg.param_size(n) for n in names)
    products = MatrixFreeHessian(cfg, params, X, Y, names, method)

    def dense_guard() -> None:                                 # only when a dense term is read
        check_fits(f"a dense Hessian term ({P} x {P}, {method})",
                   hessian_bytes(cfg, names, X.element_size(), method), X.device, _SIZE_ADVICE)

    if method == "autograd":
        def reference_term(term: str) -> Tensor:
            dense_guard()
            if term == "full":
                return reference.full_hessian(cfg, params, X, Y, names)
            if term == "outer":
                return reference.outer_hessian(cfg, params, X, Y, names)
            return result.full - result.outer                 # each computed once, then cached
        result = HessianResult(cfg, names, reference_term, method=method,
                               order=("full", "outer", "functional"), products=products)
        return result

    _ = products.tape                                          # forward pass: validates LayerNorm rows

    @functools.cache
    def dense_engine() -> assembly.Curvature:
        _require_closed_form(cfg, names)
        return assembly.backward(cfg, trace(cfg, params, X), Y)

    def compute_term(term: str) -> Tensor:
        dense_guard()
        return assembly.assemble(cfg, names, assembly.contributions(dense_engine(), names, term), X)

    def compute_block(a: str, b: str, term: str) -> Tensor:
        cur = dense_engine()
        lo, hi = sorted((a, b), key=cfg.param_names.index)
        pieces = assembly.contributions(cur, (lo, hi) if lo != hi else (lo,), term)
        block = torch.empty(cfg.param_size(lo), cfg.param_size(hi), dtype=X.dtype, device=X.device)
        assembly.write_block(block, [c for c in pieces if (c.a, c.b) == (lo, hi)])
        return block if (lo, hi) == (a, b) else block.T

    return HessianResult(cfg, names, compute_term, compute_block, method=method, products=products)
