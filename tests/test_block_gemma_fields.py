"""``MODEL.md`` part 5's ``BlockConfig`` fields: ``attn_scale`` (the factor on ``q·k``), ``window``
(sliding-window attention, ``t − window < s ≤ t``, with ``causal``) and ``softcap`` (``S ← c·tanh(S/c)``
before the mask and the softmax).

Every term (``full``, ``outer``, ``functional``), dense and by products, against the autograd reference
in float64 (``full`` by reverse over reverse, ``outer`` as ``Jᵀ ∇²ℓ J`` from ``jacrev``) for blocks that
combine them with causal masks, RoPE, grouped key/value heads, QK-norm, biases and the Peri-LN
placement; windows shorter than the text; scores far beyond the cap; a stack whose layers have their own
windows and rotary bases, dense and through a whole model. The reference forward is checked against the
contract's formulas written out by hand, so a mask or cap missing from both sides cannot pass.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import hessviz as hv
from hessviz import reference
from hessviz.block.terms import NAMES
from hessviz.dense import record
from hessviz.errors import ConfigError
from tests.helpers import assert_close

F64 = torch.float64
RTOL = 1e-10

SMALL = dict(seq_len=6, d_model=4, d_k=2, d_ff=3)
GEMMA = dict(  # Gemma 3's block in miniature: peri, RMSNorm, GeGLU, QK-norm, RoPE, one key/value head
    SMALL,
    norm="peri",
    norm_type="rmsnorm",
    ln_affine=True,
    mlp="gated",
    activation="gelu_tanh",
    n_heads=2,
    n_kv_heads=1,
    out_proj=True,
    qk_norm=True,
    rope=True,
    causal=True,
    ln_eps=1e-6,
    attn_scale=0.6,
    window=2,
)
CASES = {
    "scale-post": dict(SMALL, attn_scale=1.7),
    "window-pre-causal": dict(SMALL, norm="pre", causal=True, window=2, ln_affine=True),
    "window1-attention": dict(SMALL, norm="attention", causal=True, window=1, bias=True),
    "softcap-real-biases": dict(
        SMALL, norm="pre", n_heads=2, out_proj=True, bias=True, ln_affine=True, softcap=0.8, loss="ce"
    ),
    "softcap-gqa-rope-window": dict(
        SMALL,
        norm="pre",
        norm_type="rmsnorm",
        n_heads=4,
        n_kv_heads=2,
        out_proj=True,
        rope=True,
        causal=True,
        window=3,
        softcap=0.5,
        attn_scale=1.3,
        bias=("Q", "K", "V"),
    ),
    "gemma3": GEMMA,
    "gemma2": dict(GEMMA, qk_norm=False, softcap=0.7, norm_type="layernorm", bias=True),
}


def _setup(cfg: hv.BlockConfig, input_norm: float = 3.0):
    params = hv.init_params(cfg, seed=3)
    X, Y = hv.sample_inputs(cfg, seed=4, input_norm=input_norm)
    return params, X, Y


def _check_terms(cfg: hv.BlockConfig, params, X, Y, rtol: float = RTOL) -> None:
    """Every term dense and by products against autograd, the forward pass and the gradient."""
    res = hv.hessian(cfg, params, X, Y)
    names = cfg.param_names
    full = reference.full_hessian_rr(cfg, params, X, Y, names)
    outer = reference.outer_hessian(cfg, params, X, Y, names)
    ref = {"full": full, "outer": outer, "functional": full - outer}
    floor = 1e-14 * float(torch.linalg.norm(full))  # the reference's functional is full − outer
    V = torch.randn(res.size, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    for term in NAMES:
        assert_close(res.term(term), ref[term], rtol, f"{cfg.describe()}: {term}", atol=floor)
        assert_close(res.matvec(V, term), ref[term] @ V, rtol, f"{cfg.describe()}: {term} H V", atol=floor)
    assert_close(hv.forward(cfg, params, X), reference.torch_forward(cfg, params, X), 1e-13, "forward")
    grads = hv.gradient(cfg, params, X, Y)
    want = reference.gradient(cfg, params, X, Y, names)
    for name, sl in cfg.offsets().items():
        assert_close(grads[name].reshape(-1), want[sl], rtol, f"gradient {name}", atol=1e-15)


@pytest.mark.parametrize("fields", CASES.values(), ids=CASES.keys())
def test_every_term_and_products_match_autograd(fields):
    cfg = hv.BlockConfig(**fields)
    _check_terms(cfg, *_setup(cfg))


def test_scores_far_beyond_the_cap():
    """Raw scores many times the cap (``tanh`` saturated, ``y'`` down to 1e-64): still exact."""
    cfg = hv.BlockConfig(
        **dict(SMALL, norm="pre", n_heads=2, out_proj=True, bias=True, softcap=0.3, attn_scale=6.0)
    )
    params, X, Y = _setup(cfg, input_norm=6.0)
    Xa = torch.nn.functional.layer_norm(X, (cfg.d_model,), eps=cfg.ln_eps)  # the attention's input
    q = (Xa @ params["W_Q"] + params["b_Q"]).unflatten(-1, (2, -1)).transpose(0, 1)
    k = (Xa @ params["W_K"] + params["b_K"]).unflatten(-1, (2, -1)).transpose(0, 1)
    raw = q @ k.transpose(-1, -2) * cfg.attn_scale
    assert float(raw.abs().max()) > 20 * cfg.softcap  # tanh saturated: y' below 1e-16 there
    d1 = record.attention(cfg, params, Xa).core.cap.d1  # y' the engines use, down to 1e-64 here
    assert_close(d1, torch.cosh(raw / cfg.softcap).square().reciprocal(), 1e-10, "y'")
    _check_terms(cfg, params, X, Y)


def test_a_stack_with_its_own_window_and_rotary_base_per_layer():
    """Gemma 3's local and global layers: windows ``(2, None, 3)`` and rotary bases per layer."""
    cfg = hv.BlockConfig(
        **dict(
            GEMMA,
            qk_norm=False,
            n_layers=3,
            window=(2, None, 3),
            rope_theta=(10.0, 1000.0, 10.0),
            softcap=0.9,
        )
    )
    assert [cfg.layer(i).window for i in range(3)] == [2, None, 3]
    assert [cfg.layer(i).rope_theta for i in range(3)] == [10.0, 1000.0, 10.0]
    _check_terms(cfg, *_setup(cfg))


def _by_hand(X, W_Q, W_K, W_V, scale, window, cap):
    """One head, ``norm="attention"``, the contract's formulas written out token by token."""
    L = X.shape[0]
    Z = torch.zeros_like(X @ W_V)
    for t in range(L):
        seen = [s for s in range(L) if t - (window or L + t) < s <= t]
        scores = torch.stack([(X[t] @ W_Q) @ (X[s] @ W_K) * scale for s in seen])
        if cap is not None:
            scores = cap * torch.tanh(scores / cap)
        weights = torch.softmax(scores, 0)
        Z[t] = sum(w * (X[s] @ W_V) for w, s in zip(weights, seen))
    return Z


@pytest.mark.parametrize(
    "window, cap, scale", [(2, None, None), (3, 0.4, 2.0), (None, 1.5, 0.3), (1, 0.5, None)]
)
def test_the_forward_is_the_contracts(window, cap, scale):
    cfg = hv.BlockConfig(
        **dict(SMALL, norm="attention", causal=True, window=window, softcap=cap, attn_scale=scale)
    )
    params, X, _ = _setup(cfg)
    want = _by_hand(X, params["W_Q"], params["W_K"], params["W_V"], cfg.score_scale, window, cap)
    assert_close(hv.forward(cfg, params, X), want, 1e-13, "closed form")
    assert_close(reference.torch_forward(cfg, params, X), want, 1e-13, "reference")
    if window is not None:  # a token beyond the window changes nothing: exact, not approximately
        X2 = X.clone()
        X2[0] += 1.0
        Z, Z2 = hv.forward(cfg, params, X), hv.forward(cfg, params, X2)
        assert torch.equal(Z[window:], Z2[window:]) and not torch.equal(Z[0], Z2[0])
    assert cfg.score_scale == (1 / math.sqrt(cfg.d_k) if scale is None else scale)


def test_a_window_as_long_as_the_text_is_global_attention():
    cfg = hv.BlockConfig(**dict(SMALL, norm="pre", causal=True))
    params, X, Y = _setup(cfg)
    long = dataclasses.replace(cfg, window=cfg.seq_len)
    assert torch.equal(
        hv.hessian(long, params, X, Y).term("full"), hv.hessian(cfg, params, X, Y).term("full")
    )
    short = dataclasses.replace(cfg, window=cfg.seq_len - 1)
    assert not torch.allclose(hv.forward(short, params, X), hv.forward(cfg, params, X))


@pytest.mark.parametrize("checkpoint", [False, True], ids=["kept", "checkpointed"])
def test_a_whole_model_with_per_layer_windows_matches_autograd(tmp_path, checkpoint):
    """``hv.model_hessian`` on a GPT-2 folder whose stack is given windows ``(2, None)`` and a cap: the
    next-token products (with every layer kept, and rebuilt from its input) against double backward of
    the reference forward with the same windows."""
    transformers = pytest.importorskip("transformers")
    from tests.test_pretrained import randomise

    ref_model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=30, n_embd=8, n_layer=2, n_head=2, n_positions=16)
    )
    randomise(ref_model, seed=7)
    ref_model.save_pretrained(tmp_path)
    model = hv.load_model(tmp_path)
    stack = hv.BlockConfig.stack_of(
        [dataclasses.replace(c, window=w, softcap=2.0) for (c, _), w in zip(model, (2, None))]
    )
    plain = hv.model_hessian(model, torch.tensor([[3, 17, 5, 29, 11, 2, 8]]), wrt=("l0.W_Q",)).value
    model = dataclasses.replace(model, cfg=stack)
    ids = torch.tensor([[3, 17, 5, 29, 11, 2, 8], [7, 1, 22, 9, 14, 4, 0]])
    res = hv.model_hessian(model, ids, wrt=("l0.W_Q", "l0.W_K", "l1.W_V", "l1.W_1"), checkpoint=checkpoint)
    cfg, head = res.cfg, model.head
    X0 = model.embed(ids)
    names = res.names

    def loss(theta):
        params = reference._unflatten(cfg, names, theta, model.params)
        total = 0.0
        for X, row in zip(X0, ids):
            Z = reference.torch_forward(cfg, params, X)
            N = reference.torch_norm(Z, head.norm_type, head.eps, head.gamma, head.beta)
            total = total + torch.nn.functional.cross_entropy(
                N[:-1] @ head.embedding.T, row[1:], reduction="sum"
            )
        return total / (ids.shape[0] * (ids.shape[1] - 1))

    theta = reference.flatten(cfg, model.params, names)
    assert abs(float(res.value) - float(loss(theta))) <= 1e-12 * abs(float(res.value))
    windowed = hv.model_hessian(model, ids[:1], wrt=("l0.W_Q",)).value
    assert abs(float(windowed) - float(plain)) > 1e-6  # the windows and the cap change the model
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        v = torch.randn(res.size, generator=gen, dtype=F64)
        want = torch.func.jvp(torch.func.grad(loss), (theta,), (v,))[1]
        got = res.matvec(v)
        assert float((got - want).norm() / want.norm()) <= 1e-10


