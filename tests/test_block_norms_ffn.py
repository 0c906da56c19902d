"""Part 3, the library side of the norms and the feed-forward (MODEL.md part 3): RMSNorm, the bias
tuple, the gated MLP (SwiGLU / GeGLU) and the parallel placement, in both engines.

Seeded random configurations over the new fields (``norm_type``, ``mlp``, ``bias`` tuples,
``norm="parallel"``) and part 2's (heads, ``W_O``, ``ln_affine``, causal mask, loss, ``ε``) against
``torch.func`` in float64: every term and block pair, head slices, ``res.block``, the products
(``matvec``), the Jacobian and the gradient, stacks; one reverse-over-reverse (``jacrev`` of
``grad``) check through an affine norm; the row rules of RMSNorm on a per-head view; the forward
pass against ``transformers``' ``LlamaMLP``, ``LlamaRMSNorm`` and (rotation switched off with
``cos = 1, sin = 0``) ``LlamaDecoderLayer`` and a parallel ``GPTNeoXLayer``, built from a config with
no download (their RMSNorm and their eager attention's softmax are float32 inside: ~1e-7 there);
and the bad inputs.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

import hessviz as hv
from hessviz import reference
from hessviz.block.terms import NAMES
from hessviz.ops import layernorm
from hessviz.ops.base import Along
from tests.cases import tiered
from tests.helpers import assert_close
from tests.test_block_real_layers import assert_blocks_close

F64 = torch.float64
RTOL = 1e-10
BIASES = (False, True, ("Q", "K", "V"), ("V", "1"), ("O", "G", "2"), ("G",), ("K", "2"))


def _draw(rng: random.Random, **fixed) -> hv.BlockConfig:
    """One random block over part 3's norm and feed-forward fields and part 2's fields."""
    norm = fixed.pop("norm", None) or rng.choice(("parallel", "pre", "post", "none", "attention"))
    mlp = "plain" if norm == "attention" else rng.choice(("plain", "gated", "gated"))
    H = rng.choice((1, 2, 3))
    wo = H > 1 or rng.random() < 0.5
    bias = rng.choice(BIASES)
    if isinstance(bias, tuple):  # only the projections the block has
        bias = (
            tuple(
                b
                for b in bias
                if (b != "O" or wo)
                and (b != "G" or mlp == "gated")
                and (b not in "G12" or norm != "attention")
            )
            or False
        )
    has_norm = norm in ("parallel", "pre", "post")
    kw = dict(
        seq_len=rng.randint(1, 4),
        d_model=rng.choice((3, 4, 5)),
        d_k=rng.randint(1, 2),
        d_ff=rng.randint(2, 4),
        norm=norm,
        activation=rng.choice(hv.block.config.ACTIVATIONS),
        loss=rng.choice(hv.block.config.LOSSES),
        n_heads=H,
        out_proj=wo,
        bias=bias,
        ln_affine=has_norm and rng.random() < 0.7,
        causal=rng.random() < 0.5,
        norm_type=rng.choice(("layernorm", "rmsnorm")) if has_norm else "layernorm",
        mlp=mlp,
        ln_eps=rng.choice((0.0, 1e-3)),
    )
    return hv.BlockConfig(**(kw | fixed))


def _cases(n: int, seed: int, **fixed) -> list[hv.BlockConfig]:
    rng = random.Random(seed)
    return [_draw(rng, **dict(fixed)) for _ in range(n)]


# every placement with each new field at least once in the fast tier
CASES = _cases(30, 18)
PARALLEL = _cases(10, 180, norm="parallel")
STACKS = _cases(6, 1800, n_layers=2, seq_len=3)


def _setup(cfg: hv.BlockConfig, seed: int = 0, input_norm: float = 2.0):
    params = hv.init_params(cfg, seed=seed)
    X, Y = hv.sample_inputs(cfg, seed=seed + 1, input_norm=input_norm)
    return params, X, Y


def _id(cfg: hv.BlockConfig) -> str:
    return cfg.describe().replace(" ", "")


def _assert_products(res: hv.HessianResult, ref: hv.HessianResult, what: str, k: int = 3) -> None:
    V = torch.randn(res.size, k, dtype=F64, generator=torch.Generator().manual_seed(res.size))
    floor = 1e-13 * float(ref.full.abs().max())
    for term in NAMES:
        assert_close(res.matvec(V, term), ref.term(term) @ V, RTOL, f"{what}: {term} H V", atol=floor)


# ----------------------------------------------------------------- every term, block and product


def test_the_random_lists_draw_every_new_field():
    every = CASES + PARALLEL + STACKS
    assert {c.norm for c in every} >= {"parallel", "pre", "post", "none", "attention"}
    assert {c.norm_type for c in every if c.uses_layernorm} == {"layernorm", "rmsnorm"}
    assert {c.mlp for c in every} == {"plain", "gated"}
    assert {c.activation for c in every if c.mlp == "gated"} >= {"silu", "gelu_tanh", "relu"}
    assert any(isinstance(c.bias, tuple) for c in every) and any(c.bias is True for c in every)
    assert any(c.norm == "parallel" and c.ln_affine and c.norm_type == "rmsnorm" for c in every)


@pytest.mark.parametrize("cfg", tiered(CASES + PARALLEL, fast=8), ids=_id)
def test_every_term_block_and_product_matches_autograd(cfg):
    params, X, Y = _setup(cfg)
    res = hv.hessian(cfg, params, X, Y)
    ref = hv.hessian(cfg, params, X, Y, method="autograd")
    assert res.names == cfg.param_names
    assert_blocks_close(res, ref, cfg.describe())
    _assert_products(res, ref, cfg.describe())


@pytest.mark.parametrize("cfg", tiered(STACKS, fast=2), ids=_id)
def test_stacks_match_autograd(cfg):
    params, X, Y = _setup(cfg, seed=2)
    res = hv.hessian(cfg, params, X, Y)
    ref = hv.hessian(cfg, params, X, Y, method="autograd")
    assert_blocks_close(res, ref, cfg.describe())
    _assert_products(res, ref, cfg.describe(), k=2)


@pytest.mark.parametrize("cfg", (CASES + PARALLEL)[::5], ids=_id)
def test_forward_jacobian_and_gradient_match_autograd(cfg):
    params, X, Y = _setup(cfg, seed=3)
    assert_close(hv.forward(cfg, params, X), reference.torch_forward(cfg, params, X), 1e-12, "forward")
    assert_close(
        hv.jacobian(cfg, params, X),
        hv.jacobian(cfg, params, X, method="autograd"),
        RTOL,
        "Jacobian",
        atol=1e-15,
    )
    ours, theirs = hv.gradient(cfg, params, X, Y), hv.gradient(cfg, params, X, Y, method="autograd")
    scale = max(float(t.abs().max()) for t in theirs.values())  # b_K's gradient: 0 up to round-off
    for name in cfg.param_names:
        assert_close(ours[name], theirs[name], RTOL, f"gradient {name}", atol=1e-14 * scale)


SLICED = [
    hv.BlockConfig(
        seq_len=3,
        d_model=4,
        d_k=2,
        d_ff=3,
        n_heads=3,
        out_proj=True,
        bias=True,
        ln_affine=True,
        norm="parallel",
        mlp="gated",
        activation="silu",
        ln_eps=1e-3,
    ),
    hv.BlockConfig(
        seq_len=3,
        d_model=5,
        d_k=1,
        d_ff=4,
        n_heads=2,
        out_proj=True,
        bias=("Q", "V", "G"),
        ln_affine=True,
        norm="pre",
        norm_type="rmsnorm",
        mlp="gated",
        activation="gelu_tanh",
        causal=True,
        loss="ce",
    ),
]


@pytest.mark.parametrize("cfg", SLICED, ids=_id)
def test_head_slices_and_blocks_alone(cfg):
    """Head slices beside the new weights in ``wrt``; every block of two names computed alone."""
    params, X, Y = _setup(cfg, seed=5)
    rng = random.Random(cfg.d_model)
    headed = [n for n in cfg.param_names if n in hv.block.config.HEADED]
    wrt = tuple(
        rng.sample([s for n in headed for s in cfg.head_names(n)], 4)
        + [n for n in cfg.param_names if n not in hv.block.config.HEADED and rng.random() < 0.7]
    )
    res = hv.hessian(cfg, params, X, Y, wrt=wrt)
    ref = hv.hessian(cfg, params, X, Y, wrt=wrt, method="autograd")
    assert res.names == cfg.sort_names(wrt)
    assert_blocks_close(res, ref, f"{cfg.describe()}, wrt={res.names}")
    _assert_products(res, ref, "slices")
    fresh = hv.hessian(cfg, params, X, Y, wrt=wrt)
    floor = 1e-13 * float(ref.full.abs().max())
    for a, b in rng.sample(list(itertools.product(res.names, repeat=2)), 10):
        for term in NAMES:
            assert_close(
                fresh.block(a, b, term),
                ref.term(term)[ref.offsets[a], ref.offsets[b]],
                RTOL,
                f"block({a}, {b}, {term})",
                atol=floor,
            )


def test_block_and_linear_operators_of_the_new_weights():
    """``block_operator`` between a head slice and the gate, and ``linear_operator``, in a parallel
    RMSNorm block: the products against the autograd terms."""
    np = pytest.importorskip("numpy")
    cfg = hv.BlockConfig(
        seq_len=3,
        d_model=4,
        d_k=2,
        d_ff=3,
        n_heads=2,
        out_proj=True,
        bias=("Q", "G"),
        ln_affine=True,
        norm="parallel",
        norm_type="rmsnorm",
        mlp="gated",
        activation="silu",
        causal=True,
        ln_eps=1e-6,
    )
    params, X, Y = _setup(cfg, seed=11)
    res = hv.hessian(cfg, params, X, Y)
    ref = hv.hessian(cfg, params, X, Y, method="autograd")
    off = res.offsets
    rows = off["W_K"].start + cfg.head_indices("W_K[1]")
    gen = torch.Generator().manual_seed(4)
    for term in NAMES:
        dense = ref.term(term)[rows][:, off["W_G"]].numpy()
        op = res.block_operator("W_K[1]", "W_G", term)
        x = torch.randn(dense.shape[1], 2, dtype=F64, generator=gen).numpy()
        y = torch.randn(dense.shape[0], dtype=F64, generator=gen).numpy()
        np.testing.assert_allclose(op @ x, dense @ x, rtol=0, atol=1e-12)
        np.testing.assert_allclose(op.rmatvec(y), dense.T @ y, rtol=0, atol=1e-12)
        v = torch.randn(res.size, dtype=F64, generator=gen).numpy()
        full = ref.term(term).numpy()
        np.testing.assert_allclose(res.linear_operator(term) @ v, full @ v, rtol=0, atol=1e-12)


def test_parallel_cross_terms_against_reverse_over_reverse():
    """The parallel block's branch ``FFN(ln2(X))`` against the attention and ``ln1``: the full term
    against ``jacrev(grad)`` (no forward-over-reverse through any norm)."""
    cfg = SLICED[0]
    params, X, Y = _setup(cfg, seed=7)
    names = cfg.param_names
    f = reference.loss_of_theta(cfg, params, X, Y, names)
    theta = reference.flatten(cfg, params, names)
    H = torch.func.jacrev(torch.func.grad(f))(theta)
    res = hv.hessian(cfg, params, X, Y)
    assert_close(res.full, H, RTOL, "full vs reverse-over-reverse", atol=1e-13 * float(H.abs().max()))
    branch = res.offsets["ln2_gamma"].start  # ln2 and the FFN: the branch B(X)
    assert float(res.functional[:branch, branch:].abs().max()) <= 1e-14 * float(H.abs().max()), (
        "the branch and the attention share no second derivative of Z in one block"
    )
    assert float(res.outer[:branch, branch:].abs().max()) > 1e-6, "they meet through the loss curvature"


# ----------------------------------------------------------------- RMSNorm's row rules


def test_rmsnorm_rules_match_autograd_on_rows():
    """``value``, ``jacobian``, ``contract_hessian`` with ``centre=False`` on rows of any leading
    shape, against ``torch.func`` on ``z / √(mean(z²) + ε)``."""
    gen = torch.Generator().manual_seed(0)
    z, g = torch.randn(2, 3, 5, dtype=F64, generator=gen), torch.randn(2, 3, 5, dtype=F64, generator=gen)
    for eps in (0.0, 0.1):

        def rms(row, eps=eps):
            return row / torch.sqrt((row * row).mean() + eps)

        y, st = layernorm.value(z, eps, centre=False)
        rows, grows = z.reshape(-1, 5), g.reshape(-1, 5)
        assert_close(y.reshape(-1, 5), torch.stack([rms(r) for r in rows]), 1e-14, "RMSNorm value")
        J = torch.stack([torch.func.jacrev(rms)(r) for r in rows])
        assert_close(layernorm.jacobian(st).reshape(-1, 5, 5), J, 1e-13, "RMSNorm Jacobian")
        assert_close(layernorm.vjp(st, g).reshape(-1, 5), torch.einsum("rij,ri->rj", J, grows), 1e-13, "vjp")
        Q = torch.stack(
            [torch.func.hessian(lambda r, w=w: (w * rms(r)).sum())(r) for r, w in zip(rows, grows)]
        )
        assert_close(layernorm.contract_hessian(st, g).reshape(-1, 5, 5), Q, 1e-12, "RMSNorm Q(g)")
        M = torch.randn(2, 3, 5, 4, dtype=F64, generator=gen)
        assert_close(layernorm.apply_jacobian(st, M), layernorm.jacobian(st) @ M, 1e-13, "J M")


def test_rmsnorm_node_on_a_per_head_view_with_a_shared_gamma():
    """The node on the ``(L·H, d_k)`` view of ``(L, H·d_k)`` with one ``γ (d_k,)`` for every head (the
    way a per-head ``qk_norm`` uses it): gradient and Hessian-vector products of a quadratic
    read-out against autograd."""
    L, H, dk = 3, 2, 4
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(L, H * dk, dtype=F64, generator=gen)
    gamma = 1 + 0.1 * torch.randn(dk, dtype=F64, generator=gen)
    C = torch.randn(L, H * dk, dtype=F64, generator=gen)

    def loss(q, gamma):  # ½‖C ⊙ RMS(q)‖², per head
        rows = q.reshape(L * H, dk)
        y = gamma * rows / torch.sqrt((rows * rows).mean(-1, keepdim=True) + 1e-3)
        return 0.5 * ((C * y.reshape(L, H * dk)) ** 2).sum()

    node = layernorm.RMSNorm("y", "q", q.reshape(L * H, dk), 1e-3, ("g", gamma), where="q")
    gy = (C * C * node.y.reshape(L, H * dk)).reshape(L * H, dk)
    (gq,), (gg,) = node.adjoint(gy)
    ref_q, ref_g = torch.func.grad(loss, argnums=(0, 1))(q, gamma)
    assert_close(gq.reshape(L, H * dk), ref_q, 1e-13, "∂/∂q")
    assert_close(gg, ref_g, 1e-13, "∂/∂γ shared by the heads")
    dq, dg = torch.randn(2, L, H * dk, dtype=F64, generator=gen), torch.randn(2, dk, dtype=F64, generator=gen)
    dy = node.tangent([dq.reshape(2, L * H, dk)], [dg])
    dgy = (C * C).reshape(L * H, dk) * dy  # the read-out's curvature along ẏ
    (dgq,), (dgg,) = node.adjoint_tangent(Along(dgy, [dq.reshape(2, L * H, dk)], [dg]))
    for k in range(2):
        hq, hg = torch.func.jvp(
            lambda a, b: torch.func.grad(loss, argnums=(0, 1))(a, b), (q, gamma), (dq[k], dg[k])
        )[1]
        assert_close(dgq[k].reshape(L, H * dk), hq, 1e-12, "H v in q")
        assert_close(dgg[k], hg, 1e-12, "H v in γ")


# ----------------------------------------------------------------- against transformers


def _load(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in weights.items():
            module.get_parameter(name).copy_(value)


def test_gated_mlp_and_rmsnorm_match_llama_modules():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    from hessviz.ops.activations import ACTIVATIONS
    from hessviz.ops.gated import GatedFeedForward

    cfg = hv.BlockConfig(
        seq_len=5,
        d_model=6,
        d_ff=7,
        norm="pre",
        norm_type="rmsnorm",
        ln_affine=True,
        mlp="gated",
        activation="silu",
        bias=("G", "1", "2"),
        ln_eps=1e-6,
    )
    p, X, _ = _setup(cfg, seed=8)
    config = transformers.LlamaConfig(
        hidden_size=6,
        intermediate_size=7,
        num_attention_heads=2,
        head_dim=3,
        hidden_act="silu",
        mlp_bias=True,
        rms_norm_eps=1e-6,
    )
    mlp = LlamaMLP(config).to(F64)
    _load(
        mlp,
        {
            "gate_proj.weight": p["W_G"].T,
            "gate_proj.bias": p["b_G"],
            "up_proj.weight": p["W_1"].T,
            "up_proj.bias": p["b_1"],
            "down_proj.weight": p["W_2"].T,
            "down_proj.bias": p["b_2"],
        },
    )
    ours = GatedFeedForward(
        X, p["W_1"], p["W_2"], ACTIVATIONS["silu"], p["b_1"], p["b_2"], W_G=p["W_G"], b_G=p["b_G"]
    )
    with torch.no_grad():
        assert_close(ours.output, mlp(X), 1e-12, "gated FFN vs LlamaMLP")
    norm = LlamaRMSNorm(6, eps=1e-6).to(F64)
    _load(norm, {"weight": p["ln1_gamma"]})
    n, _ = layernorm.value(X, 1e-6, centre=False)
    with torch.no_grad():  # transformers' RMSNorm is float32 inside
        assert_close(n * p["ln1_gamma"], norm(X), 1e-6, "RMSNorm vs LlamaRMSNorm")


def _no_rotation(L: int, dk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin) = (1, 0)``: rotary positions switched off (they are part 3's attention, not here)."""
    return torch.ones(1, L, dk, dtype=F64), torch.zeros(1, L, dk, dtype=F64)


