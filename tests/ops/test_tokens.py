"""The token selection (:mod:`hessviz.ops.tokens`), node face only: the dense engines keep every token."""

import pytest
import torch

from hessviz.ops.base import Along
from hessviz.ops.tokens import Tokens
from tests.ops.autograd import check_node, randn


@pytest.mark.parametrize("tokens", [[0], [4], [1, 3], [0, 1, 2, 3, 4]])
def test_node(rng, rtol, tokens):
    x, R = randn(rng, 5, 3), torch.tensor(tokens)
    check_node(Tokens("y", "x", x, R), lambda u: u[R], [x], [], rng, rtol)


def test_unneeded_adjoint_tangent_is_none(rng):
    x = randn(rng, 5, 3)
    node = Tokens("y", "x", x, torch.tensor([0]))
    assert node.adjoint_tangent(Along(randn(rng, 2, 1, 3), [None], [], True, [False], [])) == ([None], [])
    assert node.tangent([None], []) is None
