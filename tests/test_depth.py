"""Stacks of blocks (``n_layers > 1``, MODEL.md part 2) and losses that couple tokens.

Every term of every block pair of stacks of two to four layers, across the block kinds
(Post-LN, Pre-LN, no LN, attention alone; heads, ``W_O``, biases, γ/β, causal, GELU-tanh),
against ``torch.func`` in float64, head slices included; a custom loss whose curvature
couples tokens against autograd; the matrix-free products on stacks against the dense
terms; and the bad inputs of issue 11.
"""

from __future__ import annotations

import pytest
import torch

import hessviz as hv
from hessviz import reference
from tests.helpers import assert_close

F64 = torch.float64
RTOL = 1e-10
TERMS = ("full", "outer", "functional")


def _setup(cfg: hv.BlockConfig, seed: int = 0, input_norm: float = 2.0):
    params = hv.init_params(cfg, seed=seed)
    X, Y = hv.sample_inputs(cfg, seed=seed + 1, input_norm=input_norm)
    return params, X, Y


SMALL = dict(seq_len=3, d_model=4, d_k=2, d_ff=3)


def test_stack_names_theta_order_and_head_slices():
    cfg = hv.BlockConfig(n_layers=3, n_heads=2, out_proj=True, bias=True, **SMALL)
    one = cfg.block
    assert one.n_layers == 1 and one.param_names[0] == "W_Q"
    assert cfg.param_names == tuple(f"l{i}.{n}" for i in range(3) for n in one.param_names)
    assert cfg.num_params == 3 * one.num_params
    assert cfg.shape_of("l1.W_Q[1]") == (4, 2) and cfg.shape_of("l2.W_O[0]") == (2, 4)
    assert torch.equal(cfg.head_indices("l1.W_Q[1]"), one.head_indices("W_Q[1]"))
    assert cfg.sort_names(["l2.W_1", "l0.W_Q[1]", "l1.b_Q", "l0.W_Q[0]"]) == \
        ("l0.W_Q[0]", "l0.W_Q[1]", "l1.b_Q", "l2.W_1")
    assert cfg.head_names("l1.W_V") == ("l1.W_V[0]", "l1.W_V[1]")
    assert cfg.layer_of("l2.W_O[1]") == (2, "W_O[1]")
    assert hv.BlockConfig(**SMALL).param_names == ("W_Q", "W_K", "W_V", "W_1", "W_2")


def test_each_layer_has_its_own_weights_and_layer_0_is_the_one_block_draw():
    cfg = hv.BlockConfig(n_layers=2, **SMALL)
    params = hv.init_params(cfg, seed=4)
    single = hv.init_params(cfg.block, seed=4)
    for n in cfg.block.param_names:
        assert torch.equal(params[f"l0.{n}"], single[n])
        assert not torch.equal(params[f"l1.{n}"], params[f"l0.{n}"])


@pytest.mark.parametrize("name, match", [("l3.W_Q", "n_layers = 3"), ("W_Q", "layer prefix"),
                                         ("l1.W_9", "l1.W_9"), ("l0.W_1[0]", "no heads"),
                                         ("l-1.W_Q", "parameter name")])
def test_bad_names_in_a_stack_are_refused(name, match):
    cfg = hv.BlockConfig(n_layers=3, **SMALL)
    params, X, Y = _setup(cfg)
    with pytest.raises(ValueError, match=match):
        hv.hessian(cfg, params, X, Y, wrt=(name,))


def test_bad_n_layers_and_prefix_on_one_block_are_refused():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n_layers"):
            hv.BlockConfig(n_layers=bad)
    with pytest.raises(ValueError, match="n_layers = 1"):
        hv.BlockConfig().check_name("l0.W_Q")


STACK_KINDS = [
    hv.BlockConfig(n_layers=2, norm="post", activation="gelu", **SMALL),
    hv.BlockConfig(n_layers=3, norm="pre", loss="ce", ln_eps=1e-3, **SMALL),
    hv.BlockConfig(n_layers=2, norm="none", activation="gelu_tanh", **SMALL),
    hv.BlockConfig(n_layers=4, norm="attention", seq_len=3, d_model=3, d_k=2, causal=True),
    hv.BlockConfig(n_layers=2, norm="pre", n_heads=2, out_proj=True, bias=True, ln_affine=True,
                   causal=True, activation="gelu_tanh", ln_eps=1e-5, **SMALL),
    hv.BlockConfig(n_layers=2, norm="post", n_heads=2, out_proj=True, d_v=1, bias=True, ln_affine=True,
                   loss="ce", **SMALL),
]


@pytest.mark.parametrize("cfg", STACK_KINDS, ids=lambda c: c.describe().replace(" ", ""))
def test_forward_loss_gradient_and_jacobian_of_stacks_match_autograd(cfg):
    params, X, Y = _setup(cfg, seed=2)
    Z = reference.torch_forward(cfg, params, X)
    assert_close(hv.forward(cfg, params, X), Z, 1e-12, "forward")
    assert_close(hv.loss(cfg, params, X, Y), reference.torch_loss(cfg, Z, Y), 1e-12, "loss")
    wrt = cfg.param_names[1::2]
    grads = hv.gradient(cfg, params, X, Y, wrt=wrt)
    ref = hv.gradient(cfg, params, X, Y, wrt=wrt, method="autograd")
    floor = 1e-14 * max(float(g.abs().max()) for g in ref.values())   # rank collapse: ~0 gradients
    for n in wrt:
        assert_close(grads[n], ref[n], RTOL, f"gradient {n}", atol=floor)
    assert_close(hv.jacobian(cfg, params, X), hv.jacobian(cfg, params, X, method="autograd"), RTOL,
                 "jacobian")
