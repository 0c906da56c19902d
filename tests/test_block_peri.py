"""The Peri-LN placement, ``norm="peri"`` (``MODEL.md`` part 5): ``Z1 = X + ln1_out(SA(ln1(X)))``,
``Z = Z1 + ln2_out(FFN(ln2(Z1)))``.

Each block — the paper block, a real layer (γ/β, biases, heads, ``W_O``) and a modern one (gated MLP,
RoPE, QK-norm, grouped key/value heads, causal), each with LayerNorm and with RMSNorm — against the
autograd reference in float64: ``full`` against reverse over reverse (``jacrev`` of ``grad``: no
forward-over-reverse through a norm), ``outer`` against ``Jᵀ ∇²ℓ J`` from ``jacrev``, ``functional``
against their difference; the forward pass, the Jacobian and the gradient; the matrix-free products
against the dense ``full``; a stack of two Peri-LN blocks. The reference forward
(:func:`hessviz.reference.torch_forward`) is written from ``F.layer_norm`` and the RMS formula, apart
from the recipe the engines read; one test checks it by hand against the contract's two lines.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import hessviz as hv
from hessviz import reference
from hessviz.block.config import parse_name
from hessviz.block.terms import NAMES
from hessviz.errors import InputError
from tests.helpers import assert_close

F64 = torch.float64
RTOL = 1e-11

PAPER = dict(seq_len=4, d_model=5, d_k=3, d_ff=6)
REAL = dict(
    seq_len=3,
    d_model=6,
    d_k=2,
    d_ff=4,
    n_heads=3,
    out_proj=True,
    bias=True,
    ln_affine=True,
    activation="gelu",
    loss="ce",
    ln_eps=1e-3,
)
MODERN = dict(
    seq_len=4,
    d_model=4,
    d_k=2,
    d_ff=3,
    n_heads=4,
    n_kv_heads=2,
    out_proj=True,
    mlp="gated",
    activation="gelu_tanh",
    rope=True,
    qk_norm=True,
    causal=True,
    ln_affine=True,
    bias=("Q", "K", "V"),
    ln_eps=1e-6,
)
BLOCKS = {"paper": PAPER, "real": REAL, "modern": MODERN}
CASES = [
    pytest.param(
        hv.BlockConfig(norm="peri", norm_type=nt, **fields),
        id=f"{kind}-{nt}",
    )
    for kind, fields in BLOCKS.items()
    for nt in ("layernorm", "rmsnorm")
]


def _setup(cfg: hv.BlockConfig, seed: int = 0, input_norm: float = 2.0):
    params = hv.init_params(cfg, seed=seed)
    X, Y = hv.sample_inputs(cfg, seed=seed + 1, input_norm=input_norm)
    return params, X, Y


def _references(cfg: hv.BlockConfig, params, X, Y) -> dict[str, torch.Tensor]:
    """The three terms from autograd: ``full`` by reverse over reverse, ``outer`` from ``jacrev``."""
    names = cfg.param_names
    full = reference.full_hessian_rr(cfg, params, X, Y, names)
    outer = reference.outer_hessian(cfg, params, X, Y, names)
    return {"full": full, "outer": outer, "functional": full - outer}


@pytest.mark.parametrize("cfg", CASES)
def test_every_term_product_and_first_order_matches_autograd(cfg):
    params, X, Y = _setup(cfg)
    res = hv.hessian(cfg, params, X, Y)
    ref = _references(cfg, params, X, Y)
    floor = 1e-14 * float(torch.linalg.norm(ref["full"]))  # the reference's functional is full − outer
    assert res.names == cfg.param_names
    for term in NAMES:
        assert_close(res.term(term), ref[term], RTOL, f"{cfg.describe()}: {term}", atol=floor)
        for a in res.names:  # a block row computed alone
            assert_close(
                hv.hessian(cfg, params, X, Y).block(a, res.names[0], term),
                ref[term][res.offsets[a], res.offsets[res.names[0]]],
                RTOL,
                f"block ({a}, {res.names[0]}) {term}",
                atol=floor,
            )
    V = torch.randn(res.size, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    for term in NAMES:
        assert_close(res.matvec(V, term), ref[term] @ V, RTOL, f"{term} H V", atol=floor)
    assert_close(hv.forward(cfg, params, X), reference.torch_forward(cfg, params, X), 1e-13, "forward")
    assert_close(
        hv.jacobian(cfg, params, X), reference.model_jacobian(cfg, params, X, cfg.param_names), RTOL, "J"
    )
    grads = hv.gradient(cfg, params, X, Y)
    want = reference.gradient(cfg, params, X, Y, cfg.param_names)
    for name, sl in cfg.offsets().items():
        assert_close(grads[name].reshape(-1), want[sl], RTOL, f"gradient {name}", atol=1e-15)


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_a_stack_of_two_peri_blocks_matches_autograd(norm_type):
    cfg = hv.BlockConfig(
        norm="peri", norm_type=norm_type, n_layers=2, seq_len=3, d_model=4, d_k=2, d_ff=3, ln_affine=True
    )
    params, X, Y = _setup(cfg, seed=2)
    res = hv.hessian(cfg, params, X, Y)
    ref = _references(cfg, params, X, Y)
    floor = 1e-14 * float(torch.linalg.norm(ref["full"]))
    assert res.names[0] == "l0.ln1_gamma" and res.names[-1] == "l1.ln2_out_" + (
        "beta" if norm_type == "layernorm" else "gamma"
    )
    for term in NAMES:
        assert_close(res.term(term), ref[term], RTOL, f"stack {term}", atol=floor)
    V = torch.randn(res.size, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    assert_close(res.matvec(V, "full"), ref["full"] @ V, RTOL, "stack H V", atol=floor)


def test_theta_names_and_order_are_the_contracts():
    attention = ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O")
    ffn = ("W_1", "b_1", "W_2", "b_2")
    ln = hv.BlockConfig(norm="peri", ln_affine=True, bias=True, out_proj=True)
    assert ln.param_names == (
        ("ln1_gamma", "ln1_beta")
        + attention
        + ("ln1_out_gamma", "ln1_out_beta", "ln2_gamma", "ln2_beta")
        + ffn
        + ("ln2_out_gamma", "ln2_out_beta")
    )
    rms = hv.BlockConfig(norm="peri", ln_affine=True, bias=True, out_proj=True, norm_type="rmsnorm")
    assert rms.param_names == ("ln1_gamma",) + attention + ("ln1_out_gamma", "ln2_gamma") + ffn + (
        "ln2_out_gamma",
    )
    paper = hv.BlockConfig(norm="peri")
    assert paper.param_names == ("W_Q", "W_K", "W_V", "W_1", "W_2") and paper.uses_layernorm
    assert ln.param_shapes["ln1_out_beta"] == (ln.d_model,) and ln.param_shapes["ln2_out_gamma"] == (
        ln.d_model,
    )
    stack = hv.BlockConfig(norm="peri", ln_affine=True, n_layers=2)
    assert stack.param_names[5:7] == ("l0.ln1_out_gamma", "l0.ln1_out_beta")
    params = hv.init_params(ln, seed=0)  # γ = 1 + noise, β = noise: every norm of the sandwich
    assert float((params["ln2_out_gamma"] - 1).abs().max()) < 0.5 and params["ln1_out_beta"].abs().max() < 0.5


def test_reference_forward_is_the_contracts_two_lines():
    """``torch_forward`` and ``hv.forward`` against the contract written out here by hand, with
    ``F.layer_norm``'s own weight and bias and two heads joined by ``W_O``."""
    cfg = hv.BlockConfig(norm="peri", ln_affine=True, bias=True, out_proj=True, n_heads=2, seq_len=5, d_k=3)
    params, X, _ = _setup(cfg, seed=4)
    p, L, H, dk = params, cfg.seq_len, cfg.n_heads, cfg.d_k

    def ln(z, which):
        return F.layer_norm(z, (z.shape[-1],), p[f"{which}_gamma"], p[f"{which}_beta"], eps=0.0)

    def sa(x):
        q, k, v = ((x @ p[f"W_{c}"] + p[f"b_{c}"]).reshape(L, H, dk).transpose(0, 1) for c in "QKV")
        heads = torch.softmax(q @ k.transpose(1, 2) / dk**0.5, -1) @ v
        return heads.transpose(0, 1).reshape(L, H * dk) @ p["W_O"] + p["b_O"]

    z1 = X + ln(sa(ln(X, "ln1")), "ln1_out")
    z = z1 + ln(torch.relu(ln(z1, "ln2") @ p["W_1"] + p["b_1"]) @ p["W_2"] + p["b_2"], "ln2_out")
    assert_close(reference.torch_forward(cfg, params, X), z, 1e-13, "Z of the contract")
    assert_close(hv.forward(cfg, params, X), z, 1e-13, "hv.forward")


