"""Grouped-query heads, rotary positions and QK-norm (MODEL.md part 3) against autograd and Hugging Face.

Seeded random configurations over ``n_kv_heads``, ``rope`` (``rope_theta``, ``rotary_dim``) and
``qk_norm``, combined with part 2's fields (heads, ``W_O``, biases, γ/β, causal mask, every
placement, stacks, both losses) and the norm branch's (RMSNorm, gated MLP): every term and every
block pair, head slices (``W_K[g]`` under GQA) in ``wrt`` and in ``res.block``, the products
``matvec``, all against ``torch.func`` in float64 (the full Hessian by reverse over reverse,
``jacrev`` of ``grad``). The forward pass against ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``,
``Qwen3DecoderLayer`` and ``GPTNeoXLayer`` built from a config (no download): they compute RMSNorm
and the rotary angles in float32, so they agree to about 1e-7.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import hessviz as hv
from hessviz import reference
from hessviz.block.config import ACTIVATIONS, LOSSES, parse_name
from hessviz.errors import ConfigError
from tests.cases import tiered
from tests.helpers import assert_close

F64 = torch.float64
RTOL = 1e-10
TERMS = ("full", "outer", "functional")
NORMS = ("post", "pre", "none", "attention", "parallel")
"""The placements drawn here: part 5's ``peri`` has its own file (``tests/test_block_peri.py``), so
these draws stay as they were."""


def _draw(rng: random.Random) -> hv.BlockConfig:
    """One random configuration of the new attention fields and the fields they combine with."""
    H = rng.choice((1, 2, 4))
    out_proj = H > 1 or rng.random() < 0.5
    kv = rng.choice([None] + [g for g in (1, 2, 4) if H % g == 0]) if out_proj else None
    d_k = rng.choice((2, 3, 4))
    rope = rng.random() < 0.7
    rotary_dim = (2 if d_k == 3 else rng.choice((None, 2))) if rope else None
    norm = rng.choice(NORMS)
    layer_norm = norm in ("post", "pre", "parallel")
    ffn = norm != "attention"
    bias = rng.choice((False, True, ("Q", "K", "V"), ("K",), ("Q", "V")))
    return hv.BlockConfig(
        seq_len=rng.randint(1, 5),
        d_model=rng.choice((4, 5, 6)),
        d_k=d_k,
        d_ff=rng.randint(2, 5),
        norm=norm,
        activation=rng.choice(ACTIVATIONS),
        loss=rng.choice(LOSSES),
        n_heads=H,
        out_proj=out_proj,
        n_kv_heads=kv,
        rope=rope,
        rope_theta=rng.choice((10000.0, 100.0, 7.5)),
        rotary_dim=rotary_dim,
        qk_norm=rng.random() < 0.4,
        bias=bias,
        ln_affine=layer_norm and rng.random() < 0.6,
        norm_type=rng.choice(("layernorm", "rmsnorm")) if layer_norm else "layernorm",
        mlp=rng.choice(("plain", "gated")) if ffn else "plain",
        causal=rng.random() < 0.5,
        ln_eps=rng.choice((0.0, 1e-3)),
        n_layers=1 if rng.random() < 0.8 else 2,
    )


def _cases(n: int, seed: int = 18) -> list[hv.BlockConfig]:
    rng, out = random.Random(seed), []
    while len(out) < n:
        try:
            cfg = _draw(rng)
        except ConfigError:  # a drawn combination the contract refuses: draw again
            continue
        if cfg.rope or cfg.n_kv_heads is not None or cfg.qk_norm:
            out.append(cfg)
    return out


CASES = _cases(24)


def _setup(cfg: hv.BlockConfig, seed: int = 0, input_norm: float = 2.0):
    params = hv.init_params(cfg, seed=seed)
    X, Y = hv.sample_inputs(cfg, seed=seed + 1, input_norm=input_norm)
    return params, X, Y


def _reference_terms(cfg, params, X, Y, names) -> dict[str, torch.Tensor]:
    """``full`` by ``jacrev`` of ``grad`` (reverse over reverse), ``outer`` from autograd's ``J``."""
    theta = reference.flatten(cfg, params, names)
    full = torch.func.jacrev(torch.func.grad(reference.loss_of_theta(cfg, params, X, Y, names)))(theta)
    outer = reference.outer_hessian(cfg, params, X, Y, names)
    return {"full": full, "outer": outer, "functional": full - outer}


