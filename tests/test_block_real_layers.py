"""Real Transformer layers (MODEL.md part 2) against autograd, torch.nn and Hugging Face.

Every combination of the new fields (heads and ``W_O``, biases, LayerNorm γ/β, causal
mask, for every placement), with the activation and the loss drawn from a seeded
generator: every term and every block pair against ``torch.func`` in float64; head slices
in ``wrt`` and in ``res.block``; the forward pass against ``torch.nn.MultiheadAttention``,
a Hugging Face ``BertLayer`` and a ``GPT2Block`` built from a config (no download).
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

import hessviz as hv
from hessviz.block.config import ACTIVATIONS, LOSSES
from hessviz.block.terms import NAMES
from tests.cases import tiered
from tests.helpers import assert_close

F64 = torch.float64
RTOL = 1e-10
TERMS = NAMES
HEADS = ((1, False), (1, True), (2, True), (3, True))  # (n_heads, out_proj)


def _combinations() -> list[hv.BlockConfig]:
    """Every (heads, W_O) × bias × γ/β × causal × placement; activation, loss and sizes seeded."""
    rng = random.Random(9)
    out = []
    for (H, wo), bias, affine, causal, norm in itertools.product(
        HEADS, (False, True), (False, True), (False, True), ("post", "pre", "none", "attention")
    ):
        if affine and norm in ("none", "attention"):
            continue
        out.append(
            hv.BlockConfig(
                seq_len=rng.randint(1, 4),
                d_model=rng.choice((4, 5)),
                d_k=rng.randint(1, 2),
                d_ff=rng.randint(2, 4),
                norm=norm,
                activation=rng.choice(ACTIVATIONS),
                loss=rng.choice(LOSSES),
                n_heads=H,
                out_proj=wo,
                d_v=rng.choice((None, 3)) if wo else None,
                bias=bias,
                ln_affine=affine,
                causal=causal,
                ln_eps=rng.choice((0.0, 1e-3)),
            )
        )
    return out


CASES = _combinations()


def _setup(cfg: hv.BlockConfig, seed: int = 0, input_norm: float = 2.0):
    params = hv.init_params(cfg, seed=seed)
    X, Y = hv.sample_inputs(cfg, seed=seed + 1, input_norm=input_norm)
    return params, X, Y


def assert_blocks_close(res: hv.HessianResult, ref: hv.HessianResult, what: str) -> None:
    """Every term and every block pair: relative error ≤ RTOL (blocks that are zero in exact
    arithmetic are compared with an absolute tolerance at round-off of the full Hessian: the
    reference's functional term is ``full − outer``)."""
    floor = 1e-13 * max(float(ref.full.abs().max()), 1e-300)
    for term in TERMS:
        ours, theirs = res.term(term), ref.term(term)
        for a, b in itertools.product(res.names, repeat=2):
            assert_close(
                ours[res.offsets[a], res.offsets[b]],
                theirs[ref.offsets[a], ref.offsets[b]],
                RTOL,
                f"{what}: {term} block ({a}, {b})",
                atol=floor,
            )


@pytest.mark.parametrize("cfg", tiered(CASES, fast=8), ids=lambda c: c.describe().replace(" ", ""))
def test_every_term_and_block_matches_autograd(cfg):
    params, X, Y = _setup(cfg)
    res = hv.hessian(cfg, params, X, Y)
    ref = hv.hessian(cfg, params, X, Y, method="autograd")
    assert res.names == cfg.param_names
    assert_blocks_close(res, ref, cfg.describe())


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_silu_block_matches_autograd(norm):
    """SiLU, added as one file (``hessviz/ops/silu.py``) and one row of the activation table: every
    term and block pair, the gradient and the matrix-free products of a real layer against autograd."""
    cfg = hv.BlockConfig(
        seq_len=3,
        d_model=4,
        d_k=2,
        d_ff=5,
        n_heads=2,
        out_proj=True,
        bias=True,
        ln_affine=True,
        norm=norm,
        activation="silu",
        ln_eps=1e-3,
    )
    params, X, Y = _setup(cfg, seed=3)
    res = hv.hessian(cfg, params, X, Y)
    ref = hv.hessian(cfg, params, X, Y, method="autograd")
    assert_blocks_close(res, ref, cfg.describe())
    g, g_ref = hv.gradient(cfg, params, X, Y), hv.gradient(cfg, params, X, Y, method="autograd")
    scale = max(float(t.abs().max()) for t in g_ref.values())  # b_K's gradient is 0 up to round-off
    for name in cfg.param_names:
        assert_close(g[name], g_ref[name], RTOL, f"SiLU gradient {name}", atol=1e-14 * scale)
    V = torch.randn(res.size, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    for term in TERMS:
        assert_close(
            res.matvec(V, term),
            ref.term(term) @ V,
            RTOL,
            f"SiLU {term} products",
            atol=1e-13 * float(ref.full.abs().max()),
        )


@pytest.mark.parametrize("cfg", CASES[::7], ids=lambda c: c.describe().replace(" ", ""))
def test_jacobian_gradient_and_forward_match_autograd(cfg):
    params, X, Y = _setup(cfg, seed=3)
    from hessviz import reference

    assert_close(hv.forward(cfg, params, X), reference.torch_forward(cfg, params, X), 1e-12, "forward")
    assert_close(
        hv.jacobian(cfg, params, X),
        hv.jacobian(cfg, params, X, method="autograd"),
        RTOL,
        "Jacobian",
        atol=1e-15,
    )
    ours, theirs = hv.gradient(cfg, params, X, Y), hv.gradient(cfg, params, X, Y, method="autograd")
    for name in cfg.param_names:
        assert ours[name].shape == cfg.param_shapes[name]
        assert_close(ours[name], theirs[name], RTOL, f"gradient {name}", atol=1e-15)


SLICED = [c for c in CASES if c.n_heads == 3 and c.bias and c.seq_len > 1][:4]


@pytest.mark.parametrize("cfg", SLICED, ids=lambda c: c.describe().replace(" ", ""))
def test_head_slices_in_wrt_and_block(cfg):
    """Random subsets of whole names and head slices; blocks of slices computed alone."""
    params, X, Y = _setup(cfg, seed=5)
    rng = random.Random(cfg.seq_len * 31 + cfg.d_model)
    for _ in range(2):
        wrt = []
        for name in cfg.param_names:
            draw = rng.random()
            if name in hv.block.config.HEADED and draw < 0.5:
                wrt += rng.sample(cfg.head_names(name), rng.randint(1, cfg.n_heads))
            elif draw < 0.7:
                wrt.append(name)
        wrt = tuple(rng.sample(wrt, len(wrt))) or ("W_Q[1]",)  # any order in, θ order out
        res = hv.hessian(cfg, params, X, Y, wrt=wrt)
        ref = hv.hessian(cfg, params, X, Y, wrt=wrt, method="autograd")
        assert res.names == cfg.sort_names(wrt)
        assert_blocks_close(res, ref, f"{cfg.describe()}, wrt={res.names}")
        fresh = hv.hessian(cfg, params, X, Y, wrt=wrt)  # nothing cached: block alone
        for a, b in rng.sample(list(itertools.product(res.names, repeat=2)), 6):
            for term in ("full", "functional"):
                expected = ref.term(term)[ref.offsets[a], ref.offsets[b]]
                assert_close(
                    fresh.block(a, b, term),
                    expected,
                    RTOL,
                    f"block({a}, {b}, {term})",
                    atol=1e-13 * float(ref.full.abs().max()),
                )
        assert_close(
            hv.jacobian(cfg, params, X, wrt),
            hv.jacobian(cfg, params, X, wrt, method="autograd"),
            RTOL,
            "Jacobian of slices",
            atol=1e-15,
        )


def test_a_slice_is_its_entries_of_the_whole_hessian():
    """``W_Q[1]``–``W_O[2]`` computed alone equals the matching entries of the whole ``(W_Q, W_O)``
    block (heads are column blocks of ``W_Q`` and row blocks of ``W_O``)."""
    cfg = hv.BlockConfig(
        seq_len=4,
        d_model=6,
        d_k=2,
        d_ff=5,
        n_heads=3,
        out_proj=True,
        bias=True,
        ln_affine=True,
        norm="pre",
        activation="gelu",
    )
    params, X, Y = _setup(cfg, seed=7)
    whole = hv.hessian(cfg, params, X, Y, wrt=("W_Q", "W_O")).block("W_Q", "W_O")
    rows, cols = cfg.head_indices("W_Q[1]"), cfg.head_indices("W_O[2]")
    res = hv.hessian(cfg, params, X, Y)
    alone = res.block("W_Q[1]", "W_O[2]")  # computed alone: nothing cached yet
    assert alone.shape == (cfg.param_size("W_Q[1]"), cfg.param_size("W_O[2]"))
    assert_close(alone, whole[rows][:, cols], 1e-13, "slice vs whole")
    res.term("full")  # now read from the cached term
    assert_close(res.block("W_O[2]", "W_Q[1]"), whole[rows][:, cols].T, 1e-13, "cached slice vs whole")


def test_structural_zeros_are_exact():
    """``b_K`` never changes the softmax: its rows are exactly zero. Without anything after the
    attention, two heads' functional blocks are exactly zero (not round-off)."""
    cfg = hv.BlockConfig(
        seq_len=4, d_model=6, d_k=2, n_heads=3, out_proj=True, bias=True, norm="attention", causal=True
    )
    params, X, Y = _setup(cfg)
    res = hv.hessian(cfg, params, X, Y, wrt=("b_K", "W_Q[0]", "W_Q[1]", "W_V[2]"))
    assert torch.count_nonzero(res.full[res.offsets["b_K"]]) == 0
    assert torch.count_nonzero(res.functional[res.offsets["W_Q[0]"], res.offsets["W_Q[1]"]]) == 0
    assert torch.count_nonzero(res.functional[res.offsets["W_Q[1]"], res.offsets["W_V[2]"]]) == 0
    assert torch.count_nonzero(res.outer[res.offsets["W_Q[0]"], res.offsets["W_Q[1]"]]) > 0


def test_one_token_with_causal_mask():
    """A causal mask with ``L = 1`` is fine: the token attends to itself."""
    cfg = hv.BlockConfig(
        seq_len=1,
        d_model=4,
        d_k=2,
        d_ff=3,
        n_heads=2,
        out_proj=True,
        causal=True,
        bias=True,
        ln_affine=True,
        ln_eps=1e-3,
        activation="gelu_tanh",
    )
    params, X, Y = _setup(cfg)
    assert_blocks_close(
        hv.hessian(cfg, params, X, Y), hv.hessian(cfg, params, X, Y, method="autograd"), "L = 1, causal"
    )


def test_layer_norm_affine_reference_is_symmetric():
    """The reference applies γ, β by hand: ``torch.func.hessian`` through
    ``F.layer_norm(weight=γ)`` is not symmetric in torch 2.13 (forward-over-reverse)."""
    cfg = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=3, ln_affine=True, activation="gelu")
    params, X, Y = _setup(cfg)
    H = hv.hessian(cfg, params, X, Y, method="autograd").full
    assert_close(H, H.T, 1e-12, "reference symmetry")


# ----------------------------------------------------------------- the forward pass vs torch.nn / HF


def _multi_head_cfg(norm: str, **kw) -> hv.BlockConfig:
    return hv.BlockConfig(
        seq_len=5, d_model=8, d_k=4, d_ff=12, n_heads=2, out_proj=True, bias=True, norm=norm, **kw
    )


@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_torch_multihead_attention(causal):
    cfg = _multi_head_cfg("attention", causal=causal)
    params, X, _ = _setup(cfg, seed=2)
    d, L = cfg.d_model, cfg.seq_len
    mha = torch.nn.MultiheadAttention(d, cfg.n_heads, bias=True, batch_first=True, dtype=F64)
    with torch.no_grad():  # torch's weights are ours transposed
        mha.in_proj_weight.copy_(torch.cat([params["W_Q"].T, params["W_K"].T, params["W_V"].T]))
        mha.in_proj_bias.copy_(torch.cat([params["b_Q"], params["b_K"], params["b_V"]]))
        mha.out_proj.weight.copy_(params["W_O"].T)
        mha.out_proj.bias.copy_(params["b_O"])
    mask = torch.ones(L, L, dtype=torch.bool).triu(1) if causal else None
    with torch.no_grad():
        expected = mha(X[None], X[None], X[None], attn_mask=mask, need_weights=False)[0][0]
    assert_close(hv.forward(cfg, params, X), expected, 1e-12, "SA vs nn.MultiheadAttention")


def _load(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in weights.items():
            module.get_parameter(name).copy_(value)


def _hf_output(layer: torch.nn.Module, X: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        out = layer(X[None], attention_mask=mask)
    return (out[0] if isinstance(out, tuple) else out)[0]


@pytest.mark.slow
def test_forward_matches_huggingface_bert_layer():
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.modeling_bert import BertLayer

    cfg = _multi_head_cfg("post", ln_affine=True, activation="gelu", ln_eps=1e-12)
    params, X, _ = _setup(cfg, seed=4)
    config = transformers.BertConfig(
        hidden_size=cfg.d_model,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config._attn_implementation = "eager"
    layer = BertLayer(config).to(F64).eval()
    p = params
    _load(
        layer,
        {
            "attention.self.query.weight": p["W_Q"].T,
            "attention.self.query.bias": p["b_Q"],
            "attention.self.key.weight": p["W_K"].T,
            "attention.self.key.bias": p["b_K"],
            "attention.self.value.weight": p["W_V"].T,
            "attention.self.value.bias": p["b_V"],
            "attention.output.dense.weight": p["W_O"].T,
            "attention.output.dense.bias": p["b_O"],
            "attention.output.LayerNorm.weight": p["ln1_gamma"],
            "attention.output.LayerNorm.bias": p["ln1_beta"],
            "intermediate.dense.weight": p["W_1"].T,
            "intermediate.dense.bias": p["b_1"],
            "output.dense.weight": p["W_2"].T,
            "output.dense.bias": p["b_2"],
            "output.LayerNorm.weight": p["ln2_gamma"],
            "output.LayerNorm.bias": p["ln2_beta"],
        },
    )
    assert_close(hv.forward(cfg, params, X), _hf_output(layer, X), 1e-12, "block vs BertLayer")


@pytest.mark.slow
def test_forward_matches_huggingface_gpt2_block():
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    cfg = _multi_head_cfg("pre", ln_affine=True, activation="gelu_tanh", causal=True, ln_eps=1e-5)
    params, X, _ = _setup(cfg, seed=6)
    config = transformers.GPT2Config(
        n_embd=cfg.d_model,
        n_head=cfg.n_heads,
        n_inner=cfg.d_ff,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        attn_pdrop=0.0,
        embd_pdrop=0.0,
    )
    config._attn_implementation = "eager"
    block = GPT2Block(config).to(F64).eval()
    p = params  # GPT-2's Conv1D multiplies from the right, like us
    _load(
        block,
        {
            "ln_1.weight": p["ln1_gamma"],
            "ln_1.bias": p["ln1_beta"],
            "attn.c_attn.weight": torch.cat([p["W_Q"], p["W_K"], p["W_V"]], 1),
            "attn.c_attn.bias": torch.cat([p["b_Q"], p["b_K"], p["b_V"]]),
            "attn.c_proj.weight": p["W_O"],
            "attn.c_proj.bias": p["b_O"],
            "ln_2.weight": p["ln2_gamma"],
            "ln_2.bias": p["ln2_beta"],
            "mlp.c_fc.weight": p["W_1"],
            "mlp.c_fc.bias": p["b_1"],
            "mlp.c_proj.weight": p["W_2"],
            "mlp.c_proj.bias": p["b_2"],
        },
    )
    L = cfg.seq_len
    future = torch.full((L, L), -math.inf, dtype=F64).triu(1)[None, None]  # the causal mask, additive
    assert_close(hv.forward(cfg, params, X), _hf_output(block, X, future), 1e-12, "block vs GPT2Block")


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n_heads=0), "n_heads"),
        (dict(n_heads=2), "out_proj"),
        (dict(d_v=3), "d_v"),
        (dict(norm="none", ln_affine=True), "ln_affine"),
        (dict(norm="attention", ln_affine=True), "ln_affine"),
    ],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        hv.BlockConfig(**kwargs)


def test_bad_head_slices_name_the_weight():
    cfg = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=3, n_heads=2, out_proj=True, bias=True)
    params, X, Y = _setup(cfg)
    with pytest.raises(ValueError, match=r"W_Q\[2\]"):
        hv.hessian(cfg, params, X, Y, wrt=("W_Q[2]",))
    with pytest.raises(ValueError, match="W_1"):
        hv.hessian(cfg, params, X, Y, wrt=("W_1[0]",))
    with pytest.raises(ValueError, match="b_O"):
        hv.gradient(cfg, params, X, Y, wrt=("b_O[0]",))
    res = hv.hessian(cfg, params, X, Y, wrt=("W_Q[0]",))
    with pytest.raises(ValueError, match=r"W_Q\[1\]"):
        res.block("W_Q[0]", "W_Q[1]")


@pytest.mark.parametrize("name", ["b_Q", "b_O", "b_1", "ln1_gamma", "ln2_beta"])
def test_wrong_vector_shape_names_it(name):
    cfg = hv.BlockConfig(
        seq_len=3, d_model=4, d_k=2, d_ff=3, n_heads=2, out_proj=True, bias=True, ln_affine=True
    )
    params, X, Y = _setup(cfg)
    params[name] = torch.zeros(params[name].shape[0] + 1, dtype=F64)
    with pytest.raises(ValueError, match=name):
        hv.hessian(cfg, params, X, Y)
