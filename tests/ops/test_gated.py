"""The gated feed-forward branch (:mod:`hessviz.ops.gated`): the fused dense stage
``(φ(y W_G + b_G) ⊙ (y W_1 + b_1)) W_2 + b_2`` and the node ``[u h] ↦ φ(u) ⊙ h``, for every activation."""

import pytest
import torch

from hessviz.ops.activations import ACTIVATIONS
from hessviz.ops.base import Along
from hessviz.ops.gated import GatedFeedForward, GatedUnit
from tests.helpers import assert_close
from tests.ops.autograd import check_node, check_stage, randn
from tests.ops.test_elementwise import STOCK

CASES = [
    ("silu", False, (3, 4, 5)),
    ("gelu_tanh", True, (2, 3, 4)),
    ("relu", True, (3, 2, 3)),
    ("gelu", False, (1, 3, 2)),
]
"""``(activation, biases, (L, d, d_ff))``: SwiGLU, GeGLU, and the rest."""


def draw(rng, biases, L, d, dff):
    w = {
        "gate.weight": randn(rng, d, dff),
        "fc1.weight": randn(rng, d, dff),
        "fc2.weight": randn(rng, dff, d),
    }
    if biases:
        w |= {"gate.bias": randn(rng, dff), "fc1.bias": randn(rng, dff), "fc2.bias": randn(rng, d)}
    return randn(rng, L, d, scale=1.5), w


def reference(act, names):
    def f(y, *params):
        w = dict(zip(names, params))
        u = y @ w["gate.weight"] + w.get("gate.bias", 0.0)
        h = y @ w["fc1.weight"] + w.get("fc1.bias", 0.0)
        return (STOCK[act](u) * h) @ w["fc2.weight"] + w.get("fc2.bias", 0.0)

    return f


@pytest.mark.parametrize("act, biases, sizes", CASES)
def test_stage(rng, rtol, act, biases, sizes):
    Y, w = draw(rng, biases, *sizes)
    ffn = GatedFeedForward(
        Y,
        w["fc1.weight"],
        w["fc2.weight"],
        ACTIVATIONS[act],
        w.get("fc1.bias"),
        w.get("fc2.bias"),
        W_G=w["gate.weight"],
        b_G=w.get("gate.bias"),
    )
    f = reference(act, list(w))
    assert_close(ffn.output, f(Y, *w.values()), rtol, "value")
    check_stage(ffn.stage(), f, Y, {("ffn", k, None): v for k, v in w.items()}, rng, rtol, what=act)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("L, dff", [(3, 4), (1, 2)])
def test_node(rng, rtol, act, L, dff):
    uh = randn(rng, L, 2 * dff, scale=2.0)

    def f(t):
        u, h = t.chunk(2, dim=-1)
        return STOCK[act](u) * h

    check_node(GatedUnit("a", "uh", uh, ACTIVATIONS[act]), f, [uh], [], rng, rtol, what=act)


def test_node_without_tangent_or_adjoint(rng):
    node = GatedUnit("a", "uh", randn(rng, 2, 4), ACTIVATIONS["silu"])
    node.adjoint(randn(rng, 2, 2))
    assert node.tangent([None], []) is None
    assert node.adjoint_tangent(Along(None, [None])) == ([None], [])
    dgy = randn(rng, 1, 2, 2)
    (out,), _ = node.adjoint_tangent(Along(dgy, [None]))
    assert out.shape == (1, 2, 4) and torch.all(out != 0)
