"""ReLU (:mod:`hessviz.ops.relu`): ``φ = max(u, 0)``, ``φ'(0) = 0``, no curvature."""

import pytest
import torch

from hessviz.ops.relu import ReLU
from tests.ops.activation import check_derivatives
from tests.ops.autograd import randn


@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_derivatives(rng, rtol, scale):
    check_derivatives(ReLU, torch.relu, randn(rng, 40, scale=scale), rtol)


def test_kink_and_no_curvature():
    assert ReLU.hessian_is_zero
    u = torch.tensor([-1.0, 0.0, 1.0])
    assert ReLU.df(u).tolist() == [0.0, 0.0, 1.0]  # φ'(0) = 0, as torch's relu backward
    node = ReLU("y", "u", u)
    node.adjoint(torch.ones(3))
    assert node.curv is None  # the node keeps no φ'' ȳ to multiply
