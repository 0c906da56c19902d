"""The bilinear score (:mod:`hessviz.ops.score`), dense face: ``S = Q Kᵀ/√d_k``, its factored
Jacobians in the query and key weights and its mixed second derivative, plain and with rotary
positions. (Its node rules live in the attention core, :mod:`tests.ops.test_attention`.)"""

import math

import pytest
import torch

from hessviz.ops import score
from hessviz.ops.rotary import Rotary
from tests.helpers import assert_close
from tests.ops import rope
from tests.ops.autograd import hessian, jacobians, randn

CASES = [
    (5, 4, 3, 0, False),
    (3, 2, 4, 0, False),
    (4, 3, 4, 4, False),
    (4, 3, 6, 4, True),
    (1, 2, 2, 2, True),
]
"""``(L, d, d_k, rotary width, key bias acts)``: without rotary positions ``b_K`` cancels in the softmax."""
THETA = 50.0
NAMES = ("query.weight", "query.bias", "key.weight", "key.bias")


def draw(rng, L, d, dk):
    return randn(rng, L, d), [randn(rng, d, dk), randn(rng, dk), randn(rng, d, dk), randn(rng, dk)]


def reference(X, r):
    def S(wq, bq, wk, bk):
        Q, K = X @ wq + bq, X @ wk + bk
        if r:
            Q, K = rope.rotate(Q, r, THETA), rope.rotate(K, r, THETA)
        return Q @ K.T / math.sqrt(Q.shape[-1])

    return S


@pytest.mark.parametrize("L, d, dk, r, key_bias", CASES)
def test_jacobians_and_mixed(rng, rtol, L, d, dk, r, key_bias):
    X, W = draw(rng, L, d, dk)
    S = reference(X, r)
    Q, K = X @ W[0] + W[1], X @ W[2] + W[3]
    rot = Rotary(L, dk, r, THETA, X) if r else None
    if rot is None:
        assert_close(score.value(Q, K), S(*W), rtol, "S")
        factored = score.jacobian(X, Q, K)
    else:
        factored = score.rotary_jacobian(X, rot.apply(Q), rot.apply(K), rot, key_bias)
    J = jacobians(S, W)
    expected = dict(zip(NAMES, J))
    assert set(factored) == set(NAMES[: 3 + key_bias])
    for name, F in factored.items():
        assert_close(F.dense(), expected[name].reshape(L, L, -1), rtol, f"∂S/∂{name}")
    G = randn(rng, L, L)
    H = hessian(S, W, G)
    if rot is None:
        mixed = score.contract_mixed(X, G, dk)
        assert_close(torch.einsum("ik,mn->imkn", mixed, torch.eye(dk)), H[0][2], rtol, "∂²(G·S)/∂W_Q∂W_K")
        assert torch.count_nonzero(H[0][0]) == 0 and torch.count_nonzero(H[2][2]) == 0
        return
    one = torch.ones(L, 1)
    for (a, U), (b, V) in [((0, X), (2, X)), ((1, one), (2, X)), ((0, X), (3, one)), ((1, one), (3, one))]:
        got = score.rotary_mixed(U, V, G, rot, dk)
        assert_close(got, H[a][b].reshape(got.shape), rtol, f"∂²(G·S)/∂{NAMES[a]}∂{NAMES[b]}")
