"""The elementwise node (:mod:`hessviz.ops.elementwise`) for every activation: its rules from
``φ'``, ``φ''`` against autograd through stock torch."""

import pytest
import torch

from hessviz.ops.activations import ACTIVATIONS
from tests.ops.autograd import check_node, randn

STOCK = {
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
    "gelu_tanh": lambda u: torch.nn.functional.gelu(u, approximate="tanh"),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("shape", [(5, 3), (1, 4)])
def test_node(rng, rtol, name, shape):
    u = randn(rng, *shape, scale=2.0)
    check_node(ACTIVATIONS[name]("y", "u", u), STOCK[name], [u], [], rng, rtol, what=name)


def test_stock_covers_the_table():
    assert set(STOCK) == set(ACTIVATIONS)
