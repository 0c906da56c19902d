"""The whole block: closed form against the torch.func reference, product by product."""

from __future__ import annotations

import pytest
import torch

import hessviz as hv
from hessviz.block.terms import NAMES
from hessviz.reference import torch_forward
from tests.cases import ALL, GRID, Case, tiered
from tests.helpers import assert_close

RTOL = 1e-10
TERMS = NAMES


@pytest.fixture(scope="module", params=tiered(ALL, fast=6), ids=lambda c: c.id)
def pair(request):
    case: Case = request.param
    params, X, Y = case.inputs()
    return (
        case,
        params,
        X,
        Y,
        hv.hessian(case.cfg, params, X, Y),
        hv.hessian(case.cfg, params, X, Y, method="autograd"),
    )


@pytest.mark.parametrize("term", TERMS)
def test_hessian_terms_match_autograd(pair, term):
    case, params, X, Y, _, ref = pair
    closed = hv.hessian(case.cfg, params, X, Y).term(term)  # each term assembled on its own
    # the reference's functional term is full − outer: it carries round-off of size ε‖full‖
    atol = 1e-14 * float(torch.linalg.norm(ref.full))
    assert_close(closed, ref.term(term), RTOL, f"{case.id} {term}", atol=atol)


def test_forward_jacobian_gradient_match_autograd(pair):
    case, params, X, Y, *_ = pair
    cfg = case.cfg
    assert_close(hv.forward(cfg, params, X), torch_forward(cfg, params, X), RTOL, "forward")
    assert_close(
        hv.jacobian(cfg, params, X), hv.jacobian(cfg, params, X, method="autograd"), RTOL, "jacobian"
    )
    g, g_ref = hv.gradient(cfg, params, X, Y), hv.gradient(cfg, params, X, Y, method="autograd")
    for name in cfg.param_names:
        assert_close(g[name], g_ref[name], RTOL, f"gradient {name}")


def test_decomposition_and_structure(pair):
    case, params, X, Y, closed, _ = pair
    full, outer, functional = closed.full, closed.outer, closed.functional
    assert_close(outer + functional, full, 1e-12, "outer + functional = full")
    together = hv.hessian(case.cfg, params, X, Y).terms()  # full as outer + functional
    assert_close(together["full"], full, 1e-13, "terms()['full']")
    for term, H in zip(TERMS, (full, outer, functional)):
        assert_close(H.T, H, 1e-14, f"{term} symmetric")
    eig = torch.linalg.eigvalsh(outer)
    assert eig.min() >= -1e-12 * max(eig.abs().max(), 1e-300), "outer must be PSD"


def test_wrt_subsets_and_blocks_agree_with_full(pair):
    case, params, X, Y, closed, _ = pair
    cfg = case.cfg
    names = cfg.param_names
    subset = (names[-1], names[0])  # any order in, cfg order out
    sub = hv.hessian(cfg, params, X, Y, wrt=subset)
    assert sub.names == (names[0], names[-1])
    idx = torch.cat([torch.arange(cfg.num_params)[closed.offsets[n]] for n in sub.names])
    for term in TERMS:
        assert_close(sub.term(term), closed.term(term)[idx][:, idx], 1e-13, f"wrt {subset} {term}")
    fresh = hv.hessian(cfg, params, X, Y)  # block() before any term
    for a in names:
        for b in names:
            for term in TERMS:
                expected = closed.term(term)[closed.offsets[a], closed.offsets[b]]
                assert_close(fresh.block(a, b, term), expected, 1e-13, f"block {a},{b} {term}")


def test_results_follow_dtype_and_device_of_params():
    cfg = hv.BlockConfig(seq_len=4, d_model=6, d_k=3, d_ff=5, norm="pre", activation="gelu")
    params = hv.init_params(cfg, seed=3, dtype=torch.float32)
    X, Y = hv.sample_inputs(cfg, seed=3, dtype=torch.float32)
    res = hv.hessian(cfg, params, X, Y)
    assert res.full.dtype == torch.float32 and res.full.device == X.device
    ref = hv.hessian(cfg, params, X, Y, method="autograd")
    assert_close(res.full, ref.full, 1e-4, "float32 full")
    assert hv.jacobian(cfg, params, X).dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    case = GRID[1]
    params, X, Y = case.inputs()
    cuda = {k: v.cuda() for k, v in params.items()}
    res = hv.hessian(case.cfg, cuda, X.cuda(), Y.cuda())
    assert res.full.device.type == "cuda"
    assert_close(res.full.cpu(), hv.hessian(case.cfg, params, X, Y).full, 1e-12, "cuda vs cpu")


def test_relu_second_derivative_term_vanishes():
    """Without LayerNorm, ReLU's FFN weights get no functional curvature; GELU's W_1 does."""
    for act, expect_zero in (("relu", True), ("gelu", False)):
        cfg = hv.BlockConfig(seq_len=4, d_model=5, d_k=3, d_ff=6, norm="none", activation=act)
        params = hv.init_params(cfg, seed=0)
        X, Y = hv.sample_inputs(cfg, seed=1, input_norm=2.0)
        res = hv.hessian(cfg, params, X, Y)
        assert torch.count_nonzero(res.block("W_2", "W_2", "functional")) == 0  # linear in W_2
        w1 = res.block("W_1", "W_1", "functional")
        assert bool(torch.count_nonzero(w1) == 0) is expect_zero


# ---- hand-written expressions, as documentation -------------------------------------------------


def test_one_token_attention_is_linear_in_W_V():
    """With L = 1 the softmax is 1, SA = x W_V, and the MSE Hessian in W_V is (2/d)·(xᵀx ⊗ I)."""
    cfg = hv.BlockConfig(seq_len=1, d_model=3, d_k=2, norm="attention")
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0, input_norm=2.0)
    res = hv.hessian(cfg, params, X, Y)
    x = X[0]
    by_hand = (2.0 / 3) * torch.kron(torch.outer(x, x), torch.eye(3, dtype=x.dtype))
    assert_close(res.block("W_V", "W_V"), by_hand, 1e-14, "H_VV")
    assert torch.count_nonzero(res.block("W_Q", "W_Q")) == 0  # one token: no dependence on W_Q


def test_W2_block_without_layernorm_is_a_sum_of_kronecker_products():
    """Z = Z1 + φ(Z1 W_1) W_2 is linear in W_2: H_{W_2 W_2} = 2/(L d) Σ_t a_t a_tᵀ ⊗ I_d."""
    cfg = hv.BlockConfig(seq_len=4, d_model=3, d_k=2, d_ff=5, norm="none")
    params = hv.init_params(cfg, seed=1)
    X, Y = hv.sample_inputs(cfg, seed=1)
    Z1 = X + torch.softmax((X @ params["W_Q"]) @ (X @ params["W_K"]).T / 2**0.5, -1) @ X @ params["W_V"]
    a = torch.relu(Z1 @ params["W_1"])
    by_hand = 2 / (4 * 3) * torch.kron(a.T @ a, torch.eye(3, dtype=a.dtype))
    res = hv.hessian(cfg, params, X, Y, wrt=("W_2",))
    assert_close(res.full, by_hand, 1e-14, "H_{W2 W2}")