def _every_path(cfg: hv.BlockConfig, params, X, Y) -> dict:
    """Each way to a number at this point: the closed form dense, by products (``H V``, the operator, a
    block by products), first order, and the autograd reference (forward, reverse over reverse, the
    autograd engine)."""
    V = torch.ones(sum(p.numel() for p in params.values()), 2, dtype=F64)
    names = cfg.param_names
    return {
        "forward": lambda: hv.forward(cfg, params, X),
        "dense": lambda: hv.hessian(cfg, params, X, Y).full,
        "H V": lambda: hv.hessian(cfg, params, X, Y).matvec(V),
        "operator": lambda: hv.hessian(cfg, params, X, Y).operator("functional") @ V,
        "gradient": lambda: hv.gradient(cfg, params, X, Y),
        "reference forward": lambda: reference.torch_forward(cfg, params, X),
        "reference full": lambda: reference.full_hessian_rr(cfg, params, X, Y, names),
        "reference outer": lambda: reference.outer_hessian(cfg, params, X, Y, names),
        "autograd engine": lambda: hv.hessian(cfg, params, X, Y, method="autograd").full,
    }


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_a_zero_sublayer_output_with_eps_zero_is_a_clear_error_naming_the_norm(norm_type):
    """ReLU without biases: ``W_1``'s columns ``−z₀ + c u``, with ``z₀`` the row 0 of ``ln2(Z1)`` and
    ``u ⟂ z₀``, make row 0 of ``FFN = ReLU(ln2(Z1) W_1) W_2`` exactly zero (its pre-activations are
    ``−‖z₀‖² < 0``) and not row 1 (``c`` makes its pre-activations positive). ``ln2_out`` then divides
    by ``σ = 0`` with ``ln_eps = 0``: every path (closed form dense and by products, the gradient, the
    autograd reference) raises an :class:`InputError`, a ``ValueError``, naming ``ln2_out`` and the
    zero rows, never a NaN; with ``ln_eps > 0`` the same point is finite everywhere."""
    cfg = hv.BlockConfig(norm="peri", norm_type=norm_type, seq_len=3, d_model=4, d_k=2, d_ff=3)
    params, X, Y = _setup(cfg)

    def ln(z):
        return {"layernorm": F.layer_norm, "rmsnorm": F.rms_norm}[norm_type](z, (z.shape[-1],))

    # the default ε of F.layer_norm and F.rms_norm moves z₀ by ~1e-6 relative: only signs matter below
    attention = hv.BlockConfig(norm="attention", seq_len=3, d_model=4, d_k=2, d_ff=3)
    sa = hv.forward(attention, {n: params[n] for n in attention.param_names}, ln(X))
    z = ln(X + ln(sa))
    u = z[1] - (z[1] @ z[0]) / (z[0] @ z[0]) * z[0]
    column = -z[0] + 2 * (abs(float(z[1] @ z[0])) + 1) / float(u @ u) * u
    params["W_1"] = column[:, None].expand(-1, cfg.d_ff).clone()
    pre_activation = ln(X + ln(sa)) @ params["W_1"]
    rows = torch.nonzero((pre_activation <= 0).all(-1)).flatten().tolist()  # FFN's zero rows
    assert rows[0] == 0 and 1 not in rows
    what = "zero variance" if norm_type == "layernorm" else "only zeros"
    for path, run in _every_path(cfg, params, X, Y).items():
        with pytest.raises(
            InputError, match=rf"the ln2_out input .*{what} in row\(s\) {re.escape(str(rows))}:"
        ) as err:
            run()
        assert "ln_eps = 0" in str(err.value), path
    assert issubclass(InputError, ValueError)
    eps = hv.BlockConfig(**{**cfg.values(), "ln_eps": 1e-5})
    for path, run in _every_path(eps, params, X, Y).items():
        out = run()
        values = out.values() if isinstance(out, dict) else [out]
        assert all(bool(torch.isfinite(v).all()) for v in values), path


