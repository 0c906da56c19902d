r"""Elementwise activations ``φ``: each states its value, ``φ'`` and ``φ''``.

* ReLU: ``φ'(x) = 1[x > 0]`` (so ``φ'(0) = 0``), ``φ'' = 0``.
* GELU (exact, erf form): ``φ(x) = x Φ(x)``, ``φ'(x) = Φ(x) + x ϕ(x)``,
  ``φ''(x) = ϕ(x) (2 - x²)``, with ``Φ``, ``ϕ`` the standard normal cdf and pdf.
* GELU-tanh (GPT-2's): ``φ(x) = x (1 + tanh u)/2``, ``u = c (x + a x³)``, ``c = √(2/π)``,
  ``a = 0.044715``; with ``τ = tanh u``, ``u' = c (1 + 3a x²)``, ``u'' = 6 a c x``:
  ``φ'(x) = (1 + τ)/2 + x (1 − τ²) u'/2``,
  ``φ''(x) = (1 − τ²) (u' + x (u'' − 2 τ u'²)/2)``.

An elementwise map has a diagonal Jacobian ``diag(φ'(x))`` and contracted second
derivative ``diag(g ⊙ φ''(x))``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Activation:
    name: str
    value: Callable[[Tensor], Tensor]
    df: Callable[[Tensor], Tensor]
    d2f: Callable[[Tensor], Tensor]
    has_curvature: bool
    """False when ``φ'' = 0`` everywhere it is defined, so second-order terms vanish."""


def _normal_pdf(x: Tensor) -> Tensor:
    return torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _normal_cdf(x: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


RELU = Activation(
    name="relu",
    value=torch.relu,
    df=lambda x: (x > 0).to(x.dtype),
    d2f=torch.zeros_like,
    has_curvature=False,
)

GELU = Activation(
    name="gelu",
    value=lambda x: x * _normal_cdf(x),
    df=lambda x: _normal_cdf(x) + x * _normal_pdf(x),
    d2f=lambda x: _normal_pdf(x) * (2.0 - x * x),
    has_curvature=True,
)

_C, _A = math.sqrt(2.0 / math.pi), 0.044715


def _gelu_tanh_parts(x: Tensor) -> tuple[Tensor, Tensor]:
    """``τ = tanh(c (x + a x³))`` and ``u' = c (1 + 3a x²)``."""
    return torch.tanh(_C * (x + _A * x ** 3)), _C * (1.0 + 3.0 * _A * x * x)


def _gelu_tanh_df(x: Tensor) -> Tensor:
    tau, du = _gelu_tanh_parts(x)
    return 0.5 * (1.0 + tau) + 0.5 * x * (1.0 - tau * tau) * du


def _gelu_tanh_d2f(x: Tensor) -> Tensor:
    tau, du = _gelu_tanh_parts(x)
    return (1.0 - tau * tau) * (du + 0.5 * x * (6.0 * _A * _C * x - 2.0 * tau * du * du))


GELU_TANH = Activation(
    name="gelu_tanh",
    value=lambda x: 0.5 * x * (1.0 + _gelu_tanh_parts(x)[0]),
    df=_gelu_tanh_df,
    d2f=_gelu_tanh_d2f,
    has_curvature=True,
)

ACTIVATIONS = {a.name: a for a in (RELU, GELU, GELU_TANH)}


def get(name: str) -> Activation:
    return ACTIVATIONS[name]