def _causal_mask(L: int) -> torch.Tensor:
    return torch.full((L, L), -math.inf, dtype=F64).triu(1)[None, None]


@pytest.mark.slow
def test_pre_rmsnorm_swiglu_block_matches_llama_decoder_layer():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    cfg = hv.BlockConfig(
        seq_len=5,
        d_model=8,
        d_k=4,
        d_ff=12,
        n_heads=2,
        out_proj=True,
        norm="pre",
        norm_type="rmsnorm",
        ln_affine=True,
        mlp="gated",
        activation="silu",
        causal=True,
        ln_eps=1e-6,
    )
    p, X, _ = _setup(cfg, seed=9, input_norm=4.0)
    config = transformers.LlamaConfig(
        hidden_size=8,
        intermediate_size=12,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=4,
        hidden_act="silu",
        rms_norm_eps=1e-6,
    )
    config._attn_implementation = "eager"
    layer = LlamaDecoderLayer(config, layer_idx=0).to(F64).eval()
    _load(
        layer,
        {
            "input_layernorm.weight": p["ln1_gamma"],
            "post_attention_layernorm.weight": p["ln2_gamma"],
            "self_attn.q_proj.weight": p["W_Q"].T,
            "self_attn.k_proj.weight": p["W_K"].T,
            "self_attn.v_proj.weight": p["W_V"].T,
            "self_attn.o_proj.weight": p["W_O"].T,
            "mlp.gate_proj.weight": p["W_G"].T,
            "mlp.up_proj.weight": p["W_1"].T,
            "mlp.down_proj.weight": p["W_2"].T,
        },
    )
    with torch.no_grad():
        out = layer(X[None], attention_mask=_causal_mask(5), position_embeddings=_no_rotation(5, 4))
    out = (out[0] if isinstance(out, tuple) else out)[0]
    assert_close(hv.forward(cfg, p, X), out, 1e-6, "block vs LlamaDecoderLayer (float32 RMSNorm, softmax)")


