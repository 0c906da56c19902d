"""Attention soft-capping (:mod:`hessviz.ops.softcap`): ``y = c·tanh(s/c)``, its ``y'``, ``y''``, its node
rules (tangent, adjoint, adjoint tangent), and :class:`~hessviz.ops.softcap.CappedCurvature`, the curvature
of ``softmax(cap(s))`` in ``s`` kept factored, against stock torch by autograd (reverse over reverse).
In the attention core and the dense face it is covered by :mod:`tests.ops.test_attention`."""

import pytest
import torch

from hessviz.ops import softmax
from hessviz.ops.softcap import CappedCurvature, Softcap
from tests.helpers import assert_close
from tests.ops.autograd import hessian, hvp, jacobians, randn, vjp


def stock(s, cap):
    return cap * torch.tanh(s / cap)


@pytest.mark.parametrize("cap", [0.5, 2.0, 30.0])
def test_value_and_derivatives(rng, rtol, cap):
    s = randn(rng, 40, scale=3.0)
    x = s.clone().requires_grad_(True)
    (d1,) = torch.autograd.grad(stock(x, cap).sum(), x, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), x)
    at = Softcap.at(s, cap)
    assert_close(at.y, stock(s, cap), rtol, "c·tanh(s/c)")
    assert_close(at.d1, d1.detach(), rtol, "y'")
    assert_close(at.d2, d2, rtol, "y''", atol=1e-15)
    assert bool((at.y.abs() < cap).all())


def test_saturated_scores_keep_their_precision():
    """Far beyond the cap ``y' = 1/cosh²(s/c)`` keeps full relative precision (``1 − τ²`` would have
    none left once ``τ`` rounds to 1), and is 0, never NaN, where ``cosh`` overflows."""
    s = torch.tensor([20.0, -25.0, 800.0, -1e4], dtype=torch.float64)
    at = Softcap.at(s, 1.0)
    exact = 4.0 * torch.exp(-2.0 * s[:2].abs())  # 1/cosh²(x) = 4 e^{−2|x|} / (1 + e^{−2|x|})²
    exact /= (1.0 + torch.exp(-2.0 * s[:2].abs())) ** 2
    assert_close(at.d1[:2], exact, 1e-14, "y' at |s/c| = 20, 25")
    assert_close(at.d2[:2], -2.0 * torch.sign(s[:2]) * exact, 1e-14, "y'' at |s/c| = 20, 25")
    assert torch.equal(at.d1[2:], torch.zeros(2, dtype=torch.float64))
    assert torch.equal(at.d2[2:], torch.zeros(2, dtype=torch.float64))
    assert torch.equal(at.y[2:], torch.tensor([1.0, -1.0], dtype=torch.float64))


@pytest.mark.parametrize("cap", [0.7, 4.0])
def test_node_rules(rng, rtol, cap):
    """``Ṡ = y' Ṡ₀``, ``S̄₀ = y' S̄``, ``S̄̇₀ = y' S̄̇ + y'' S̄ Ṡ₀`` against autograd's JVP, VJP and HVP."""
    s, g, ds, dg = (randn(rng, 3, 5, scale=2.0) for _ in range(4))
    at = Softcap.at(s, cap)
    f = lambda t: stock(t, cap)  # noqa: E731
    (J,) = jacobians(f, [s])
    assert_close(at.tangent(ds), torch.einsum("abcd,cd->ab", J, ds), rtol, "tangent")
    assert_close(at.adjoint(g), vjp(f, [s], g)[0], rtol, "adjoint")
    first = vjp(f, [s], dg)[0]  # the first-order part, along the tangent of the adjoint
    second = hvp(f, [s], g, [ds])[0]
    assert_close(at.adjoint_tangent(dg, g, ds), first + second, rtol, "adjoint tangent")
    assert_close(at.adjoint_tangent(None, g, ds), second, rtol, "second-order part alone")
    assert_close(at.adjoint_tangent(dg, g, None), first, rtol, "first-order part alone")


@pytest.mark.parametrize("window", [None, 2])
def test_capped_softmax_curvature(rng, rtol, window):
    """``∇²_s (gᵀ softmax(mask(cap(s))))`` per row, dense and as the sandwich ``Maᵀ N Mb``, with the
    causal mask (and a window) after the cap: masked entries have zero curvature."""
    L, cap = 4, 0.8
    s, g = randn(rng, L, L, scale=2.0), randn(rng, L, L)
    at = Softcap.at(s, cap)
    a = softmax.value(at.y, causal=True, window=window)
    C = softmax.contract_hessian_factored(a, g)
    N = CappedCurvature(C, at.d1, C.w * at.d2)
    f = lambda t: softmax.value(stock(t, cap), causal=True, window=window)  # noqa: E731
    full = hessian(f, [s], g)[0][0]  # (L, L, L, L): rows do not mix
    per_row = full.diagonal(dim1=0, dim2=2).permute(2, 0, 1)
    assert_close(N.dense(), per_row, rtol, "curvature per row", atol=1e-15)
    Ma, Mb = randn(rng, L, L, 2), randn(rng, L, L, 3)
    assert_close(N.sandwich(Ma, Mb), Ma.transpose(-1, -2) @ per_row @ Mb, rtol, "Maᵀ N Mb", atol=1e-15)
