"""Each component's closed-form derivatives against autograd, in float64."""

from __future__ import annotations

import math

import pytest
import torch

from hessviz.ops import activations, layernorm, score, softmax
from hessviz.ops.attention import MultiHeadAttention
from hessviz.ops.ffn import FeedForward
from hessviz.ops.gelu import GELU
from hessviz.ops.relu import ReLU
from tests.helpers import assert_close

F64 = torch.float64
RTOL = 1e-12


def rand(*shape, seed=0, scale=1.0):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def contracted_hessian(f, x, g):
    """``Σ_i g_i ∇² f_i(x)`` by autograd, for a vector map ``f``."""
    return torch.func.hessian(lambda v: (g * f(v)).sum())(x)


class TestSoftmax:
    s, g = rand(7, seed=1, scale=2.0), rand(7, seed=2)

    def test_jacobian_and_vjp(self):
        a = softmax.value(self.s)
        J = torch.func.jacrev(softmax.value)(self.s)
        assert_close(softmax.jacobian(a), J, RTOL, "softmax Jacobian")
        assert_close(softmax.vjp(a, self.g), J.T @ self.g, RTOL, "softmax vjp")
        M = rand(7, 3, seed=3)
        assert_close(softmax.apply_jacobian(a, M), J @ M, RTOL, "softmax J @ M")

    def test_contracted_hessian(self):
        a = softmax.value(self.s)
        assert_close(softmax.contract_hessian(a, self.g),
                     contracted_hessian(softmax.value, self.s, self.g), RTOL, "softmax Q(g)")

    def test_factored_contracted_hessian_sandwich(self):
        """Rows of an attention matrix: ``Maᵀ Q(g) Mb`` without the ``(L, L, L)`` tensor."""
        A = softmax.value(rand(4, 7, seed=20, scale=2.0))
        G = rand(4, 7, seed=21)
        Ma, Mb = rand(4, 7, 3, seed=22), rand(4, 7, 5, seed=23)
        Q = softmax.contract_hessian_factored(A, G)
        dense = softmax.contract_hessian(A, G)
        assert_close(Q.sandwich(Ma, Mb), Ma.transpose(-1, -2) @ dense @ Mb, RTOL, "Maᵀ Q Mb")


@pytest.mark.parametrize("eps", [0.0, 1e-2])
class TestLayerNorm:
    z, g = rand(9, seed=4, scale=3.0), rand(9, seed=5)

    def f(self, eps):
        return lambda v: torch.nn.functional.layer_norm(v, (9,), eps=eps)

    def test_value_jacobian_vjp(self, eps):
        y, st = layernorm.value(self.z, eps)
        assert_close(y, self.f(eps)(self.z), RTOL, "LN value")
        J = torch.func.jacrev(self.f(eps))(self.z)
        assert_close(layernorm.jacobian(st), J, RTOL, "LN Jacobian")
        assert_close(layernorm.vjp(st, self.g), J.T @ self.g, RTOL, "LN vjp")
        M = rand(9, 4, seed=6)
        assert_close(layernorm.apply_jacobian(st, M), J @ M, RTOL, "LN J @ M")

    def test_contracted_hessian(self, eps):
        _, st = layernorm.value(self.z, eps)
        assert_close(layernorm.contract_hessian(st, self.g),
                     contracted_hessian(self.f(eps), self.z, self.g), 1e-11, "LN Q(g)")


def test_layernorm_refuses_zero_variance_without_eps():
    with pytest.raises(ValueError, match="zero variance in row"):
        layernorm.value(torch.ones(3, 4, dtype=F64), 0.0)
    y, _ = layernorm.value(torch.ones(3, 4, dtype=F64), 1e-5)      # with ε it is defined (and zero)
    assert torch.equal(y, torch.zeros(3, 4, dtype=F64))


STOCK = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
         "gelu_tanh": lambda u: torch.nn.functional.gelu(u, approximate="tanh")}
"""Each activation as stock torch writes it: the reference its ``f``, ``df``, ``d2f`` are checked against."""


@pytest.mark.parametrize("name", sorted(activations.ACTIVATIONS))
def test_activation_derivatives(name):
    act = activations.get(name)
    x = rand(50, seed=7, scale=3.0)
    ref = STOCK[name]
    assert_close(act.f(x), ref(x), RTOL, f"{name} value")
    assert_close(act.df(x), torch.func.vmap(torch.func.grad(ref))(x), RTOL, f"{name}'")
    assert_close(act.d2f(x), torch.func.vmap(torch.func.grad(torch.func.grad(ref)))(x), 1e-11, f"{name}''")