@pytest.mark.slow
def test_parallel_block_matches_gpt_neox_layer():
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXLayer

    H, dk, d = 2, 3, 6
    cfg = hv.BlockConfig(
        seq_len=4,
        d_model=d,
        d_k=dk,
        d_ff=10,
        n_heads=H,
        out_proj=True,
        norm="parallel",
        ln_affine=True,
        bias=True,
        activation="gelu",
        causal=True,
        ln_eps=1e-5,
    )
    p, X, _ = _setup(cfg, seed=10, input_norm=3.0)
    config = transformers.GPTNeoXConfig(
        hidden_size=d,
        num_attention_heads=H,
        intermediate_size=10,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        use_parallel_residual=True,
        rotary_pct=1.0,
        attention_bias=True,
    )
    config._attn_implementation = "eager"
    layer = GPTNeoXLayer(config, layer_idx=0).to(F64).eval()
    per_head = lambda w: w.reshape(*w.shape[:-1], H, dk)  # noqa: E731 (columns by head)
    qkv_w = torch.stack([per_head(p["W_Q"]), per_head(p["W_K"]), per_head(p["W_V"])], -2)  # (d, H, 3, dk)
    qkv_b = torch.stack([per_head(p["b_Q"]), per_head(p["b_K"]), per_head(p["b_V"])], -2)
    _load(
        layer,
        {
            "input_layernorm.weight": p["ln1_gamma"],
            "input_layernorm.bias": p["ln1_beta"],
            "post_attention_layernorm.weight": p["ln2_gamma"],
            "post_attention_layernorm.bias": p["ln2_beta"],
            "attention.query_key_value.weight": qkv_w.reshape(d, -1).T,
            "attention.query_key_value.bias": qkv_b.reshape(-1),
            "attention.dense.weight": p["W_O"].T,
            "attention.dense.bias": p["b_O"],
            "mlp.dense_h_to_4h.weight": p["W_1"].T,
            "mlp.dense_h_to_4h.bias": p["b_1"],
            "mlp.dense_4h_to_h.weight": p["W_2"].T,
            "mlp.dense_4h_to_h.bias": p["b_2"],
        },
    )
    with torch.no_grad():
        out = layer(X[None], attention_mask=_causal_mask(4), position_embeddings=_no_rotation(4, dk))
    out = (out[0] if isinstance(out, tuple) else out)[0]
    assert_close(hv.forward(cfg, p, X), out, 1e-6, "parallel block vs GPTNeoXLayer (float32 softmax)")


