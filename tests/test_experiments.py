"""The experiments library: fits, Gini, bounds, gradients, and the quick reproduction."""

import json
import math

import numpy as np
import pytest
import torch

import hessviz as hv
from hessviz.experiments import CLAIM_IDS, bounds, heterogeneity, ln_collapse, reproduce
from hessviz.laws.fitting import bend_point, gini, power_law_fit, slope_over_seeds, t_interval

# ------------------------------------------------------------------ fits


@pytest.mark.parametrize("exponent", [-3.0, -1.0, 0.0, 2.0, 6.0])
def test_power_law_fit_recovers_exponent(exponent):
    x = np.logspace(-2, 1, 20)
    y = 3.7 * x**exponent
    fit = power_law_fit(x, y)
    assert fit.slope == pytest.approx(exponent, abs=1e-10)
    assert math.exp(fit.intercept) == pytest.approx(3.7, rel=1e-9)
    assert fit.ci[0] <= fit.slope <= fit.ci[1]


def test_slope_over_seeds_with_noise_covers_truth():
    rng = np.random.default_rng(0)
    x = np.logspace(-2, 0, 15)
    Y = np.stack([2.0 * x**6 * np.exp(rng.normal(0, 0.05, x.size)) for _ in range(8)])
    fit = slope_over_seeds(x, Y)
    assert fit.ci[0] < 6.0 < fit.ci[1]
    assert fit.ci[1] - fit.ci[0] < 0.2


def test_bend_point_finds_the_knee():
    x = np.logspace(-2, 2, 41)
    y = x**6 / (1 + x**8)  # slope 6 below 1, −2 above
    b = bend_point(x, y, 6.0, tol=0.5)
    assert 0.3 < b < 1.0


def test_t_interval_single_value():
    assert t_interval([2.5]) == (2.5, 2.5, 2.5)


# ------------------------------------------------------------------ Gini


@pytest.mark.parametrize(
    "values, expected",
    [
        ([1, 1, 1, 1], 0.0),
        ([0, 0, 0, 1], 0.75),  # one non-zero of n: (n − 1)/n
        ([1, 3], 0.25),  # |1−3|·2 / (2·4·2)
        ([1, 2, 3, 4], 0.25),  # Σ|xi−xj| = 20, 2·16·2.5 = 80
    ],
)
def test_gini_known_vectors(values, expected):
    assert gini(values) == pytest.approx(expected)


def test_gini_scale_invariant_and_rejects_negative():
    assert gini([1, 5, 9]) == pytest.approx(gini([10, 50, 90]))
    with pytest.raises(ValueError):
        gini([1, -1])


# ------------------------------------------------------------------ bounds, by hand


def test_attention_bound_hand_case():
    a = bounds.AttentionQuantities(L=2, d=2, dk=1, x=1.0, q=1.0, k=1.0, v=1.0, t=0.0, s=0.25)
    F = 2.0  # L x v + t
    app = bounds.attention_bound_terms(a, "appendix")
    assert app["VV"] == pytest.approx((2 * 2 / 2, 0.0))  # 2L/d x²
    assert app["QQ"][0] == pytest.approx(2 / (8 * 2 * 1))  # 2/(L³ d d_k)
    assert app["QQ"][1] == pytest.approx(12 / 2 * math.sqrt(2) * F)  # 12/(d d_k) √r F
    assert app["VQ"][0] == pytest.approx(2 / (2 * 2))  # 2/(L d √d_k)
    main = bounds.attention_bound_terms(a, "main")
    assert main["QQ"][0] == pytest.approx(4 * app["QQ"][0])  # 8 vs 2
    corr = bounds.attention_bound_terms(a, "corrected")
    assert corr["QQ"][0] == pytest.approx(2 * 0.25**2 / (2 * 2 * 1))  # 2 s²/(L d d_k)
    assert bounds.attention_bound(a, "appendix") == pytest.approx(3 * max(o + f for o, f in app.values()))


