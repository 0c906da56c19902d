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
from hessviz.block.config import parse_name
from hessviz.block.terms import NAMES
from tests.cases import tiered
from tests.helpers import assert_close

F64 = torch.float64
RTOL = 1e-10
TERMS = NAMES


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
    assert cfg.sort_names(["l2.W_1", "l0.W_Q[1]", "l1.b_Q", "l0.W_Q[0]"]) == (
        "l0.W_Q[0]",
        "l0.W_Q[1]",
        "l1.b_Q",
        "l2.W_1",
    )
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


@pytest.mark.parametrize(
    "name, match",
    [
        ("l3.W_Q", "n_layers = 3"),
        ("W_Q", "layer prefix"),
        ("l1.W_9", "l1.W_9"),
        ("l0.W_1[0]", "no heads"),
        ("l-1.W_Q", "parameter name"),
        ("l01.W_Q", "leading zeros"),
    ],
)
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
    hv.BlockConfig(
        n_layers=2,
        norm="pre",
        n_heads=2,
        out_proj=True,
        bias=True,
        ln_affine=True,
        causal=True,
        activation="gelu_tanh",
        ln_eps=1e-5,
        **SMALL,
    ),
    hv.BlockConfig(
        n_layers=2,
        norm="post",
        n_heads=2,
        out_proj=True,
        d_v=1,
        bias=True,
        ln_affine=True,
        loss="ce",
        **SMALL,
    ),
]


@pytest.mark.parametrize(
    "cfg", tiered(STACK_KINDS, fast=2, stride=3), ids=lambda c: c.describe().replace(" ", "")
)
def test_forward_loss_gradient_and_jacobian_of_stacks_match_autograd(cfg):
    params, X, Y = _setup(cfg, seed=2)
    Z = reference.torch_forward(cfg, params, X)
    assert_close(hv.forward(cfg, params, X), Z, 1e-12, "forward")
    assert_close(hv.loss(cfg, params, X, Y), reference.torch_loss(cfg, Z, Y), 1e-12, "loss")
    wrt = cfg.param_names[1::2]
    grads = hv.gradient(cfg, params, X, Y, wrt=wrt)
    ref = hv.gradient(cfg, params, X, Y, wrt=wrt, method="autograd")
    floor = 1e-14 * max(float(g.abs().max()) for g in ref.values())  # rank collapse: ~0 gradients
    for n in wrt:
        assert_close(grads[n], ref[n], RTOL, f"gradient {n}", atol=floor)
    assert_close(
        hv.jacobian(cfg, params, X), hv.jacobian(cfg, params, X, method="autograd"), RTOL, "jacobian"
    )


# ----------------------------------------------------------------------------- custom losses


def _pooled_cosine(u: torch.Tensor):
    """A real objective that couples tokens: ``1 − cos(mean_t Z_t, u)``."""

    def phi(Z: torch.Tensor) -> torch.Tensor:
        m = Z.mean(0)
        return 1.0 - (m @ u) / (m.norm() * u.norm())

    return phi


def _custom(cfg: hv.BlockConfig, params, X, phi, form: str) -> hv.CustomLoss:
    """``phi``'s gradient and curvature at ``Z`` by autograd, in the ``form`` asked for."""
    Z = hv.forward(cfg, params, X)
    g = torch.func.grad(phi)(Z)
    N = torch.func.hessian(lambda z: phi(z.reshape(Z.shape)))(Z.reshape(-1))
    if form == "dense":
        return hv.CustomLoss(g, N)
    if form == "operator":
        return hv.CustomLoss(g, lambda dZ: (dZ.reshape(dZ.shape[0], -1) @ N).reshape(dZ.shape))
    L, d = Z.shape
    return hv.CustomLoss(g, torch.stack([N[t * d : (t + 1) * d, t * d : (t + 1) * d] for t in range(L)]))


def _direct_hessian(cfg, params, X, phi, names):
    """``∇²_θ phi(f(θ))`` by ``torch.func.hessian``, independently of :class:`CustomLoss`."""

    def f(theta):
        return phi(reference.torch_forward(cfg, reference._unflatten(cfg, names, theta, params), X))

    return torch.func.hessian(f)(reference.flatten(cfg, params, names))


def _columns(res: hv.HessianResult, term: str) -> torch.Tensor:
    return res.matvec(torch.eye(res.size, dtype=F64), term)