def test_a_zero_attention_output_in_a_stack_names_the_layers_norm():
    """``W_V = 0`` in layer 1 makes that layer's attention output zero in every row: ``l1.ln1_out`` and
    rows 0, 1, 2, in the closed form and in the reference alike (GELU: no feed-forward row is zero)."""
    cfg = hv.BlockConfig(norm="peri", n_layers=2, seq_len=3, d_model=4, d_k=2, d_ff=3, activation="gelu")
    params, X, Y = _setup(cfg, seed=5)
    params["l1.W_V"] = torch.zeros_like(params["l1.W_V"])
    for run in _every_path(cfg, params, X, Y).values():
        with pytest.raises(InputError, match=r"the l1\.ln1_out input .* row\(s\) \[0, 1, 2\]"):
            run()


def test_describe_and_cli_offer_peri():
    from hessviz.block.config import NORMS, SETTINGS

    assert "peri" in NORMS and "peri" in next(s for s in SETTINGS if s.name == "norm").choices
    assert hv.BlockConfig(norm="peri", norm_type="rmsnorm").describe().startswith("Peri-LN block")


def test_head_slices_and_a_subset_beside_the_output_norms():
    """``wrt`` mixing head slices, an output norm's γ/β and a feed-forward weight, in any order: the
    sub-block of the whole Hessian, and a block computed alone."""
    cfg = hv.BlockConfig(norm="peri", **{**REAL, "activation": "silu", "mlp": "gated"})
    params, X, Y = _setup(cfg, seed=6)
    whole = hv.hessian(cfg, params, X, Y)
    wrt = ("ln2_out_beta", "W_K[1]", "ln1_out_gamma", "W_G", "W_Q[2]")
    res = hv.hessian(cfg, params, X, Y, wrt=wrt)
    assert res.names == ("W_Q[2]", "W_K[1]", "ln1_out_gamma", "W_G", "ln2_out_beta")
    idx = torch.cat([whole.offsets[parse_name(n).base].start + cfg.head_indices(n) for n in res.names])
    floor = 1e-14 * float(torch.linalg.norm(whole.full))
    for term in NAMES:
        assert_close(res.term(term), whole.term(term)[idx][:, idx], 1e-12, f"wrt {term}", atol=floor)
        alone = hv.hessian(cfg, params, X, Y, wrt=wrt).block("W_K[1]", "ln2_out_beta", term)
        assert_close(alone, res.term(term)[res.offsets["W_K[1]"], res.offsets["ln2_out_beta"]], 1e-12, term)


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_an_output_norm_makes_its_sublayers_weights_scale_invariant_so_the_functional_term_is_indefinite(
    norm_type,
):
    """Why Peri-LN's full Hessian carries more negative curvature (claim ``nonconvex``): with
    ``ln_eps = 0`` the output norm divides out the scale of its sublayer's output, and that output is
    positively homogeneous of degree 1 in ``W_V`` (attention is linear in it), in ``W_2`` and, through
    ReLU, in ``W_1``. So ``ℓ(c W) = ℓ(W)`` for ``c > 0``; differentiating, ``J w = 0`` (``Z`` does not
    move along ``w``, ``vec W`` in θ), ``gᵀ w = 0`` and ``H w = −g_W``, the gradient's ``W`` block alone
    (from ``c ∇_W ℓ(c W) = ∇_W ℓ(W)`` and ``∇_θ' ℓ(c W) = ∇_θ' ℓ(W)`` at ``c = 1``). Hence
    ``H_outer w = 0`` and ``H_functional w = −g_W``: on the plane of ``w`` and ``g_W`` the Hessian reads
    ``[[0, −‖g_W‖²], [−‖g_W‖², ·]]``, whose determinant is negative: an eigenvalue below zero for each
    such weight, all from the functional term. Pre-LN has none (its sublayer output joins the residual
    unnormalised); ``W_Q``, ``W_K`` (softmax) are not homogeneous."""
    cfg = hv.BlockConfig(norm="peri", norm_type=norm_type, seq_len=4, d_model=5, d_k=3, d_ff=6)
    params, X, Y = _setup(cfg, seed=7)
    res, grads = hv.hessian(cfg, params, X, Y), hv.gradient(cfg, params, X, Y)
    scale = float(torch.linalg.norm(res.full))
    for name in cfg.param_names:
        w, g = torch.zeros(res.size, dtype=F64), torch.zeros(res.size, dtype=F64)
        w[res.offsets[name]], g[res.offsets[name]] = params[name].reshape(-1), grads[name].reshape(-1)
        homogeneous = name in ("W_V", "W_1", "W_2")
        gap = float(torch.linalg.norm(res.full @ w + g)) / float(torch.linalg.norm(g))
        assert (gap < 1e-10) is homogeneous, (name, gap)
        if homogeneous:
            assert float(torch.linalg.norm(res.outer @ w)) < 1e-12 * scale * float(torch.linalg.norm(w))
            assert_close(res.functional @ w, -g, 1e-10, f"H_functional w = −g for {name}")
            assert abs(float(g @ w)) < 1e-12 * float(torch.linalg.norm(g) * torch.linalg.norm(w))
            plane = torch.stack([w / torch.linalg.norm(w), g / torch.linalg.norm(g)], 1)
            assert float(torch.linalg.eigvalsh(plane.T @ res.full @ plane)[0]) < 0
    pre = hv.BlockConfig(**{**cfg.values(), "norm": "pre"})
    res, grads = hv.hessian(pre, params, X, Y), hv.gradient(pre, params, X, Y)
    w, g = torch.zeros(res.size, dtype=F64), torch.zeros(res.size, dtype=F64)
    w[res.offsets["W_2"]], g[res.offsets["W_2"]] = params["W_2"].reshape(-1), grads["W_2"].reshape(-1)
    assert float(torch.linalg.norm(res.full @ w + g)) > 1e-3 * float(torch.linalg.norm(g))