# ----------------------------------------------------------------- names, defaults and bad input


def test_names_and_theta_order():
    base = dict(seq_len=3, d_model=4, d_k=2, d_ff=3, n_heads=2, out_proj=True, ln_affine=True)
    assert hv.BlockConfig(**base, norm="parallel", bias=True, mlp="gated").param_names == (
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
        "W_G",
        "b_G",
        "W_1",
        "b_1",
        "W_2",
        "b_2",
    )
    assert hv.BlockConfig(**base, norm="post", norm_type="rmsnorm", bias=("Q", "K", "V")).param_names == (
        "W_Q",
        "b_Q",
        "W_K",
        "b_K",
        "W_V",
        "b_V",
        "W_O",
        "ln1_gamma",
        "W_1",
        "W_2",
        "ln2_gamma",
    )
    gated = hv.BlockConfig(**base, norm="pre", mlp="gated")
    assert gated.param_shapes["W_G"] == (4, 3) and gated.shape_of("W_G") == (4, 3)
    # defaults and bias=True keep part 2's blocks, names and numbers exactly
    for norm in ("post", "pre", "none", "attention"):
        old = hv.BlockConfig(**(base | {"ln_affine": norm in ("post", "pre")}), norm=norm, bias=True)
        spelled = hv.BlockConfig(
            **(base | {"ln_affine": norm in ("post", "pre")}),
            norm=norm,
            bias=("Q", "K", "V", "O") + (("1", "2") if norm != "attention" else ()),
        )
        assert old.param_names == spelled.param_names
        assert "W_G" not in old.param_names and old.mlp == "plain" and old.norm_type == "layernorm"
    assert hv.BlockConfig(bias=("2", "Q")).bias == ("Q", "2") and hv.BlockConfig(bias=()).bias is False
    assert hv.BlockConfig(bias=["K"]).bias == ("K",)


