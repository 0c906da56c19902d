"""QK-norm (:mod:`hessviz.ops.qknorm`), node face only: an RMSNorm over each head's query and key rows
with one ``γ`` shared by the heads, ``V`` passed through. (The dense engine reads it through the same
rules: :mod:`tests.ops.test_attention`.)"""

import pytest
import torch

from hessviz.ops.qknorm import QKNorm
from tests.ops.autograd import check_node, randn

CASES = [(3, 2, 2, 4, 3, 1e-6), (2, 4, 2, 2, 2, 0.0), (1, 1, 1, 3, 5, 1e-2)]
"""``(L, heads, kv_heads, d_k, d_v, ε)``."""


def reference(heads, kv_heads, dk, dv, eps):
    def f(qkv, gq, gk):
        q, k, v = torch.split(qkv, (heads * dk, kv_heads * dk, kv_heads * dv), -1)

        def rms(t, gamma):
            t = t.unflatten(-1, (-1, dk))
            return (gamma * t / torch.sqrt((t * t).mean(-1, keepdim=True) + eps)).flatten(-2)

        return torch.cat([rms(q, gq), rms(k, gk), v], -1)

    return f


@pytest.mark.parametrize("L, heads, kv_heads, dk, dv, eps", CASES)
@pytest.mark.parametrize("moving", ["x", "p", "xp"])
def test_node(rng, rtol, L, heads, kv_heads, dk, dv, eps, moving):
    qkv = randn(rng, L, (heads + kv_heads) * dk + kv_heads * dv, scale=2.0)
    gq, gk = 1.0 + randn(rng, dk, scale=0.3), 1.0 + randn(rng, dk, scale=0.3)
    node = QKNorm(
        "y", "qkv", qkv, heads, kv_heads, dk, dv, eps, (("query.norm", gq), ("key.norm", gk)), "test"
    )
    f = reference(heads, kv_heads, dk, dv, eps)
    check_node(node, f, [qkv], [gq, gk], rng, rtol, moving=moving)
