"""What the Real model page draws (hessviz.pretrained.explore), on the trained Post-LN model in
the repository: the window of a head slice's Hessian from closed-form products equals the same window
read from autograd Hessian-vector products; attention rows sum to 1; block gradient norms are
hv.gradient's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hessviz as hv
from hessviz import pretrained as pt
from hessviz.errors import ConfigError
from hessviz.pretrained import explore

MODEL, TEXT = "pydoc-postln", "def add(a, b):"


@pytest.fixture(scope="module")
def layer():
    cfg, params = pt.load_layer(MODEL, 1)
    X = pt.layer_inputs(MODEL, TEXT, 1)
    cfg = dataclasses.replace(cfg, seq_len=X.shape[0])
    _, Y = hv.sample_inputs(cfg, seed=3)
    return cfg, params, X, Y


@pytest.mark.parametrize("name,start,size", [("W_Q[1]", 64, 40), ("W_O[2]", 128, 24)])
def test_slice_window_matches_autograd(layer, name, start, size):
    cfg, params, X, Y = layer

    def window(method: str) -> torch.Tensor:
        res = hv.hessian(cfg, params, X, Y, wrt=(name,), method=method)
        return explore.slice_window(res, name, start, size)

    ours, auto = window("closed_form"), window("autograd")
    assert ours.shape == (size, size)
    assert (ours - auto).abs().max().item() <= 1e-10 * auto.abs().max().item()


def test_window_bounds_are_named(layer):
    cfg, params, X, Y = layer
    res = hv.hessian(cfg, params, X, Y, wrt=("W_Q[0]",))
    n = cfg.param_size("W_Q[0]")
    with pytest.raises(ConfigError, match="start"):
        explore.slice_window(res, "W_Q[0]", n, 1)
    with pytest.raises(ConfigError, match="start \\+ size"):
        explore.slice_window(res, "W_Q[0]", n - 4, 8)


def test_attention_rows_and_gradient_blocks(layer):
    cfg, params, X, Y = layer
    A = explore.attention_pattern(cfg, params, X)
    assert A.shape == (cfg.n_heads, X.shape[0], X.shape[0])
    assert torch.allclose(A.sum(-1), torch.ones(()).to(A))
    assert bool((A.triu(1) == 0).all())  # the pair is causal
    names, norms, sizes = explore.gradient_blocks(cfg, params, X, Y, by_head=True)
    grads = hv.gradient(cfg, params, X, Y)
    assert names[0] == "W_Q[0]" and sum(sizes) == cfg.num_params
    heads = sum(float(norms[i]) ** 2 for i, n in enumerate(names) if n.startswith("W_Q["))
    assert heads == pytest.approx(float(grads["W_Q"].norm()) ** 2, rel=1e-12)
