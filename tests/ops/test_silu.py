"""SiLU (:mod:`hessviz.ops.silu`), against ``F.silu``."""

import pytest
import torch

from hessviz.ops.silu import SiLU
from tests.ops.activation import check_derivatives
from tests.ops.autograd import randn


@pytest.mark.parametrize("scale", [0.5, 3.0, 8.0])
def test_derivatives(rng, rtol, scale):
    check_derivatives(SiLU, torch.nn.functional.silu, randn(rng, 40, scale=scale), rtol)
