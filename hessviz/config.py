"""The block configuration and the conventions that every module shares.

Conventions (fixed once, here)
------------------------------
* ``L`` = ``seq_len`` tokens, ``d`` = ``d_model`` features; a sequence is ``X`` of shape
  ``(L, d)``, one row per token.
* ``vec_r`` is row-major flattening (``tensor.reshape(-1)``); every Jacobian and Hessian
  is taken with respect to ``vec_r`` of its matrices.
* Parameters, always in this order: ``W_Q (d, d_k)``, ``W_K (d, d_k)``, ``W_V (d, d)``,
  ``W_1 (d, d_ff)``, ``W_2 (d_ff, d)``; the placement ``attention`` has only the first
  three. ``θ`` is their ``vec_r`` concatenated in that order and ``P = len(θ)``.
* Weights multiply from the right: ``X @ W``.
* ``J = ∂ vec_r(Z) / ∂θ`` has shape ``(L*d, P)``; its row ``t*d + j`` is output
  feature ``j`` of token ``t``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hessviz.errors import ConfigError

NORMS = ("post", "pre", "none", "attention")
ACTIVATIONS = ("relu", "gelu")
LOSSES = ("mse", "ce")
ATTENTION_PARAMS = ("W_Q", "W_K", "W_V")
FFN_PARAMS = ("W_1", "W_2")

NORM_TITLES = {"post": "Post-LN block", "pre": "Pre-LN block", "none": "Block without LN",
               "attention": "Self-attention alone"}


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class BlockConfig:
    """One Transformer block, as fixed by ``MODEL.md``.

    ``norm`` places the LayerNorm: ``post`` ``Z = LN(Z1 + FFN(Z1)), Z1 = LN(X + SA(X))``;
    ``pre`` ``Z = Z1 + FFN(LN(Z1)), Z1 = X + SA(LN(X))``; ``none`` without LayerNorm;
    ``attention`` the single self-attention layer ``Z = SA(X)``.
    """

    seq_len: int = 8
    d_model: int = 16
    d_k: int = 8
    d_ff: int = 32
    norm: str = "post"
    activation: str = "relu"
    loss: str = "mse"
    ln_eps: float = 0.0
    _shapes: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_int("seq_len", self.seq_len, 1)
        _check_int("d_model", self.d_model, 1)
        _check_int("d_k", self.d_k, 1)
        _check_int("d_ff", self.d_ff, 1)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("activation", self.activation, ACTIVATIONS)
        _check_choice("loss", self.loss, LOSSES)
        eps = self.ln_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
            raise ConfigError(f"ln_eps must be a finite number >= 0, got {eps!r}")
        if self.loss == "ce" and self.d_model < 2:
            raise ConfigError("d_model must be >= 2 with loss='ce' (the classes are the d_model features)")
        if self.uses_layernorm and self.d_model < 2 and self.ln_eps == 0:
            raise ConfigError(
                "d_model must be >= 2 when LayerNorm is used with ln_eps = 0 "
                "(a single feature has zero variance); raise d_model or set ln_eps > 0"
            )
        d, dk, dff = self.d_model, self.d_k, self.d_ff
        shapes = {"W_Q": (d, dk), "W_K": (d, dk), "W_V": (d, d), "W_1": (d, dff), "W_2": (dff, d)}
        object.__setattr__(self, "_shapes", {n: shapes[n] for n in self.param_names})

    @property
    def uses_layernorm(self) -> bool:
        return self.norm in ("post", "pre")

    @property
    def param_names(self) -> tuple[str, ...]:
        """Parameter names in θ order."""
        return ATTENTION_PARAMS if self.norm == "attention" else ATTENTION_PARAMS + FFN_PARAMS

    @property
    def param_shapes(self) -> dict[str, tuple[int, int]]:
        """``name -> (rows, cols)`` in θ order."""
        return dict(self._shapes)

    def param_size(self, name: str) -> int:
        rows, cols = self.param_shapes[self.check_name(name)]
        return rows * cols

    @property
    def num_params(self) -> int:
        """``P``, the length of θ."""
        return sum(r * c for r, c in self._shapes.values())

    def offsets(self, names: tuple[str, ...] | None = None) -> dict[str, slice]:
        """``name -> slice`` of that parameter inside θ restricted to ``names`` (cfg order)."""
        names = self.param_names if names is None else names
        out, start = {}, 0
        for n in names:
            size = self.param_size(n)
            out[n] = slice(start, start + size)
            start += size
        return out

    def check_name(self, name: str) -> str:
        if name not in self._shapes:
            raise ConfigError(
                f"parameter name must be one of {', '.join(self.param_names)} "
                f"for norm={self.norm!r}, got {name!r}"
            )
        return name

    def describe(self, input_norm: float | None = None) -> str:
        """One line in words, e.g. ``Post-LN block, L = 8, d = 16, ReLU, MSE, ‖X‖₂ = 1``."""
        parts = [NORM_TITLES[self.norm], f"L = {self.seq_len}", f"d = {self.d_model}",
                 f"d_k = {self.d_k}"]
        if self.norm != "attention":
            parts += [f"d_ff = {self.d_ff}", {"relu": "ReLU", "gelu": "GELU"}[self.activation]]
        parts.append({"mse": "MSE", "ce": "cross-entropy"}[self.loss])
        if self.uses_layernorm and self.ln_eps:
            parts.append(f"ε = {self.ln_eps:g}")
        if input_norm is not None:
            parts.append(f"‖X‖₂ = {input_norm:g}")
        return ", ".join(parts)
