"""The public API of ``MODEL.md``: forward, loss, jacobian, gradient, hessian.

Every function validates its arguments first (names, shapes, dtypes, finiteness,
LayerNorm variance, dense size) and raises a ``ValueError`` subclass naming the field;
results are on the device and in the dtype of ``params``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hessviz import reference
from hessviz.block.config import BlockConfig
from hessviz.block.inputs import check_params, check_X, check_Y
from hessviz.block.weights import units
from hessviz.dense import assembly
from hessviz.dense.autograd import AutogradHessian
from hessviz.dense.engine import SIZE_ADVICE, DenseEngine
from hessviz.dense.record import fold, record
from hessviz.dense.stack import StackHessian
from hessviz.errors import ConfigError, InputError
from hessviz.losses import CustomLoss, Loss, block_loss
from hessviz.products.autograd import AutogradOperator
from hessviz.products.block import build, forward_nodes
from hessviz.products.hessian_operator import ProductsOperator
from hessviz.products.layout import Layout
from hessviz.products.operator import MatrixFreeHessian, TapeOperator
from hessviz.products.tape import Tape
from hessviz.result import HessianResult
from hessviz.runtime import pages
from hessviz.runtime.memory import check_fits


def _prepare(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor | None = None
) -> tuple[dict[str, Tensor], Tensor, Tensor | None]:
    if not isinstance(cfg, BlockConfig):
        raise ConfigError(f"cfg must be a hessviz.BlockConfig, got {type(cfg).__name__}")
    dtype, device = check_params(cfg, params)
    X = check_X(cfg, X, dtype, device)
    if Y is not None:
        Y = check_Y(cfg, Y, dtype, device)
    return params, X, Y


def _prepare_target(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor | None, loss: CustomLoss | None
) -> tuple[dict[str, Tensor], Tensor, Loss]:
    """``(params, X, loss)``: ``cfg.loss`` against the target ``Y`` (:func:`~hessviz.losses.block_loss`),
    or the custom ``loss`` checked and bound to ``Z``."""
    if loss is None:
        if Y is None:
            raise InputError(
                f"Y is required: the target of loss={cfg.loss!r} (or pass "
                "loss=hv.CustomLoss(grad_Z, hess_Z) instead)"
            )
        params, X, Y = _prepare(cfg, params, X, Y)
        return params, X, block_loss(cfg.loss, Y)
    if Y is not None:
        raise InputError("give either Y (the target of cfg.loss) or loss=hv.CustomLoss(...), not both")
    if not isinstance(loss, CustomLoss):
        raise InputError(f"loss must be a hessviz.CustomLoss(grad_Z, hess_Z), got {type(loss).__name__}")
    params, X, _ = _prepare(cfg, params, X)
    Z = _output(cfg, params, X)
    return params, X, loss.checked(cfg.seq_len, cfg.d_model, X.dtype, X.device, Z)


def _check_wrt(cfg: BlockConfig, wrt: tuple[str, ...] | list[str] | str | None) -> tuple[str, ...]:
    """``wrt`` checked and in θ order: whole names and head slices such as ``"W_Q[1]"``."""
    if wrt is None:
        return cfg.param_names
    names = cfg.sort_names(wrt)
    if not names:
        raise ConfigError(f"wrt must name at least one of {', '.join(cfg.param_names)}")
    return names


def _output(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """``Z``: the block, or the blocks of a stack in layer order, each with its own weights."""
    values, Z, _ = forward_nodes(cfg, params, X)
    return values[Z]


def forward(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """``Z (L, d)``: the block of ``cfg`` (or its stack of ``n_layers`` blocks) applied to ``X (L, d)``."""
    params, X, _ = _prepare(cfg, params, X)
    return _output(cfg, params, X)


def loss(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor) -> Tensor:
    """The 0-dim loss ``ℓ(Z, Y)``."""
    params, X, Y = _prepare(cfg, params, X, Y)
    return block_loss(cfg.loss, Y).at(_output(cfg, params, X)).value


def jacobian(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    wrt: tuple[str, ...] | None = None,
    *,
    method: str = "closed_form",
) -> Tensor:
    """``∂ vec_r(Z)/∂θ``, ``(L*d, P')``, closed form (or ``method="autograd"``)."""
    params, X, _ = _prepare(cfg, params, X)
    names = _check_wrt(cfg, wrt)
    method = _check_method(method)
    P = sum(cfg.param_size(n) for n in names)
    itemsize = X.element_size()
    check_fits(
        f"the Jacobian ({cfg.seq_len * cfg.d_model} x {P})",
        2 * cfg.seq_len * cfg.d_model * P * itemsize,
        X.device,
        SIZE_ADVICE,
    )
    return METHODS[method].jacobian(cfg, params, X, names)


def _closed_form_jacobian(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, names: tuple[str, ...]
) -> Tensor:
    """The closed-form Jacobian: a stack's tape swept along the unit vectors, a block's dense fold."""
    if cfg.is_stack:
        return _tape_jacobian(cfg, build(cfg, params, X, None), names)
    return assembly.dense_jacobian(cfg, record(cfg, params, X), names)


def _tape_jacobian(cfg: BlockConfig, tape: Tape, names: tuple[str, ...], chunk: int = 256) -> Tensor:
    """``(L*d, P')``: the tape's forward tangents (hand-written JVP rules) along the unit vectors
    of ``θ'``, ``chunk`` columns per sweep."""
    Z = tape.values[tape.output]
    layout = Layout(cfg, names)
    out = pages.empty((Z.numel(), layout.size), Z)
    eye = torch.eye(layout.size, dtype=Z.dtype, device=Z.device)
    for start in range(0, layout.size, chunk):
        cols = eye[start : start + chunk]
        dZ = tape.tangents(tape.whole, {}, layout.scatter(cols))[tape.output]
        out[:, start : start + cols.shape[0]] = 0.0 if dZ is None else dZ.reshape(cols.shape[0], -1).T
    return out


def gradient(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    Y: Tensor | None = None,
    wrt: tuple[str, ...] | None = None,
    *,
    method: str = "closed_form",
    loss: CustomLoss | None = None,
) -> dict[str, Tensor]:
    """``∂ℓ/∂W`` for each name, ``name -> (rows, cols)``, closed form (or autograd); ``loss`` a
    :class:`~hessviz.losses.CustomLoss` in place of ``Y``."""
    params, X, Y = _prepare_target(cfg, params, X, Y, loss)
    names = _check_wrt(cfg, wrt)
    return METHODS[_check_method(method)].gradient(cfg, params, X, Y, names)


def _autograd_gradient(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Loss, names: tuple[str, ...]
) -> dict[str, Tensor]:
    flat = reference.gradient(cfg, params, X, Y, names)
    return {n: flat[sl].reshape(cfg.shape_of(n)) for n, sl in cfg.offsets(names).items()}


def _closed_form_gradient(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Loss, names: tuple[str, ...]
) -> dict[str, Tensor]:
    return _tape_gradient(cfg, build(cfg, params, X, Y), names)  # the tape's first-order sweep


def _tape_gradient(
    cfg: BlockConfig, tape: Tape, names: tuple[str, ...], out: Tensor | None = None
) -> dict[str, Tensor]:
    """``name -> ∂ℓ/∂W`` read from the tape's first-order reverse sweep through the layout of
    ``names`` (head slices by their views; a weight the sweep never reached reads as zero), the
    values views of one flat ``(P',)`` vector (``out`` when given). Each weight's gradient is
    computed when the layout reads it and copied into its place (:attr:`Tape.gradients`)."""
    flat = Layout(cfg, names).gather(
        tape.gradients, 1, tape.seed_gradient, None if out is None else out[None]
    )[0]
    return {n: flat[cols].reshape(cfg.shape_of(n)) for n, cols in cfg.offsets(names).items()}


def _closed_form_dense(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Loss, products: MatrixFreeHessian, needed: int
) -> DenseEngine:
    """The closed form's dense engine: a stack's or a coupling loss's (the whole tape built when a
    dense term is asked for), else the one-block fold over the tape's nodes."""
    names = products.names
    if cfg.is_stack or not Y.token_wise:
        _ = products.sweep_tape  # its forward pass validates now; the whole tape is built for a dense term
        return StackHessian(cfg, names, params, functools.partial(getattr, products, "tape"), Y, X, needed)
    tape = products.tape  # one forward pass, the tape's (it validates LayerNorm rows now): the products
    rec = fold(cfg, params, tape.values, tape.layers[0])  # sweep it too
    return assembly.DenseHessian(cfg, names, rec, Y, X, needed)


def _autograd_dense(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Loss, products: MatrixFreeHessian, needed: int
) -> DenseEngine:
    return AutogradHessian(cfg, products.names, params, X, Y, needed)


@dataclass(frozen=True)
class Method:
    """What one ``method=`` string stands for: the products' engine class, the dense engine, the
    Jacobian and gradient, and whether its dense terms hold vmapped tangents (their working memory)."""

    products: type[ProductsOperator]
    dense: Callable[[BlockConfig, dict[str, Tensor], Tensor, Loss, MatrixFreeHessian, int], DenseEngine]
    jacobian: Callable[[BlockConfig, dict[str, Tensor], Tensor, tuple[str, ...]], Tensor]
    gradient: Callable[[BlockConfig, dict[str, Tensor], Tensor, Loss, tuple[str, ...]], dict[str, Tensor]]
    vmapped: bool


METHODS: dict[str, Method] = {
    "closed_form": Method(
        TapeOperator, _closed_form_dense, _closed_form_jacobian, _closed_form_gradient, False
    ),
    "autograd": Method(AutogradOperator, _autograd_dense, reference.model_jacobian, _autograd_gradient, True),
}
"""The one place a ``method=`` string (``MODEL.md`` part 1 keeps ``method="autograd"``) becomes
classes: an engine is chosen by its class everywhere below."""


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    return method


def hessian_bytes(cfg: BlockConfig, names: tuple[str, ...], itemsize: int, method: str) -> int:
    """Estimated peak bytes to compute one ``(P', P')`` term: the term, one block, and the
    per-token factors (``(L, d, d)`` chain-rule maps, ``(L, d, d_ff)`` FFN factors, ``(L, d, L)``
    softmax-weighted values per head touched, and the input tangents of a Pre-LN ``ln1``).
    A stack adds, per layer with names in ``names``, that block's working memory, and, unless
    only the last layer is asked for, the ``(L·d, L·d)`` curvatures, the ``(L·d, P')`` Jacobians
    and the ``L·d`` tangent columns of :mod:`hessviz.dense.stack`."""
    if cfg.is_stack:
        by_layer: dict[int, list[str]] = {}
        for n in names:
            layer, local = cfg.layer_of(n)
            by_layer.setdefault(layer, []).append(local)
        P, Ld = sum(cfg.param_size(n) for n in names), cfg.seq_len * cfg.d_model
        blocks = sum(hessian_bytes(cfg.block, tuple(local), itemsize, method) for local in by_layer.values())
        if min(by_layer) == cfg.n_layers - 1:  # the last layer alone: the one-block engine
            return blocks + P * P * itemsize
        tangents = Ld * cfg.seq_len * (8 * cfg.d_model + 2 * cfg.d_ff + 2 * cfg.n_heads * cfg.seq_len)
        return blocks + (P * P + 3 * Ld * P + (cfg.n_layers + 2) * Ld * Ld + tangents) * itemsize
    sizes = [cfg.param_size(n) for n in names]
    P = sum(sizes)
    L, d = cfg.seq_len, cfg.d_model
    largest_block = max(sizes) ** 2
    us = units(cfg, names)
    heads = len({u.ref[2] for u in us if u.ref[2] is not None})
    ffn = cfg.d_ff * (2 if cfg.mlp == "gated" else 1)  # the gate doubles the FFN factors
    working = L * d * (8 * d + 4 * ffn) + 4 * heads * L * L * (d + cfg.d_k)
    if cfg.norm in ("pre", "parallel", "peri") and cfg.ln_affine and any(u.ref[0] == "ln1" for u in us):
        working += 2 * d * (P + 8 * L * L + 4 * L * d)  # tangents along ∂X/∂(γ, β)
    if METHODS[method].vmapped:  # vmapped tangents of every activation
        working += 6 * P * L * (L + 3 * d + 2 * cfg.d_ff + cfg.n_heads * cfg.d_k)
    return (P * P + largest_block + working) * itemsize


def hessian(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    Y: Tensor | None = None,
    wrt: tuple[str, ...] | None = None,
    *,
    method: str = "closed_form",
    loss: CustomLoss | None = None,
) -> HessianResult:
    """The Hessian of the loss in the weights ``wrt`` (all by default, in cfg order).

    The loss is ``cfg.loss`` against the target ``Y``, or ``loss=hv.CustomLoss(grad_Z, hess_Z)``
    (then no ``Y``): a loss given by its gradient and curvature in ``Z``, which may couple tokens.
    Returns a :class:`~hessviz.result.HessianResult` whose ``full``, ``outer`` and
    ``functional`` terms are computed when first read.
    """
    params, X, Y = _prepare_target(cfg, params, X, Y, loss)
    names = _check_wrt(cfg, wrt)
    chosen = METHODS[_check_method(method)]
    products = MatrixFreeHessian(cfg, params, X, Y, names, chosen.products)
    engine = chosen.dense(cfg, params, X, Y, products, hessian_bytes(cfg, names, X.element_size(), method))
    return HessianResult(cfg, names, engine, method=method, products=products)
