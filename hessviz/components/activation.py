r"""Elementwise activations ``φ``: each states its value, ``φ'`` and ``φ''``.

* ReLU: ``φ'(x) = 1[x > 0]`` (so ``φ'(0) = 0``), ``φ'' = 0``.
* GELU (exact, erf form): ``φ(x) = x Φ(x)``, ``φ'(x) = Φ(x) + x ϕ(x)``,
  ``φ''(x) = ϕ(x) (2 - x²)``, with ``Φ``, ``ϕ`` the standard normal cdf and pdf.

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

ACTIVATIONS = {a.name: a for a in (RELU, GELU)}


def get(name: str) -> Activation:
    return ACTIVATIONS[name]
