"""Bad input never yields a number: each raises a ValueError naming the field."""

from __future__ import annotations

import math

import pytest
import torch

import hessviz as hv


@pytest.fixture
def setup():
    cfg = hv.BlockConfig(seq_len=4, d_model=5, d_k=3, d_ff=6, norm="post")
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0)
    return cfg, params, X, Y


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"seq_len": 0}, "seq_len"),
        ({"seq_len": 2.5}, "seq_len"),
        ({"d_model": -1}, "d_model"),
        ({"d_k": 0}, "d_k"),
        ({"d_ff": True}, "d_ff"),
        ({"norm": "mid"}, "norm"),
        ({"activation": "tanh"}, "activation"),
        ({"loss": "hinge"}, "loss"),
        ({"ln_eps": -1e-5}, "ln_eps"),
        ({"ln_eps": math.nan}, "ln_eps"),
        ({"d_model": 1, "loss": "ce", "norm": "attention"}, "d_model"),
        ({"d_model": 1, "norm": "post"}, "d_model"),
    ],
)
def test_config_fields(kwargs, field):
    with pytest.raises(hv.ConfigError, match=field):
        hv.BlockConfig(**kwargs)


def test_unknown_missing_and_misshapen_params(setup):
    cfg, params, X, Y = setup
    with pytest.raises(ValueError, match=r"unknown name.*W_O"):
        hv.forward(cfg, params | {"W_O": torch.zeros(5, 5, dtype=torch.float64)}, X)
    with pytest.raises(ValueError, match=r"missing \['W_2'\]"):
        hv.forward(cfg, {k: v for k, v in params.items() if k != "W_2"}, X)
    with pytest.raises(ValueError, match=r"params\['W_1'\] must have shape \(5, 6\)"):
        hv.forward(cfg, params | {"W_1": params["W_1"].T}, X)
    with pytest.raises(ValueError, match=r"params\['W_K'\] must be float32 or float64"):
        hv.forward(cfg, params | {"W_K": params["W_K"].to(torch.int64)}, X)
    with pytest.raises(ValueError, match=r"params\['W_V'\] must share dtype"):
        hv.forward(cfg, params | {"W_V": params["W_V"].float()}, X)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_values(setup, bad):
    cfg, params, X, Y = setup
    W = params["W_Q"].clone()
    W[0, 0] = bad
    with pytest.raises(ValueError, match=r"params\['W_Q'\] has non-finite"):
        hv.hessian(cfg, params | {"W_Q": W}, X, Y)
    Xb = X.clone()
    Xb[1, 2] = bad
    with pytest.raises(ValueError, match="X has non-finite"):
        hv.hessian(cfg, params, Xb, Y)
    Yb = Y.clone()
    Yb[0, 0] = bad
    with pytest.raises(ValueError, match="Y has non-finite"):
        hv.hessian(cfg, params, X, Yb)


def test_wrong_input_and_target_shapes(setup):
    cfg, params, X, Y = setup
    with pytest.raises(ValueError, match=r"X must have shape \(seq_len, d_model\) = \(4, 5\)"):
        hv.forward(cfg, params, X[:3])
    with pytest.raises(ValueError, match=r"Y must be a float tensor of shape"):
        hv.loss(cfg, params, X, Y[:, :2])
    ce = hv.BlockConfig(seq_len=4, d_model=5, d_k=3, d_ff=6, norm="post", loss="ce")
    with pytest.raises(ValueError, match="int64 tensor of shape"):
        hv.loss(ce, params, X, torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"classes in \[0, d_model\) = \[0, 5\)"):
        hv.loss(ce, params, X, torch.tensor([0, 1, 5, 2]))
    with pytest.raises(ValueError, match="torch.Tensor"):
        hv.forward(cfg, params, X.numpy())


def test_zero_variance_row_without_epsilon():
    cfg = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=5, norm="pre")
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0)
    X[1] = 0.7  # a constant token: LN(X) undefined at ε = 0
    with pytest.raises(ValueError, match=r"ln_eps = 0.*zero variance in row\(s\) \[1\]"):
        hv.hessian(cfg, params, X, Y)
    eps = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=5, norm="pre", ln_eps=1e-5)
    assert torch.isfinite(hv.hessian(eps, params, X, Y).full).all()


def test_wrt_term_method_and_block_names(setup):
    cfg, params, X, Y = setup
    with pytest.raises(ValueError, match="parameter name must be one of"):
        hv.hessian(cfg, params, X, Y, wrt=("W_Q", "W_O"))
    with pytest.raises(ValueError, match="wrt must not repeat"):
        hv.hessian(cfg, params, X, Y, wrt=("W_Q", "W_Q"))
    with pytest.raises(ValueError, match="method must be one of"):
        hv.hessian(cfg, params, X, Y, method="finite-differences")
    res = hv.hessian(cfg, params, X, Y, wrt=("W_Q",))
    with pytest.raises(ValueError, match="term must be one of"):
        res.term("gauss-newton")
    with pytest.raises(ValueError, match="not in this result's names"):
        res.block("W_Q", "W_1")
    attention = hv.BlockConfig(seq_len=4, d_model=5, d_k=3, norm="attention")
    with pytest.raises(ValueError, match="for norm='attention'"):
        hv.init_params(attention) and hv.hessian(attention, hv.init_params(attention), X, Y, wrt=("W_1",))


def test_size_guard_refuses_before_allocating(setup):
    cfg, params, X, Y = setup
    hv.set_memory_limit("64KiB")
    try:
        res = hv.hessian(cfg, params, X, Y)  # MODEL.md part 2: the guard is on reading a dense term
        with pytest.raises(hv.SizeError, match=r"needs about .* over the limit of 64.0 KiB") as err:
            _ = res.full
        assert err.value.needed_bytes > err.value.limit_bytes == 64 * 1024
        assert hv.hessian(cfg, params, X, Y, wrt=("W_Q",)).full.shape == (15, 15)  # small still fits
        hv.set_memory_limit(16 * 1024)
        with pytest.raises(hv.SizeError, match="Jacobian"):
            hv.jacobian(cfg, params, X)
    finally:
        hv.set_memory_limit(None)
    big = hv.BlockConfig(seq_len=8, d_model=512, d_k=512, d_ff=2048)  # P ≈ 2.6 M
    res = hv.hessian(
        big,
        {n: torch.zeros(s, dtype=torch.float64) for n, s in big.param_shapes.items()},
        torch.randn(8, 512, dtype=torch.float64),
        torch.randn(8, 512, dtype=torch.float64),
    )
    with pytest.raises(hv.SizeError, match="lower seq_len, d_model, d_k or d_ff"):
        _ = res.outer


def test_memory_limit_from_environment(monkeypatch):
    monkeypatch.setenv("HESSVIZ_MEMORY_LIMIT", "3MiB")
    assert hv.memory_limit() == 3 * 2**20
    monkeypatch.setenv("HESSVIZ_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="memory limit must be"):
        hv.memory_limit()


def test_sampling_arguments():
    cfg = hv.BlockConfig()
    with pytest.raises(ValueError, match="input_norm must be a finite number > 0"):
        hv.sample_inputs(cfg, input_norm=0.0)
    with pytest.raises(ValueError, match="seed must be an integer"):
        hv.init_params(cfg, seed="one")
    X, _ = hv.sample_inputs(cfg, seed=4, input_norm=2.5)
    assert abs(float(torch.linalg.matrix_norm(X, ord=2)) - 2.5) < 1e-12
