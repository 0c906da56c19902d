"""The feed-forward branch (:mod:`hessviz.ops.ffn`), dense face: ``φ(y W_1 + b_1) W_2 + b_2`` as a
stage (input map, parameter Jacobians, mixed and weight-weight second derivatives) for every
activation, with and without biases. Its node face is ``Linear`` ∘ activation ∘ ``Linear``
(:mod:`tests.ops.test_linear`, :mod:`tests.ops.test_elementwise`)."""

import pytest
import torch

from hessviz.ops.activations import ACTIVATIONS
from hessviz.ops.ffn import FeedForward
from tests.helpers import assert_close
from tests.ops.autograd import check_stage, randn
from tests.ops.test_elementwise import STOCK

CASES = [
    ("gelu", True, (3, 4, 5)),
    ("relu", True, (2, 3, 4)),
    ("silu", False, (4, 3, 2)),
    ("gelu_tanh", True, (1, 2, 3)),
    ("gelu", False, (2, 5, 1)),
]
"""``(activation, biases, (L, d, d_ff))``."""


def draw(rng, biases, L, d, dff):
    w = {"fc1.weight": randn(rng, d, dff), "fc2.weight": randn(rng, dff, d)}
    if biases:
        w |= {"fc1.bias": randn(rng, dff), "fc2.bias": randn(rng, d)}
    return randn(rng, L, d, scale=1.5), w


def reference(act, names):
    def f(y, *params):
        w = dict(zip(names, params))
        h = y @ w["fc1.weight"] + w.get("fc1.bias", 0.0)
        return STOCK[act](h) @ w["fc2.weight"] + w.get("fc2.bias", 0.0)

    return f


@pytest.mark.parametrize("act, biases, sizes", CASES)
def test_stage(rng, rtol, act, biases, sizes):
    Y, w = draw(rng, biases, *sizes)
    ffn = FeedForward(
        Y, w["fc1.weight"], w["fc2.weight"], ACTIVATIONS[act], w.get("fc1.bias"), w.get("fc2.bias")
    )
    f = reference(act, list(w))
    assert_close(ffn.output, f(Y, *w.values()), rtol, "value")
    assert_close(ffn.hidden, STOCK[act](Y @ w["fc1.weight"] + w.get("fc1.bias", 0.0)), rtol, "hidden")
    assert (ffn.input_map.contract is None) == ACTIVATIONS[act].hessian_is_zero
    check_stage(ffn.stage(), f, Y, {("ffn", k, None): v for k, v in w.items()}, rng, rtol, what=act)


def test_relu_drops_every_curvature_term(rng):
    Y, w = draw(rng, True, 3, 2, 4)
    ffn = FeedForward(Y, w["fc1.weight"], w["fc2.weight"], ACTIVATIONS["relu"], w["fc1.bias"], w["fc2.bias"])
    g = torch.ones(3, 2)
    assert ("ffn", "fc1.bias", None) not in ffn.mixed(g)  # only a φ'' term would put it there
    assert all({p.a[1], p.b[1]} & {"fc2.weight"} for p in ffn.functional(g))  # no (fc1, fc1) piece