def test_layernorm_exact_and_bound_hand_case():
    z = torch.tensor([[1.0, -1.0, 0.0, 0.0]], dtype=torch.float64)
    # σ = sqrt(mean c²) = sqrt(1/2); J = (Π − ĉĉᵀ)/σ is a projector over σ
    J, H = ln_collapse.ln_norms(z)
    assert J == pytest.approx(math.sqrt(2))
    jb, hb = ln_collapse.paper_ln_bounds(z, math.sqrt(0.5))
    x, s, n, m = math.sqrt(2), math.sqrt(0.5), 4, 1
    assert jb == pytest.approx(1 / s + x**2 / (math.sqrt(n) * s**3))
    assert hb == pytest.approx(
        x / s**3 * (1 + math.sqrt(m / n)) + x**2 / (math.sqrt(n) * s**3) + 3 * x**3 / (n * s**5)
    )
    assert J <= jb and H <= hb


def test_layernorm_hessian_matches_autograd():
    z = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    _, H = ln_collapse.ln_norms(z)

    def row_ln(r):
        c = r - r.mean()
        return c / c.pow(2).mean().sqrt()

    worst = 0.0
    for t in range(3):
        T = torch.func.jacfwd(torch.func.jacrev(row_ln))(z[t])  # (n, n, n)
        worst = max(worst, float(torch.linalg.matrix_norm(T.reshape(25, 5), ord=2)))
    assert H == pytest.approx(worst, rel=1e-10)


def test_attention_bounds_hold_in_a_uniform_regime():
    cfg = hv.BlockConfig(seq_len=4, d_model=4, d_k=2, norm="attention")
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0, input_norm=0.1)
    row = bounds.case_row(cfg, params, X, Y, {})
    for ver in bounds.VERSIONS:
        assert row["true_total"] <= row[f"M_{ver}"]
        assert row["true_QQ_outer"] <= row[f"{ver}_QQ_outer"]
    assert row["s"] * 4 == pytest.approx(1.0, abs=1e-2)  # near-uniform attention


# ------------------------------------------------------------------ gradients


@pytest.mark.parametrize("norm", ["post", "pre", "none", "attention"])
def test_block_gradient_norms_match_autograd(norm):
    cfg = hv.BlockConfig(seq_len=4, d_model=6, d_k=3, d_ff=5, norm=norm)
    params = hv.init_params(cfg, seed=1)
    X, Y = hv.sample_inputs(cfg, seed=1, input_norm=2.0)
    h = heterogeneity.block_heterogeneity(cfg, params, X, Y, "column")
    ref = hv.gradient(cfg, params, X, Y, method="autograd")
    expected = np.array([float(g[:, j].norm()) for g in ref.values() for j in range(g.shape[1])])
    np.testing.assert_allclose(h.grad_norms, expected, rtol=1e-10, atol=1e-14)
    m = heterogeneity.block_heterogeneity(cfg, params, X, Y, "matrix")
    np.testing.assert_allclose(m.grad_norms, [float(g.norm()) for g in ref.values()], rtol=1e-10)
    assert m.lambda_G > 0 and m.lambda_P > 0


# ------------------------------------------------------------------ the quick reproduction


@pytest.mark.slow  # every claim measured once: five minutes on a shared CPU
def test_reproduce_quick(tmp_path, claims_once):
    with claims_once():
        entries = reproduce(tmp_path, quick=True)
    assert [r["id"] for r in entries] == list(CLAIM_IDS)
    on_disk = json.loads((tmp_path / "claims.json").read_text())
    assert on_disk == entries
    for r in entries:
        assert set(r) == {"id", "claim", "source", "measured", "holds", "note"}
        assert r["holds"] in (True, False, "partly")
        assert r["claim"] and r["source"] and r["note"]
        assert r["measured"], r["id"]
        for k, v in r["measured"].items():
            for u in v if isinstance(v, list) else [v]:
                assert isinstance(u, float) and math.isfinite(u), (r["id"], k, v)
    report = (tmp_path / "report.md").read_text()
    for cid in CLAIM_IDS:
        assert f"`{cid}`" in report
    figs = list((tmp_path / "figures").glob("*.html"))
    assert len(figs) >= len(CLAIM_IDS)
    for f in figs:
        assert f"figures/{f.name}" in report


