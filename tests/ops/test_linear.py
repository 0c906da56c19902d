"""The affine node (:mod:`hessviz.ops.linear`) over column blocks, ``y = x [W_1 … W_m] + [b_1 … b_m]``."""

import pytest
import torch

from hessviz.ops.base import Along
from hessviz.ops.linear import Linear
from tests.helpers import assert_close
from tests.ops.autograd import check_node, hvp, randn, vjp

CASES = {
    "one weight and bias": ((4, 3, 5), [5], [True]),
    "no bias": ((2, 3, 4), [4], [False]),
    "fused QKV, one bias missing": ((3, 4, 2), [2, 2, 3], [True, False, True]),
    "one token": ((1, 2, 2), [3, 1], [False, True]),
}
"""``(L, n, _)``, the widths of the column blocks and which have a bias."""


def build(rng, case):
    (L, n, _), widths, has_bias = CASES[case]
    x = randn(rng, L, n)
    weights = [(f"W{i}", randn(rng, n, w)) for i, w in enumerate(widths)]
    biases = [(f"b{i}", randn(rng, w)) if b else None for i, (w, b) in enumerate(zip(widths, has_bias))]
    node = Linear("y", "x", x, weights, biases)

    def f(x, *params):
        Ws, bs = params[: len(widths)], iter(params[len(widths) :])
        b = torch.cat([next(bs) if has else torch.zeros(w) for w, has in zip(widths, has_bias)])
        return x @ torch.cat(Ws, 1) + b

    return node, f, x, [w for _, w in weights] + [b for _, b in filter(None, biases)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("moving", ["x", "p", "xp"])
def test_node(rng, rtol, case, moving):
    node, f, x, params = build(rng, case)
    check_node(node, f, [x], params, rng, rtol, moving=moving, what=case)


def test_adjoint_tangent_writes_into_dest(rng, rtol):
    """``writes_into``: each weight's ``θ̄̇`` goes into the view it is given, not a new tensor."""
    node, f, x, params = build(rng, "fused QKV, one bias missing")
    k = 2
    dx = [randn(rng, k, *x.shape)]
    dp = [randn(rng, k, *p.shape) for p in params]
    gy, dgy = randn(rng, *node.y.shape), randn(rng, k, *node.y.shape)
    node.adjoint(gy)
    whole = torch.zeros(k, x.shape[1], 7)  # one wide buffer, a column block per weight
    dest = [whole[..., 0:2], whole[..., 2:4], whole[..., 4:7], None, None]
    _, dgp = node.adjoint_tangent(Along(dgy, dx, dp))
    _, into = node.adjoint_tangent(Along(dgy, dx, dp), dest=dest)
    args = [x, *params]
    for i in range(3):
        assert into[i].data_ptr() == dest[i].data_ptr()
        ref = torch.stack(
            [
                vjp(f, args, dgy[j])[1 + i] + hvp(f, args, gy, [dx[0][j]] + [d[j] for d in dp])[1 + i]
                for j in range(k)
            ]
        )
        assert_close(whole[..., (0, 2, 4)[i] : (2, 4, 7)[i]], ref, rtol, f"W{i}̄̇ in place")
        assert_close(into[i], dgp[i], rtol, f"W{i}̄̇ with and without dest")
