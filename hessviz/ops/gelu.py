r"""GELU, exact (erf) form: ``φ(u) = u Φ(u)``, ``φ'(u) = Φ(u) + u ϕ(u)``, ``φ''(u) = ϕ(u) (2 − u²)``,
with ``Φ``, ``ϕ`` the standard normal cdf and pdf."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hessviz.ops.elementwise import Elementwise


def _pdf(u: Tensor) -> Tensor:
    return torch.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)


def _cdf(u: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.erf(u / math.sqrt(2.0)))


class GELU(Elementwise):
    name, title = "gelu", "GELU"

    @staticmethod
    def f(u: Tensor) -> Tensor:
        return u * _cdf(u)

    @staticmethod
    def df(u: Tensor) -> Tensor:
        return _cdf(u) + u * _pdf(u)

    @staticmethod
    def d2f(u: Tensor) -> Tensor:
        return _pdf(u) * (2.0 - u * u)