def test_reproduce_runs_the_claims_it_is_given_and_can_leave_the_figures_out(tmp_path, claims_once):
    """``--only`` runs the named claims in the order given; ``--no-figures`` writes ``claims.json``,
    ``report.md`` and ``data/`` but no HTML (the package's stored claims: the app draws them); an
    unknown id is refused, naming the claims there are."""
    with claims_once():
        entries = reproduce(tmp_path, quick=True, ids=("depth", "xnorm6"), figures=False)
    assert [r["id"] for r in entries] == ["depth", "xnorm6"]
    assert not (tmp_path / "figures").exists() and "Figure:" not in (tmp_path / "report.md").read_text()
    assert list((tmp_path / "data").glob("*.npz"))
    with pytest.raises(hv.ConfigError, match="no claim nope: the claims are xnorm6"):
        reproduce(tmp_path, quick=True, ids=("nope",))


def test_claims_on_an_executor_are_the_in_process_numbers(claims_once):
    """Two worker processes (spawned: a fresh interpreter each, no state shared with this one) give
    every measured number of the in-process run to the bit, in the order asked."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from hessviz.experiments.report import run_claims

    ids = ("nonconvex", "placement", "modern")
    with claims_once():  # the in-process run, shared with reproduce
        here = [r.entry() for r in run_claims(True, ids)]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        there = [r.entry() for r in run_claims(True, ids, executor=pool)]
    assert [r["id"] for r in there] == list(ids) and there == here
    with pytest.raises(hv.InputError, match="executor is closed"):
        run_claims(True, ids, executor=pool)
    with pytest.raises(hv.InputError, match="concurrent.futures.Executor"):
        run_claims(True, ids, executor="tcp://scheduler:8786")


# ------------------------------------------------------------------ modern blocks (claim ``modern``)


def test_a_shared_key_value_head_is_the_sum_over_its_readers():
    from hessviz.experiments import modern
    from hessviz.laws.sweeps import seeded_inputs

    cfg = hv.BlockConfig(
        seq_len=5,
        d_model=8,
        d_k=4,
        d_ff=8,
        norm="pre",
        n_heads=4,
        n_kv_heads=2,
        out_proj=True,
        bias=True,
        causal=True,
    )
    params, X, Y = seeded_inputs(cfg, 3, 1.0)
    mha, untied = modern.untied_params(cfg, params)
    assert mha.n_kv_heads is None and untied["W_K"].shape == (8, 16)
    torch.testing.assert_close(hv.forward(mha, untied, X), hv.forward(cfg, params, X), rtol=1e-13, atol=1e-13)
    for group in (0, 1):
        split = modern.shared_head_split(cfg, params, X, Y, group)
        assert split["tied_identity_rel_error"] < 1e-12
        shares = [v for k, v in split.items() if k.startswith("outer_trace_share")]
        assert len(shares) == 3 and abs(sum(shares) - 1) < 1e-12


# ------------------------------------------------------------------ Ormaniec et al.'s protocol


@pytest.mark.parametrize("final_norm", [False, True])
def test_the_addition_answer_loss_is_its_autograd(final_norm):
    from hessviz.experiments import growth_protocol as gp

    gen = torch.Generator().manual_seed(1)
    ids = gp.addition_batch(1, gen)[0]
    Z = torch.randn(gp.LENGTH, 6, generator=gen, dtype=torch.float64)
    W_U = torch.randn(6, gp.VOCAB, generator=gen, dtype=torch.float64)

    def loss(z):
        h = torch.nn.functional.layer_norm(z, (6,), eps=gp.LN_EPS) if final_norm else z
        logp = torch.log_softmax(h @ W_U, -1)[gp.LENGTH - gp.ANSWER - 1 : gp.LENGTH - 1]
        return -0.5 * logp.gather(1, ids[gp.LENGTH - gp.ANSWER :, None]).mean()

    got = gp.answer_loss(Z, ids, W_U, final_norm, weight=0.5)
    torch.testing.assert_close(got.grad_Z, torch.func.grad(loss)(Z), rtol=1e-12, atol=1e-14)
    H = torch.func.jacrev(torch.func.grad(loss))(Z)  # (L, d, L, d): token-wise
    blocks = torch.stack([H[t, :, t, :] for t in range(gp.LENGTH)])
    torch.testing.assert_close(got.hess_Z, blocks, rtol=1e-10, atol=1e-13)
    off = H.clone()
    for t in range(gp.LENGTH):
        off[t, :, t, :] = 0
    assert float(off.abs().max()) == 0.0