@pytest.mark.parametrize(
    "cfg",
    [
        hv.BlockConfig(**SMALL, norm="pre"),
        hv.BlockConfig(n_layers=2, norm="post", n_heads=2, out_proj=True, bias=True, **SMALL),
    ],
    ids=("one-block", "stack"),
)
@pytest.mark.parametrize("form", ["dense", "operator"])
def test_a_token_coupling_custom_loss_matches_autograd_in_products(cfg, form):
    params, X, _ = _setup(cfg, seed=5)
    phi = _pooled_cosine(torch.linspace(-1, 1, cfg.d_model, dtype=F64) + 0.3)
    names = cfg.param_names
    direct = _direct_hessian(cfg, params, X, phi, names)
    res = hv.hessian(cfg, params, X, loss=_custom(cfg, params, X, phi, form))
    assert_close(_columns(res, "full"), direct, RTOL, f"{form}: matvec vs torch.func of phi∘f")
    ref = hv.hessian(cfg, params, X, loss=_custom(cfg, params, X, phi, form), method="autograd")
    assert_close(ref.full, direct, RTOL, "autograd reference on the second-order model")
    for term in ("outer", "functional"):
        assert_close(_columns(res, term), ref.term(term), RTOL, f"{form}: matvec {term}")
    grads = hv.gradient(cfg, params, X, loss=_custom(cfg, params, X, phi, form))
    flat = torch.func.grad(
        lambda th: phi(reference.torch_forward(cfg, reference._unflatten(cfg, names, th, params), X))
    )(reference.flatten(cfg, params, names))
    assert_close(torch.cat([grads[n].reshape(-1) for n in names]), flat, RTOL, "gradient")


def test_a_token_wise_custom_loss_is_the_builtin_loss():
    cfg = hv.BlockConfig(**SMALL, norm="post", n_heads=2, out_proj=True, loss="ce")
    params, X, Y = _setup(cfg, seed=6)
    from hessviz import losses

    Z = hv.forward(cfg, params, X)
    custom = hv.CustomLoss(losses.gradient("ce", Z, Y), losses.hessian("ce", Z, Y))
    res, ref = hv.hessian(cfg, params, X, loss=custom), hv.hessian(cfg, params, X, Y)
    for term in TERMS:
        assert_close(res.term(term), ref.term(term), 1e-13, f"token-wise custom {term}")
    v = torch.linspace(-1, 1, res.size, dtype=F64)
    assert_close(res.matvec(v), ref.full @ v, RTOL, "matvec")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda g, N: hv.CustomLoss(g[:-1], N), "grad_Z must have shape"),
        (lambda g, N: hv.CustomLoss(g, N[:-1]), "hess_Z must have shape"),
        (lambda g, N: hv.CustomLoss(g, N + torch.triu(torch.ones_like(N), 1)), "hess_Z must be symmetric"),
        (lambda g, N: hv.CustomLoss(g * float("nan"), N), "grad_Z has non-finite"),
        (lambda g, N: hv.CustomLoss(g, N.reshape(-1)), "hess_Z must have shape"),
        (lambda g, N: hv.CustomLoss(g, lambda dZ: dZ[:, :1]), r"hess_Z\(dZ\) must map"),
        (lambda g, N: hv.CustomLoss(g, lambda dZ: dZ.roll(1, -1)), "hess_Z must be symmetric"),
        (lambda g, N: hv.CustomLoss(g, "N"), "hess_Z must be a torch.Tensor"),
        (lambda g, N: g, "loss must be a hessviz.CustomLoss"),
    ],
)
def test_bad_custom_losses_are_refused_naming_the_field(make, match):
    cfg = hv.BlockConfig(**SMALL)
    params, X, _ = _setup(cfg)
    L, d = cfg.seq_len, cfg.d_model
    g, N = torch.ones(L, d, dtype=F64), torch.eye(L * d, dtype=F64)
    with pytest.raises(ValueError, match=match):
        hv.hessian(cfg, params, X, loss=make(g, N))


def test_y_and_a_custom_loss_are_exclusive_and_one_is_needed():
    cfg = hv.BlockConfig(**SMALL)
    params, X, Y = _setup(cfg)
    L, d = cfg.seq_len, cfg.d_model
    custom = hv.CustomLoss(torch.ones(L, d, dtype=F64), torch.eye(L * d, dtype=F64))
    with pytest.raises(ValueError, match="not both"):
        hv.hessian(cfg, params, X, Y, loss=custom)
    with pytest.raises(ValueError, match="Y is required"):
        hv.hessian(cfg, params, X)


# ----------------------------------------------------------------------------- products on stacks


def _id(cfg: hv.BlockConfig) -> str:
    return cfg.describe().replace(" ", "")


