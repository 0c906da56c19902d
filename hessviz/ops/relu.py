r"""ReLU: ``φ(u) = max(u, 0)``, ``φ'(u) = 1[u > 0]`` (so ``φ'(0) = 0``), ``φ'' = 0``."""

from __future__ import annotations

import torch
from torch import Tensor

from hessviz.ops.elementwise import Elementwise


class ReLU(Elementwise):
    name, title = "relu", "ReLU"
    hessian_is_zero = True

    @staticmethod
    def f(u: Tensor) -> Tensor:
        return torch.relu(u)

    @staticmethod
    def df(u: Tensor) -> Tensor:
        return (u > 0).to(u.dtype)