def _floor(ref: dict[str, torch.Tensor]) -> float:
    """Round-off of the reference: its functional term is ``full − outer``."""
    return 1e-13 * max(float(ref["full"].abs().max()), 1e-300)


def _assert_terms(res, ref, offsets, names, what: str) -> None:
    for term in TERMS:
        ours = res.term(term)
        for a, b in itertools.product(names, repeat=2):
            assert_close(
                ours[offsets[a], offsets[b]],
                ref[term][offsets[a], offsets[b]],
                RTOL,
                f"{what}: {term} block ({a}, {b})",
                atol=_floor(ref),
            )


def _id(cfg: hv.BlockConfig) -> str:
    return cfg.describe().replace(" ", "")


@pytest.mark.parametrize("cfg", tiered(CASES, fast=5), ids=_id)
def test_every_term_block_and_product_matches_autograd(cfg):
    params, X, Y = _setup(cfg)
    names = cfg.param_names
    ref = _reference_terms(cfg, params, X, Y, names)
    res = hv.hessian(cfg, params, X, Y)
    assert res.names == names
    _assert_terms(res, ref, cfg.offsets(names), names, cfg.describe())
    V = torch.randn(res.size, 2, dtype=F64, generator=torch.Generator().manual_seed(1))
    for term in TERMS:
        fresh = hv.hessian(cfg, params, X, Y)  # the product engine, nothing dense
        assert_close(
            fresh.matvec(V, term),
            ref[term] @ V,
            RTOL,
            f"{term} products",
            atol=_floor(ref) * float(V.abs().sum(0).max()),
        )
    assert_close(hv.forward(cfg, params, X), reference.torch_forward(cfg, params, X), 1e-12, "forward")


@pytest.mark.parametrize("cfg", CASES[::6], ids=_id)
def test_jacobian_and_gradient_match_autograd(cfg):
    params, X, Y = _setup(cfg, seed=3)
    assert_close(
        hv.jacobian(cfg, params, X),
        hv.jacobian(cfg, params, X, method="autograd"),
        RTOL,
        "Jacobian",
        atol=1e-15,
    )
    ours, theirs = hv.gradient(cfg, params, X, Y), hv.gradient(cfg, params, X, Y, method="autograd")
    scale = max(float(t.abs().max()) for t in theirs.values())
    for name in cfg.param_names:
        assert ours[name].shape == cfg.param_shapes[name]
        assert_close(ours[name], theirs[name], RTOL, f"gradient {name}", atol=1e-14 * scale)


def _slices(cfg: hv.BlockConfig, rng: random.Random) -> tuple[str, ...]:
    """A random mix of whole names and head slices (key/value slices up to ``n_kv_heads``)."""
    wrt: list[str] = []
    for name in cfg.param_names:
        draw = rng.random()
        if cfg.is_headed(name) and draw < 0.6:
            heads = cfg.head_names(name)
            wrt += rng.sample(heads, rng.randint(1, len(heads)))
        elif draw < 0.7:
            wrt.append(name)
    return tuple(rng.sample(wrt, len(wrt))) or cfg.param_names[:1]


SLICED = tiered([c for c in CASES if c.n_heads > 1 and c.seq_len > 1][:6], fast=2)


@pytest.mark.parametrize("cfg", SLICED, ids=_id)
def test_head_slices_in_wrt_and_block(cfg):
    """Head slices, ``W_K[g]`` with ``g < n_kv_heads`` among them: in ``wrt`` and alone in ``block``."""
    params, X, Y = _setup(cfg, seed=5)
    rng = random.Random(cfg.seq_len * 31 + cfg.d_model)
    wrt = _slices(cfg, rng)
    res = hv.hessian(cfg, params, X, Y, wrt=wrt)
    names = cfg.sort_names(wrt)
    assert res.names == names
    ref = _reference_terms(cfg, params, X, Y, names)
    _assert_terms(res, ref, cfg.offsets(names), names, f"{cfg.describe()}, wrt={names}")
    offsets = cfg.offsets(names)
    fresh = hv.hessian(cfg, params, X, Y, wrt=wrt)
    for a, b in rng.sample(list(itertools.product(names, repeat=2)), min(6, len(names) ** 2)):
        for term in ("full", "functional"):
            assert_close(
                fresh.block(a, b, term),
                ref[term][offsets[a], offsets[b]],
                RTOL,
                f"block({a}, {b}, {term})",
                atol=_floor(ref),
            )