@pytest.mark.parametrize("cfg", STACK_KINDS[:2] + STACK_KINDS[4:], ids=_id)
def test_matvec_on_stacks_matches_autograd(cfg):
    params, X, Y = _setup(cfg, seed=7)
    wrt = (
        (cfg.param_names[0], cfg.param_names[-1])
        if cfg.n_heads == 1
        else ("l0.W_Q[1]", "l0.W_O", f"l{cfg.n_layers - 1}.W_V[0]", cfg.param_names[-1])
    )
    res = hv.hessian(cfg, params, X, Y, wrt=wrt)
    ref = hv.hessian(cfg, params, X, Y, wrt=wrt, method="autograd")
    for term in TERMS:
        assert_close(_columns(res, term), ref.term(term), RTOL, f"matvec {term}")
    op = res.block_operator(wrt[-1], wrt[0], "full")
    v = torch.linspace(0, 1, cfg.param_size(wrt[0]), dtype=F64).numpy()
    assert_close(
        torch.from_numpy(op.matvec(v)),
        ref.block(wrt[-1], wrt[0]) @ torch.from_numpy(v),
        RTOL,
        "cross-layer block operator",
    )


# ----------------------------------------------------------------------------- dense terms of stacks


def assert_every_block_close(res: hv.HessianResult, ref: hv.HessianResult, what: str) -> None:
    """Every term, every block pair (within and across layers) to RTOL; blocks that are zero in
    exact arithmetic against an absolute floor at round-off of the full Hessian."""
    floor = 1e-13 * max(float(ref.full.abs().max()), 1e-300)
    for term in TERMS:
        ours, theirs = res.term(term), ref.term(term)
        assert_close(ours, ours.T, 1e-12, f"{what}: {term} symmetric", atol=floor)
        for a in res.names:
            for b in res.names:
                assert_close(
                    ours[res.offsets[a], res.offsets[b]],
                    theirs[ref.offsets[a], ref.offsets[b]],
                    RTOL,
                    f"{what}: {term} block ({a}, {b})",
                    atol=floor,
                )


@pytest.mark.parametrize("cfg", tiered(STACK_KINDS, fast=3, stride=2), ids=_id)
def test_every_term_of_every_block_pair_of_stacks_matches_autograd(cfg):
    params, X, Y = _setup(cfg, seed=11)
    res = hv.hessian(cfg, params, X, Y)
    ref = hv.hessian(cfg, params, X, Y, method="autograd")
    assert res.names == cfg.param_names
    assert_every_block_close(res, ref, cfg.describe())


@pytest.mark.parametrize("cfg", STACK_KINDS[4:], ids=_id)
def test_head_slices_and_wrt_subsets_of_stacks(cfg):
    params, X, Y = _setup(cfg, seed=12)
    last = cfg.n_layers - 1
    wrt = ("l0.W_Q[1]", "l0.b_V[0]", f"l{last}.W_K[0]", f"l{last}.W_O[1]", f"l{last}.ln2_gamma")
    res = hv.hessian(cfg, params, X, Y, wrt=wrt)
    ref = hv.hessian(cfg, params, X, Y, wrt=wrt, method="autograd")
    assert_every_block_close(res, ref, "head slices")
    whole = hv.hessian(cfg, params, X, Y, wrt=("l0.W_Q", f"l{last}.W_O"))

    def rows(name: str) -> torch.Tensor:  # a name's rows in whole's terms: its entries in its weight
        return cfg.head_indices(name) + whole.offsets[parse_name(name).base].start

    for a, b in (
        ("l0.W_Q[1]", f"l{last}.W_O[0]"),
        (f"l{last}.W_O[1]", "l0.W_Q[0]"),
        ("l0.W_Q[0]", "l0.W_Q[1]"),
        (f"l{last}.W_O", "l0.W_Q"),
    ):
        for term in TERMS:  # blocks computed alone, then read from the term
            alone = whole.block(a, b, term)
            expected = whole.term(term)[rows(a)][:, rows(b)]
            assert_close(alone, expected, 1e-12, f"block ({a}, {b}) {term}")


@pytest.mark.parametrize(
    "cfg",
    [
        hv.BlockConfig(**SMALL, norm="post", n_heads=2, out_proj=True, bias=True, activation="gelu"),
        hv.BlockConfig(n_layers=3, norm="pre", ln_affine=True, **SMALL),
    ],
    ids=("one-block", "stack"),
)
@pytest.mark.parametrize("form", ["dense", "operator", "token"])
def test_dense_terms_under_a_custom_loss_match_autograd(cfg, form):
    params, X, _ = _setup(cfg, seed=13)
    phi = _pooled_cosine(torch.linspace(1, -1, cfg.d_model, dtype=F64) - 0.2)
    res = hv.hessian(cfg, params, X, loss=_custom(cfg, params, X, phi, form))
    ref = hv.hessian(cfg, params, X, loss=_custom(cfg, params, X, phi, form), method="autograd")
    assert_every_block_close(res, ref, f"custom {form}")
    if form != "token":
        assert_close(
            res.full,
            _direct_hessian(cfg, params, X, phi, cfg.param_names),
            RTOL,
            "full vs torch.func of phi∘f",
        )