def test_a_bias_tuple_reads_from_text():
    s = next(s for s in hv.block.config.BLOCK_SETTINGS if s.name == "bias")
    assert s.parse("Q,K,V") == ("Q", "K", "V") and s.parse("true") is True and s.format(("Q", "K")) == "Q,K"
    with pytest.raises(ValueError, match="bias"):
        s.parse("Q,X")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(bias=("O",)), "bias"),  # no W_O
        (dict(bias=("G",)), "bias"),  # no W_G (mlp="plain")
        (dict(bias=("G",), mlp="gated", norm="attention"), "mlp"),
        (dict(bias=("1",), norm="attention"), "bias"),
        (dict(bias=("q",)), "bias"),
        (dict(bias=("Q", "Q")), "bias"),
        (dict(bias="QKV"), "bias"),
        (dict(mlp="gated", d_ff=0), "d_ff"),
        (dict(mlp="glu"), "mlp"),
        (dict(norm_type="batchnorm"), "norm_type"),
        (dict(norm="paralel"), "norm"),
        (dict(norm="none", ln_affine=True, norm_type="rmsnorm"), "ln_affine"),
    ],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        hv.BlockConfig(**kwargs)


def test_an_all_zero_row_under_rmsnorm_without_eps_is_refused():
    cfg = hv.BlockConfig(seq_len=2, d_model=3, d_k=2, d_ff=2, norm="parallel", norm_type="rmsnorm")
    params = hv.init_params(cfg)
    X = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=F64)
    Y = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(ValueError, match="ln_eps = 0 but the ln1 input X has only zeros in row"):
        hv.hessian(cfg, params, X, Y)
    with pytest.raises(ValueError, match="RMSNorm is not differentiable"):
        hv.gradient(cfg, params, X, Y)


def test_the_command_line_takes_the_new_fields(tmp_path, capsys):
    import json

    from hessviz.cli import main

    out = tmp_path / "llama"
    assert (
        main(
            [
                "compute",
                "--norm",
                "parallel",
                "--norm-type",
                "rmsnorm",
                "--mlp",
                "gated",
                "--activation",
                "silu",
                "--bias",
                "Q,K,V",
                "--ln-affine",
                "-L",
                "3",
                "-d",
                "4",
                "--d-k",
                "2",
                "--d-ff",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["names"] == [
        "ln1_gamma",
        "W_Q",
        "b_Q",
        "W_K",
        "b_K",
        "W_V",
        "b_V",
        "ln2_gamma",
        "W_G",
        "W_1",
        "W_2",
    ]
    assert summary["config"]["bias"] == ["Q", "K", "V"]
    assert main(["compute", "--bias", "O", "-L", "2", "-d", "3", "--out", str(out)]) != 0  # no W_O