def test_a_shared_key_value_head_collects_its_query_heads():
    """Under GQA the block of ``W_K[g]`` is the sum over the query heads that read it: with a
    single key/value head (multi-query) its slice is the whole ``W_K``, and the slice of a kv head
    of a 4-over-2 block equals the whole Hessian's entries at its columns."""
    cfg = hv.BlockConfig(
        seq_len=4,
        d_model=5,
        d_k=2,
        d_ff=3,
        n_heads=4,
        n_kv_heads=2,
        out_proj=True,
        rope=True,
        causal=True,
        norm="pre",
        norm_type="rmsnorm",
        ln_affine=True,
    )
    params, X, Y = _setup(cfg, seed=2)
    assert cfg.shape_of("W_K[1]") == (5, 2) and cfg.shape_of("W_Q[3]") == (5, 2)
    assert cfg.head_names("W_V") == ("W_V[0]", "W_V[1]")
    whole = hv.hessian(cfg, params, X, Y)
    off = cfg.offsets()
    cols = off["W_K"].start + cfg.head_indices("W_K[1]")
    expected = whole.full[cols][:, cols]
    assert_close(hv.hessian(cfg, params, X, Y, wrt=("W_K[1]",)).full, expected, 1e-12, "W_K[1] slice")
    mqa = hv.BlockConfig(**{**cfg.values(), "n_kv_heads": 1})
    p1, X1, Y1 = _setup(mqa, seed=2)
    one = hv.hessian(mqa, p1, X1, Y1, wrt=("W_K[0]",)).full
    assert_close(one, hv.hessian(mqa, p1, X1, Y1, wrt=("W_K",)).full, 1e-14, "W_K[0] = W_K under MQA")


def test_rope_makes_the_key_bias_act():
    """Without rotary positions ``b_K`` shifts a whole score row (its Hessian is exactly zero); with
    them ``rot_r(b_K)`` changes with ``r`` and its block is not zero, and matches autograd."""
    base = dict(seq_len=4, d_model=4, d_k=2, d_ff=3, n_heads=2, out_proj=True, bias=True, norm="attention")
    for rope in (False, True):
        cfg = hv.BlockConfig(**base, rope=rope)
        params, X, Y = _setup(cfg, seed=4)
        block = hv.hessian(cfg, params, X, Y, wrt=("b_K",)).full
        if rope:
            ref = _reference_terms(cfg, params, X, Y, ("b_K",))["full"]
            assert float(block.abs().max()) > 1e-6
            assert_close(block, ref, RTOL, "b_K block with rope", atol=_floor({"full": ref}))
        else:
            assert float(block.abs().max()) == 0.0


def test_stack_with_every_new_field():
    cfg = hv.BlockConfig(
        seq_len=3,
        d_model=4,
        d_k=2,
        d_ff=3,
        n_heads=2,
        n_kv_heads=1,
        out_proj=True,
        rope=True,
        qk_norm=True,
        bias=("Q", "K", "V"),
        causal=True,
        norm="pre",
        norm_type="rmsnorm",
        ln_affine=True,
        mlp="gated",
        activation="silu",
        n_layers=2,
        ln_eps=1e-6,
    )
    params, X, Y = _setup(cfg, seed=7)
    names = cfg.param_names
    assert names[:6] == ("l0.ln1_gamma", "l0.W_Q", "l0.b_Q", "l0.q_norm_gamma", "l0.W_K", "l0.b_K")
    ref = _reference_terms(cfg, params, X, Y, names)
    res = hv.hessian(cfg, params, X, Y)
    _assert_terms(res, ref, cfg.offsets(names), names, "stack")
    wrt = ("l1.W_K[0]", "l0.W_Q[1]", "l0.k_norm_gamma")
    sub = hv.hessian(cfg, params, X, Y, wrt=wrt)
    idx = torch.cat([cfg.offsets()[parse_name(n).base].start + cfg.head_indices(n) for n in sub.names])
    assert_close(sub.full, ref["full"][idx][:, idx], RTOL, "stack slices", atol=_floor(ref))
    V = torch.randn(sub.size, 3, dtype=F64, generator=torch.Generator().manual_seed(2))
    assert_close(
        hv.hessian(cfg, params, X, Y, wrt=wrt).matvec(V),
        ref["full"][idx][:, idx] @ V,
        RTOL,
        "stack slice products",
        atol=_floor(ref) * float(V.abs().sum(0).max()),
    )