def test_relu_states_no_curvature():
    assert ReLU.hessian_is_zero is True
    assert torch.count_nonzero(ReLU.d2f(rand(10))) == 0
    assert ReLU.df(torch.zeros(1)).item() == 0.0                 # ReLU'(0) = 0


def test_score_jacobians_and_mixed_second_derivative():
    L, d, dk = 5, 4, 3
    X, WQ, WK, G = rand(L, d, seed=8), rand(d, dk, seed=9), rand(d, dk, seed=10), rand(L, L, seed=11)

    def S(wq, wk):
        return score.value(X @ wq, X @ wk)

    JQ, JK = torch.func.jacrev(S, argnums=(0, 1))(WQ, WK)
    factored = score.jacobian(X, X @ WQ, X @ WK)
    assert_close(factored["query.weight"].dense().reshape(L, L, d, dk), JQ, RTOL, "∂S/∂W_Q")
    assert_close(factored["key.weight"].dense().reshape(L, L, d, dk), JK, RTOL, "∂S/∂W_K")
    H = torch.func.hessian(lambda wq, wk: (G * S(wq, wk)).sum(), argnums=(0, 1))(WQ, WK)
    mixed = score.contract_mixed(X, G, dk)
    expected = torch.einsum("ik,mn->imkn", mixed, torch.eye(dk, dtype=F64))
    assert_close(expected, H[0][1], RTOL, "∂²(G·S)/∂W_Q∂W_K")
    assert torch.count_nonzero(H[0][0]) == 0 and torch.count_nonzero(H[1][1]) == 0


def _attention_reference(X, wq, wk, wv):
    return torch.softmax((X @ wq) @ (X @ wk).T / math.sqrt(wq.shape[1]), -1) @ X @ wv


def test_attention_jacobian():
    L, d, dk = 4, 5, 2
    X = rand(L, d, seed=12, scale=2.0)
    W = [rand(d, dk, seed=13), rand(d, dk, seed=14), rand(d, d, seed=15)]
    sa = MultiHeadAttention(X, dict(zip(("query.weight", "key.weight", "value.weight"), W)), 1)
    assert_close(sa.output, _attention_reference(X, *W), RTOL, "SA value")
    ref = torch.func.jacrev(lambda *w: _attention_reference(X, *w), argnums=(0, 1, 2))(*W)
    for local, J in zip(("query.weight", "key.weight", "value.weight"), ref):
        assert_close(sa.jacobian(("attention", local, 0)).dense().reshape(J.shape), J, RTOL, f"∂SA/∂{local}")


def test_feedforward_derivatives():
    L, d, dff = 3, 4, 6
    Y, W1, W2, g = rand(L, d, seed=16), rand(d, dff, seed=17), rand(dff, d, seed=18), rand(L, d, seed=19)
    ffn = FeedForward(Y, W1, W2, GELU)

    def f(y, w1, w2):
        return torch.nn.functional.gelu(y @ w1) @ w2

    assert_close(ffn.output, f(Y, W1, W2), RTOL, "FFN value")
    Jy, J1, J2 = torch.func.jacrev(f, argnums=(0, 1, 2))(Y, W1, W2)
    per_token_jy = torch.stack([Jy[t, :, t, :] for t in range(L)])
    assert_close(ffn.input_map.jac, per_token_jy, RTOL, "∂f/∂y")
    assert_close(ffn.jacobian[ffn.ref("fc1.weight")].dense().reshape(J1.shape), J1, RTOL, "∂f/∂W_1")
    assert_close(ffn.jacobian[ffn.ref("fc2.weight")].dense().reshape(J2.shape), J2, RTOL, "∂f/∂W_2")

    H = torch.func.hessian(lambda y, w1, w2: (g * f(y, w1, w2)).sum(), argnums=(0, 1, 2))(Y, W1, W2)
    yy = torch.stack([H[0][0][t, :, t, :] for t in range(L)])
    assert_close(ffn.input_map.contract(g), yy, 1e-11, "∂²_yy")
    for k, name in ((1, "fc1.weight"), (2, "fc2.weight")):
        mixed = ffn.mixed(g)[ffn.ref(name)].dense()                         # (L, d, |W|) per token
        expected = torch.stack([H[0][k][t].reshape(d, -1) for t in range(L)])
        assert_close(mixed, expected, 1e-11, f"∂²_y{name}")