def test_bad_values_are_clear_config_errors():
    with pytest.raises(ConfigError, match="window = 3 needs causal=True"):
        hv.BlockConfig(window=3)
    for field, bad in (("softcap", 0.0), ("softcap", -1.0), ("attn_scale", 0.0), ("window", 0)):
        with pytest.raises(ConfigError, match=field):
            hv.BlockConfig(causal=True, **{field: bad})
    with pytest.raises(ConfigError, match="n_layers = 2 values, got 3"):
        hv.BlockConfig(causal=True, n_layers=2, window=(1, 2, 3))
    with pytest.raises(ConfigError, match="single block takes one value"):
        hv.BlockConfig(rope_theta=(10.0, 20.0))
    with pytest.raises(ConfigError, match="rope_theta"):
        hv.BlockConfig(n_layers=2, rope=True, rope_theta=(10.0, -1.0))
    with pytest.raises(
        ConfigError, match="differ only in window, rope_theta; layer 1 differs from layer 0 in d_ff"
    ):
        hv.BlockConfig.stack_of([hv.BlockConfig(), hv.BlockConfig(d_ff=5)])


def test_per_layer_values_have_one_spelling():
    same = hv.BlockConfig(causal=True, n_layers=3, window=(4, 4, 4))
    assert same.window == 4 and same == hv.BlockConfig(causal=True, n_layers=3, window=4)
    mixed = hv.BlockConfig(causal=True, n_layers=2, window=[4, None])
    assert mixed.window == (4, None) and mixed.block.window == 4 and mixed.layer(1).window is None
    assert "windows 4,global" in mixed.describe()
    assert hv.BlockConfig.stack_of([mixed.layer(0), mixed.layer(1)]) == mixed
    assert hv.BlockConfig().is_paper_block and not hv.BlockConfig(softcap=1.0).is_paper_block
    desc = hv.BlockConfig(causal=True, window=3, softcap=50.0, attn_scale=0.0625).describe()
    assert "window 3" in desc and "softcap 50" in desc and "score scale 0.0625" in desc
