"""The shared machinery (:mod:`hessviz.ops.base`): the token map's VJP, the cached identity and
ones, and ``add`` of maybe-zero terms. ``Node`` itself is an interface, checked through every node."""

import pytest
import torch

from hessviz.ops import base
from tests.helpers import assert_close
from tests.ops.autograd import randn


def test_token_map_vjp(rng, rtol):
    J, g = randn(rng, 4, 3, 5), randn(rng, 4, 3)
    assert_close(base.TokenMap(J).vjp(g), torch.stack([J[t].T @ g[t] for t in range(4)]), rtol, "Jᵀg")


def test_identity_eye_ones():
    like = torch.zeros(2, dtype=torch.float64)
    I3 = base.identity(4, 3, like).jac
    assert I3.shape == (4, 3, 3) and torch.equal(I3[2], torch.eye(3, dtype=torch.float64))
    assert base.identity(4, 3, like).contract is None  # the identity is linear
    assert base.eye(3, like) is base.eye(3, like)  # cached, one shared tensor
    assert base.ones(5, like) is base.ones(5, like) and torch.equal(base.ones(5, like), torch.ones(5, 1))
    assert base.eye(3, torch.zeros(1, dtype=torch.float32)).dtype == torch.float32


@pytest.mark.parametrize(
    "terms, expected", [((None, None), None), ((None, 2.0), 2.0), ((1.0, None, 2.0), 3.0)]
)
def test_add_skips_zeros(terms, expected):
    tensors = [None if t is None else torch.tensor(t) for t in terms]
    out = base.add(*tensors)
    assert (out is None) if expected is None else float(out) == expected


def test_node_is_an_interface():
    node = base.Node()
    for call in (
        lambda: node.tangent([], []),
        lambda: node.adjoint(torch.zeros(1)),
        lambda: node.adjoint_tangent(base.Along(None, [])),
    ):
        with pytest.raises(NotImplementedError):
            call()
