"""Parameters and inputs: seeded sampling and the validation every entry point runs.

``init_params`` draws, in θ order, every weight matrix ``W ~ N(0, 1/fan_in)`` entrywise
(``fan_in`` = rows of ``W``), every bias and LayerNorm shift ``~ N(0, 0.1²)`` and every
LayerNorm scale ``~ 1 + N(0, 0.1²)``: small but non-zero, so that every term of the
Hessian is exercised. ``sample_inputs`` draws a Gaussian ``X`` rescaled to a given
spectral norm ``‖X‖₂``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.errors import InputError

FLOAT_DTYPES = (torch.float32, torch.float64)
VECTOR_SCALE = 0.1
"""Standard deviation of the random biases, LayerNorm shifts and (around 1) scales."""


def _generator(seed: int) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError(f"seed must be an integer, got {seed!r}")
    return torch.Generator().manual_seed(seed)


def init_params(
    cfg: BlockConfig,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device | None = None,
) -> dict[str, Tensor]:
    """Seeded parameters ``name -> tensor`` of ``cfg.param_shapes``: matrices ``N(0, 1/rows)``,
    biases and γ/β near ``0`` and ``1`` (see the module docstring)."""
    if dtype not in FLOAT_DTYPES:
        raise InputError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    gen = _generator(seed)
    params = {}
    for name, shape in cfg.param_shapes.items():
        w = torch.randn(*shape, generator=gen, dtype=torch.float64)
        if len(shape) == 2:
            w = w / math.sqrt(shape[0])
        else:
            w = (1.0 if name.endswith("_gamma") else 0.0) + VECTOR_SCALE * w
        params[name] = w.to(dtype=dtype, device=device)
    return params


def sample_inputs(
    cfg: BlockConfig,
    seed: int = 0,
    input_norm: float = 1.0,
    *,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device | None = None,
) -> tuple[Tensor, Tensor]:
    """Seeded ``X (L, d)`` with spectral norm ``‖X‖₂ = input_norm`` and a target.

    The target is ``Y (L, d) ~ N(0, 1)`` for ``mse`` and ``y (L,)`` int64 uniform in
    ``[0, d)`` for ``ce``.
    """
    if (
        isinstance(input_norm, bool)
        or not isinstance(input_norm, (int, float))
        or not math.isfinite(input_norm)
        or input_norm <= 0
    ):
        raise InputError(f"input_norm must be a finite number > 0, got {input_norm!r}")
    if dtype not in FLOAT_DTYPES:
        raise InputError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    gen = _generator(seed)
    L, d = cfg.seq_len, cfg.d_model
    X = torch.randn(L, d, generator=gen, dtype=torch.float64)
    X = X * (input_norm / torch.linalg.matrix_norm(X, ord=2))
    if cfg.loss == "mse":
        Y = torch.randn(L, d, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    else:
        Y = torch.randint(0, d, (L,), generator=gen).to(device=device)
    return X.to(dtype=dtype, device=device), Y


def check_params(
    cfg: BlockConfig, params: dict[str, Tensor], names: tuple[str, ...] | None = None
) -> tuple[torch.dtype, torch.device]:
    """Validate ``params`` against ``cfg``; return their common dtype and device."""
    if not isinstance(params, dict):
        raise InputError(f"params must be a dict name -> tensor, got {type(params).__name__}")
    expected = set(cfg.param_names)
    unknown = sorted(set(params) - expected)
    missing = [n for n in cfg.param_names if n not in params]
    if unknown:
        raise InputError(
            f"params has unknown name(s) {unknown}; allowed for norm={cfg.norm!r}: "
            f"{', '.join(cfg.param_names)}"
        )
    if missing:
        raise InputError(
            f"params is missing {missing}; required for norm={cfg.norm!r}: {', '.join(cfg.param_names)}"
        )
    first = params[cfg.param_names[0]]
    for name, shape in cfg.param_shapes.items():
        w = params[name]
        if not isinstance(w, Tensor):
            raise InputError(f"params[{name!r}] must be a torch.Tensor, got {type(w).__name__}")
        if tuple(w.shape) != shape:
            raise InputError(f"params[{name!r}] must have shape {shape}, got {tuple(w.shape)}")
        if w.dtype not in FLOAT_DTYPES:
            raise InputError(f"params[{name!r}] must be float32 or float64, got {w.dtype}")
        if w.dtype != first.dtype or w.device != first.device:
            raise InputError(
                f"params[{name!r}] must share dtype and device with "
                f"params[{cfg.param_names[0]!r}] ({first.dtype}, {first.device}), "
                f"got ({w.dtype}, {w.device})"
            )
        if not torch.isfinite(w).all():
            raise InputError(f"params[{name!r}] has non-finite entries (nan or inf)")
    return first.dtype, first.device


def check_X(cfg: BlockConfig, X: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Validate ``X (L, d)``; return it in the parameters' dtype."""
    if not isinstance(X, Tensor):
        raise InputError(f"X must be a torch.Tensor of shape (seq_len, d_model), got {type(X).__name__}")
    shape = (cfg.seq_len, cfg.d_model)
    if tuple(X.shape) != shape:
        raise InputError(f"X must have shape (seq_len, d_model) = {shape}, got {tuple(X.shape)}")
    if not X.is_floating_point():
        raise InputError(f"X must be a floating-point tensor, got {X.dtype}")
    if X.device != device:
        raise InputError(f"X must be on the device of params ({device}), got {X.device}")
    if not torch.isfinite(X).all():
        raise InputError("X has non-finite entries (nan or inf)")
    return X.to(dtype)


def check_Y(cfg: BlockConfig, Y: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Validate the target: ``(L, d)`` float for mse, ``(L,)`` int64 in ``[0, d)`` for ce."""
    if not isinstance(Y, Tensor):
        raise InputError(f"Y must be a torch.Tensor, got {type(Y).__name__}")
    if Y.device != device:
        raise InputError(f"Y must be on the device of params ({device}), got {Y.device}")
    L, d = cfg.seq_len, cfg.d_model
    if cfg.loss == "mse":
        if tuple(Y.shape) != (L, d) or not Y.is_floating_point():
            raise InputError(
                f"Y must be a float tensor of shape (seq_len, d_model) = {(L, d)} "
                f"for loss='mse', got {Y.dtype} {tuple(Y.shape)}"
            )
        if not torch.isfinite(Y).all():
            raise InputError("Y has non-finite entries (nan or inf)")
        return Y.to(dtype)
    if tuple(Y.shape) != (L,) or Y.dtype != torch.int64:
        raise InputError(
            f"Y must be an int64 tensor of shape (seq_len,) = {(L,)} of class "
            f"indices for loss='ce', got {Y.dtype} {tuple(Y.shape)}"
        )
    if L and (int(Y.min()) < 0 or int(Y.max()) >= d):
        raise InputError(
            f"Y must hold classes in [0, d_model) = [0, {d}) for loss='ce', "
            f"got values in [{int(Y.min())}, {int(Y.max())}]"
        )
    return Y
