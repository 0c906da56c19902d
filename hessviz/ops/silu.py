r"""SiLU (swish): ``φ(u) = u s(u)`` with the sigmoid ``s = 1/(1 + e^{−u})``, ``s' = s (1 − s)``:

.. math::
    φ'(u) = s (1 + u (1 − s)), \qquad φ''(u) = s (1 − s) (2 + u (1 − 2s)).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hessviz.ops.elementwise import Elementwise


class SiLU(Elementwise):
    name, title = "silu", "SiLU"

    @staticmethod
    def f(u: Tensor) -> Tensor:
        return u * torch.sigmoid(u)

    @staticmethod
    def df(u: Tensor) -> Tensor:
        s = torch.sigmoid(u)
        return s * (1.0 + u * (1.0 - s))

    @staticmethod
    def d2f(u: Tensor) -> Tensor:
        s = torch.sigmoid(u)
        return s * (1.0 - s) * (2.0 + u * (1.0 - 2.0 * s))

    @classmethod
    def derivatives(cls, u: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(φ, φ', φ'')`` from one sigmoid: ``1 − s`` and ``u (1 − s)`` shared."""
        s = torch.sigmoid(u)
        one_minus = 1.0 - s
        u1 = u * one_minus
        return u * s, s * (1.0 + u1), (s * one_minus) * (2.0 + u1 - u * s)