def test_block_and_linear_operators_of_shared_and_rotated_heads():
    """``block_operator`` between a shared key/value head's slice ``W_K[1]`` and ``q_norm_gamma`` (and
    ``W_V[0]``, ``W_O[3]``), and ``linear_operator``, in a GQA + RoPE + QK-norm block, against the
    reverse-over-reverse terms."""
    np = pytest.importorskip("numpy")
    cfg = hv.BlockConfig(
        seq_len=3,
        d_model=4,
        d_k=2,
        d_ff=3,
        n_heads=4,
        n_kv_heads=2,
        out_proj=True,
        rope=True,
        qk_norm=True,
        bias=True,
        norm="pre",
        norm_type="rmsnorm",
        ln_affine=True,
        causal=True,
        ln_eps=1e-6,
    )
    params, X, Y = _setup(cfg, seed=11)
    names = cfg.param_names
    ref = _reference_terms(cfg, params, X, Y, names)
    res = hv.hessian(cfg, params, X, Y)
    off = cfg.offsets(names)
    idx = lambda n: off[parse_name(n).base].start + cfg.head_indices(n)  # noqa: E731
    gen = torch.Generator().manual_seed(4)
    for term in TERMS:
        for a, b in (("W_K[1]", "q_norm_gamma"), ("W_V[0]", "W_O[3]")):
            dense = ref[term][idx(a)][:, idx(b)].numpy()
            op = res.block_operator(a, b, term)
            x = torch.randn(dense.shape[1], 2, dtype=F64, generator=gen).numpy()
            y = torch.randn(dense.shape[0], dtype=F64, generator=gen).numpy()
            np.testing.assert_allclose(op @ x, dense @ x, rtol=0, atol=1e-12)
            np.testing.assert_allclose(op.rmatvec(y), dense.T @ y, rtol=0, atol=1e-12)
        v = torch.randn(res.size, dtype=F64, generator=gen).numpy()
        np.testing.assert_allclose(res.linear_operator(term) @ v, ref[term].numpy() @ v, rtol=0, atol=1e-12)


def test_defaults_keep_the_earlier_blocks():
    """The new fields at their defaults change no name, shape or number."""
    cfg = hv.BlockConfig(
        seq_len=3, d_model=4, d_k=2, d_ff=3, n_heads=2, out_proj=True, bias=True, ln_affine=True, norm="pre"
    )
    assert cfg.param_names == (
        "ln1_gamma",
        "ln1_beta",
        "W_Q",
        "b_Q",
        "W_K",
        "b_K",
        "W_V",
        "b_V",
        "W_O",
        "b_O",
        "ln2_gamma",
        "ln2_beta",
        "W_1",
        "b_1",
        "W_2",
        "b_2",
    )
    assert cfg.kv_heads == 2 and cfg.rotary_width == 0
    explicit = hv.BlockConfig(**{**cfg.values(), "n_kv_heads": 2})
    params, X, Y = _setup(cfg)
    assert torch.equal(hv.hessian(cfg, params, X, Y).full, hv.hessian(explicit, params, X, Y).full)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n_heads=4, out_proj=True, n_kv_heads=3), "n_kv_heads"),
        (dict(n_kv_heads=1), "n_kv_heads"),
        (dict(rope=True, rotary_dim=3, d_k=4), "rotary_dim"),
        (dict(rope=True, rotary_dim=6, d_k=4), "rotary_dim"),
        (dict(rope=True, d_k=3), "rotary_dim"),
        (dict(rotary_dim=2), "rotary_dim"),
        (dict(rope=True, rope_theta=0.0), "rope_theta"),
        (dict(rope=True, rope_theta=-1.0), "rope_theta"),
        (dict(n_kv_heads=0, out_proj=True), "n_kv_heads"),
    ],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        hv.BlockConfig(**{"d_k": 2, **kwargs})


