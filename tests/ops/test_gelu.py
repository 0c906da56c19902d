"""GELU, exact erf form (:mod:`hessviz.ops.gelu`), against ``F.gelu``."""

import pytest
import torch

from hessviz.ops.gelu import GELU
from tests.ops.activation import check_derivatives
from tests.ops.autograd import randn


@pytest.mark.parametrize("scale", [0.5, 3.0, 8.0])
def test_derivatives(rng, rtol, scale):
    check_derivatives(GELU, torch.nn.functional.gelu, randn(rng, 40, scale=scale), rtol)
