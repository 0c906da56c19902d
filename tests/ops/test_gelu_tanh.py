"""GELU-tanh, GPT-2's approximation (:mod:`hessviz.ops.gelu_tanh`), against ``F.gelu(approximate="tanh")``."""

import pytest
import torch

from hessviz.ops.gelu_tanh import GELUTanh
from tests.ops.activation import check_derivatives
from tests.ops.autograd import randn


def stock(u):
    return torch.nn.functional.gelu(u, approximate="tanh")


@pytest.mark.parametrize("scale", [0.5, 3.0, 8.0])
def test_derivatives(rng, rtol, scale):
    check_derivatives(GELUTanh, stock, randn(rng, 40, scale=scale), rtol)