def test_a_random_symmetric_token_coupling_curvature():
    cfg = hv.BlockConfig(n_layers=2, norm="none", activation="gelu", **SMALL)
    params, X, _ = _setup(cfg, seed=14)
    gen = torch.Generator().manual_seed(3)
    Ld = cfg.seq_len * cfg.d_model
    B = torch.randn(Ld, Ld, generator=gen, dtype=F64)
    custom = dict(grad_Z=torch.randn(cfg.seq_len, cfg.d_model, generator=gen, dtype=F64), hess_Z=B + B.T)
    res = hv.hessian(cfg, params, X, loss=hv.CustomLoss(**custom), wrt=("l0.W_V", "l1.W_Q", "l1.W_2"))
    ref = hv.hessian(
        cfg, params, X, loss=hv.CustomLoss(**custom), wrt=("l0.W_V", "l1.W_Q", "l1.W_2"), method="autograd"
    )
    assert_every_block_close(res, ref, "random symmetric curvature")
    assert_close(_columns(res, "full"), res.full, RTOL, "matvec vs dense")


def test_the_boundary_curvature_is_one_interface_for_both_kinds():
    from hessviz.dense.stack import Boundary

    gen = torch.Generator().manual_seed(0)
    L, d = 3, 2
    S = torch.randn(L, d, d, generator=gen, dtype=F64)
    S = S + S.transpose(1, 2)
    g = torch.zeros(L, d, dtype=F64)
    token, dense = Boundary(g, S), Boundary(g, torch.block_diag(*S))
    J, dZ = torch.randn(L * d, 5, generator=gen, dtype=F64), torch.randn(5, L, d, generator=gen, dtype=F64)
    expected = J.T @ torch.block_diag(*S) @ J
    for kind in (token, dense):
        out = torch.full((5, 5), 7.0, dtype=F64)
        kind.sandwich_into(out, J, [2, 1, 2], accumulate=False)
        assert_close(out, expected, 1e-13, "sandwich tiles")
        kind.sandwich_into(out, J, [3, 2], accumulate=True)
        assert_close(out, 2 * expected, 1e-13, "sandwich tiles, accumulated")
    assert_close(token.times(dZ), dense.times(dZ), 1e-13, "times")
    assert Boundary(g, None).times(dZ) is None


def test_spectral_tools_list_every_head_of_every_layer():
    from hessviz import matfree

    cfg = hv.BlockConfig(n_layers=2, n_heads=2, out_proj=True, **SMALL)
    params, X, Y = _setup(cfg)
    res = hv.hessian(cfg, params, X, Y, wrt=("l0.W_Q", "l1.W_1"))
    assert matfree.block_names(res) == ("l0.W_Q[0]", "l0.W_Q[1]", "l1.W_1")
    top = matfree.top_eigenvalues(res, "full", k=1)
    assert abs(float(top[0]) - float(torch.linalg.eigvalsh(res.full)[-1])) < 1e-8


def test_the_last_layer_of_a_stack_is_one_block_on_the_previous_output():
    cfg = hv.BlockConfig(n_layers=3, norm="post", n_heads=2, out_proj=True, bias=True, **SMALL)
    params, X, Y = _setup(cfg, seed=15)
    last = [n for n in cfg.param_names if n.startswith("l2.")]
    block_params = {n[3:]: params[n] for n in last}
    X2 = X
    for layer in range(2):
        X2 = hv.forward(cfg.block, {n: params[f"l{layer}.{n}"] for n in cfg.block.param_names}, X2)
    res = hv.hessian(cfg, params, X, Y, wrt=last)
    one = hv.hessian(cfg.block, block_params, X2, Y)
    for term in TERMS:
        assert_close(res.term(term), one.term(term), 1e-13, f"last layer {term}")


def test_a_dense_custom_loss_with_token_wise_values_is_the_builtin_loss():
    cfg = hv.BlockConfig(**SMALL, norm="pre", activation="gelu")
    params, X, Y = _setup(cfg, seed=16)
    from hessviz import losses

    Z = hv.forward(cfg, params, X)
    dense = hv.CustomLoss(losses.gradient("mse", Z, Y), torch.block_diag(*losses.hessian("mse", Z, Y)))
    res, ref = hv.hessian(cfg, params, X, loss=dense), hv.hessian(cfg, params, X, Y)
    for term in TERMS:
        assert_close(res.term(term), ref.term(term), 1e-12, f"dense engine vs one-block engine: {term}")