def test_qk_norm_with_the_attention_alone_is_a_block():
    """QK-norm normalises q and k inside the attention, so it is defined for ``norm="attention"``
    too (no LayerNorm of the block is involved): allowed, and exact."""
    cfg = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, norm="attention", qk_norm=True)
    assert cfg.param_names == ("W_Q", "q_norm_gamma", "W_K", "k_norm_gamma", "W_V")
    params, X, Y = _setup(cfg, seed=1)
    ref = _reference_terms(cfg, params, X, Y, cfg.param_names)
    _assert_terms(hv.hessian(cfg, params, X, Y), ref, cfg.offsets(), cfg.param_names, "qk_norm alone")


def test_bad_head_slices_name_the_field():
    cfg = hv.BlockConfig(
        seq_len=3, d_model=4, d_k=2, d_ff=3, n_heads=4, n_kv_heads=2, out_proj=True, bias=True, qk_norm=True
    )
    params, X, Y = _setup(cfg)
    for bad in ("W_K[2]", "W_V[2]", "b_K[2]", "b_V[3]"):
        with pytest.raises(ValueError, match=r"n_kv_heads"):
            hv.hessian(cfg, params, X, Y, wrt=(bad,))
    with pytest.raises(ValueError, match=r"n_heads"):
        hv.hessian(cfg, params, X, Y, wrt=("W_Q[4]",))
    with pytest.raises(ValueError, match="q_norm_gamma"):
        hv.hessian(cfg, params, X, Y, wrt=("q_norm_gamma[0]",))
    hv.hessian(cfg, params, X, Y, wrt=("W_O[3]", "b_Q[3]", "W_K[1]"))  # the largest allowed


# ---- the forward pass against Hugging Face layers ---------------------------------------------

HF_TOL = 1e-6
"""float32 RMSNorm and rotary angles inside transformers: about 1e-7 relative."""


def _hf_run(layer, rope, X: torch.Tensor) -> torch.Tensor:
    L = X.shape[0]
    mask = torch.zeros(1, 1, L, L, dtype=F64).masked_fill(
        torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf")
    )
    pos = torch.arange(L)[None]
    with torch.no_grad():
        out = layer.eval()(
            X[None],
            attention_mask=mask,
            position_ids=pos,
            position_embeddings=rope.to(F64)(X[None], position_ids=pos),
        )
    return (out[0] if isinstance(out, tuple) else out)[0]


