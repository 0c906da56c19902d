"""The residual sum (:mod:`hessviz.ops.residual`): ``x + b(x)`` as a token map, and the node ``a + b``."""

import pytest
import torch

from hessviz.ops.base import Along, TokenMap
from hessviz.ops.residual import Residual, residual
from tests.helpers import assert_close
from tests.ops.autograd import check_node, randn


def test_dense_face(rng, rtol):
    L, n = 3, 4
    J, Q = randn(rng, L, n, n), randn(rng, L, n, n)
    branch = TokenMap(J, lambda g: Q * g.sum())
    out = residual(branch)
    assert_close(out.jac, J + torch.eye(n, dtype=torch.float64), rtol, "I + ∂b/∂x")
    g = randn(rng, L, n)
    assert_close(out.contract(g), branch.contract(g), rtol, "Q_y = Q_b")
    assert residual(TokenMap(J)).contract is None  # a linear branch stays linear


@pytest.mark.parametrize("shape", [(3, 4), (1, 2)])
def test_node(rng, rtol, shape):
    a, b = randn(rng, *shape), randn(rng, *shape)
    check_node(Residual("y", "a", "b", a, b), lambda u, v: u + v, [a, b], [], rng, rtol)


def test_node_one_side_zero(rng, rtol):
    a, b = randn(rng, 3, 2), randn(rng, 3, 2)
    node = Residual("y", "a", "b", a, b)
    da = randn(rng, 2, 3, 2)
    assert node.tangent([da, None], []) is da
    assert node.tangent([None, None], []) is None
    dgy = randn(rng, 2, 3, 2)
    assert node.adjoint_tangent(Along(dgy, [None, None], [], True, [True, False]))[0] == [dgy, None]
