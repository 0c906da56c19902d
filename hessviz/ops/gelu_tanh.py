r"""GELU-tanh (GPT-2's): ``φ(u) = u (1 + tanh w)/2``, ``w = c (u + a u³)``, ``c = √(2/π)``, ``a = 0.044715``.

With ``τ = tanh w``, ``w' = c (1 + 3a u²)``, ``w'' = 6 a c u``:

.. math::
    φ'(u) = (1 + τ)/2 + u (1 − τ²) w'/2, \qquad
    φ''(u) = (1 − τ²) (w' + u (w'' − 2 τ w'^2)/2).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hessviz.ops.elementwise import Elementwise

_C, _A = math.sqrt(2.0 / math.pi), 0.044715


def _parts(u: Tensor) -> tuple[Tensor, Tensor]:
    """``τ = tanh(c (u + a u³))`` and ``w' = c (1 + 3a u²)``."""
    return torch.tanh(_C * (u + _A * u**3)), _C * (1.0 + 3.0 * _A * u * u)


class GELUTanh(Elementwise):
    name, title = "gelu_tanh", "GELU-tanh"

    @staticmethod
    def f(u: Tensor) -> Tensor:
        return 0.5 * u * (1.0 + _parts(u)[0])

    @staticmethod
    def df(u: Tensor) -> Tensor:
        tau, dw = _parts(u)
        return 0.5 * (1.0 + tau) + 0.5 * u * (1.0 - tau * tau) * dw

    @staticmethod
    def d2f(u: Tensor) -> Tensor:
        tau, dw = _parts(u)
        return (1.0 - tau * tau) * (dw + 0.5 * u * (6.0 * _A * _C * u - 2.0 * tau * dw * dw))