def _randomise(layer: torch.nn.Module) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_forward_matches_huggingface_llama_family(family):
    """Pre-RMSNorm, SwiGLU, RoPE, 4 query heads over 2 key/value heads; Qwen2's q, k, v biases;
    Qwen3's QK-norm with an explicit head_dim (d_k · H ≠ d)."""
    transformers = pytest.importorskip("transformers")
    import importlib

    m = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    prefix = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    L, d, H, G, hd, dff, theta, eps = 6, 16, 4, 2, 6, 24, 500.0, 1e-6
    config = getattr(transformers, f"{prefix}Config")(
        hidden_size=d,
        intermediate_size=dff,
        num_attention_heads=H,
        num_key_value_heads=G,
        head_dim=hd,
        rms_norm_eps=eps,
        max_position_embeddings=64,
        hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        attention_bias=family == "qwen2",
    )
    config._attn_implementation = "eager"
    layer = getattr(m, f"{prefix}DecoderLayer")(config, layer_idx=0).to(F64)
    _randomise(layer)
    cfg = hv.BlockConfig(
        seq_len=L,
        d_model=d,
        d_k=hd,
        d_ff=dff,
        n_heads=H,
        n_kv_heads=G,
        out_proj=True,
        norm="pre",
        norm_type="rmsnorm",
        ln_affine=True,
        mlp="gated",
        activation="silu",
        rope=True,
        rope_theta=theta,
        causal=True,
        ln_eps=eps,
        bias=("Q", "K", "V") if family == "qwen2" else False,
        qk_norm=family == "qwen3",
    )
    a, f = layer.self_attn, layer.mlp
    P = {
        "ln1_gamma": layer.input_layernorm.weight,
        "W_Q": a.q_proj.weight.T,
        "W_K": a.k_proj.weight.T,
        "W_V": a.v_proj.weight.T,
        "W_O": a.o_proj.weight.T,
        "W_G": f.gate_proj.weight.T,
        "ln2_gamma": layer.post_attention_layernorm.weight,
        "W_1": f.up_proj.weight.T,
        "W_2": f.down_proj.weight.T,
    }
    if family == "qwen2":
        P |= {"b_Q": a.q_proj.bias, "b_K": a.k_proj.bias, "b_V": a.v_proj.bias}
    if family == "qwen3":
        P |= {"q_norm_gamma": a.q_norm.weight, "k_norm_gamma": a.k_norm.weight}
    params = {n: P[n].detach().clone().contiguous() for n in cfg.param_names}
    X = torch.randn(L, d, dtype=F64, generator=torch.Generator().manual_seed(3))
    expected = _hf_run(layer, getattr(m, f"{prefix}RotaryEmbedding")(config), X)
    assert_close(hv.forward(cfg, params, X), expected, HF_TOL, f"{prefix}DecoderLayer")


@pytest.mark.parametrize("parallel", [True, False])
def test_forward_matches_huggingface_gpt_neox_layer(parallel):
    """Pythia: LayerNorm with γ/β, partial rotary (rotary_pct = 0.5), GELU, all biases, the packed
    ``query_key_value`` laid out per head as ``[q_h; k_h; v_h]``; parallel or sequential residual."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_neox import modeling_gpt_neox as m

    L, d, H, dff, pct, eps = 6, 16, 4, 24, 0.5, 1e-5
    hd = d // H
    config = transformers.GPTNeoXConfig(
        hidden_size=d,
        intermediate_size=dff,
        num_attention_heads=H,
        layer_norm_eps=eps,
        max_position_embeddings=64,
        hidden_act="gelu",
        use_parallel_residual=parallel,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": pct},
    )
    config._attn_implementation = "eager"
    layer = m.GPTNeoXLayer(config, layer_idx=0).to(F64)
    _randomise(layer)
    cfg = hv.BlockConfig(
        seq_len=L,
        d_model=d,
        d_k=hd,
        d_ff=dff,
        n_heads=H,
        out_proj=True,
        norm="parallel" if parallel else "pre",
        ln_affine=True,
        activation="gelu",
        bias=True,
        rope=True,
        rotary_dim=int(hd * pct),
        causal=True,
        ln_eps=eps,
    )
    a = layer.attention
    W, b = a.query_key_value.weight.view(H, 3, hd, d), a.query_key_value.bias.view(H, 3, hd)
    ln1, ln2, mlp = layer.input_layernorm, layer.post_attention_layernorm, layer.mlp
    P = {
        "ln1_gamma": ln1.weight,
        "ln1_beta": ln1.bias,
        "W_O": a.dense.weight.T,
        "b_O": a.dense.bias,
        "ln2_gamma": ln2.weight,
        "ln2_beta": ln2.bias,
        "W_1": mlp.dense_h_to_4h.weight.T,
        "b_1": mlp.dense_h_to_4h.bias,
        "W_2": mlp.dense_4h_to_h.weight.T,
        "b_2": mlp.dense_4h_to_h.bias,
    }
    for i, kind in enumerate("QKV"):
        P[f"W_{kind}"], P[f"b_{kind}"] = W[:, i].reshape(H * hd, d).T, b[:, i].reshape(-1)
    params = {n: P[n].detach().clone().contiguous() for n in cfg.param_names}
    X = torch.randn(L, d, dtype=F64, generator=torch.Generator().manual_seed(3))
    expected = _hf_run(layer, m.GPTNeoXRotaryEmbedding(config), X)
    assert_close(hv.forward(cfg, params, X), expected, HF_TOL, "GPTNeoXLayer")
