"""Matrix-free products and the spectral tools against dense Hessians (float64, fixed seeds).

The dense references: the closed-form dense terms (papers' block) and the autograd Hessian
of :mod:`hessviz.reference` (every block kind); ``torch.func``'s forward-over-reverse HVP.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hessviz as hv
from hessviz import reference
from hessviz.block.terms import NAMES
from hessviz.matfree import spectral
from tests.cases import GRID
from tests.helpers import assert_close

TERMS = NAMES

REAL = [
    hv.BlockConfig(
        seq_len=4,
        d_model=6,
        d_k=2,
        d_ff=5,
        norm="post",
        n_heads=2,
        out_proj=True,
        bias=True,
        ln_affine=True,
        activation="gelu",
        ln_eps=1e-5,
    ),
    hv.BlockConfig(
        seq_len=5,
        d_model=4,
        d_k=2,
        d_ff=3,
        norm="pre",
        n_heads=3,
        out_proj=True,
        d_v=1,
        bias=True,
        ln_affine=True,
        causal=True,
        activation="gelu_tanh",
        loss="ce",
        ln_eps=1e-5,
    ),
    hv.BlockConfig(
        seq_len=4, d_model=5, d_k=3, d_ff=4, norm="none", n_heads=2, out_proj=True, causal=True, bias=True
    ),
    hv.BlockConfig(
        seq_len=3,
        d_model=4,
        d_k=2,
        norm="attention",
        n_heads=2,
        out_proj=True,
        bias=True,
        causal=True,
        loss="ce",
    ),
    hv.BlockConfig(seq_len=4, d_model=5, d_k=2, d_ff=6, norm="post", causal=True, bias=True),
]


def _inputs(cfg: hv.BlockConfig, seed: int = 0, input_norm: float = 2.0):
    params = hv.init_params(cfg, seed=seed)
    X, Y = hv.sample_inputs(cfg, seed=seed + 1, input_norm=input_norm)
    return params, X, Y


def _columns(n: int, k: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("case", GRID[::3], ids=lambda c: c.id)
def test_matvec_matches_dense_closed_form(case):
    params, X, Y = case.inputs()
    res = hv.hessian(case.cfg, params, X, Y)
    V = _columns(res.size)
    for term in TERMS:
        dense = res.term(term)
        assert_close(res.matvec(V, term), dense @ V, 1e-10, f"{term} H V")
        assert_close(res.matvec(V[:, 0], term), dense @ V[:, 0], 1e-10, f"{term} H v")


def _assert_matvec_matches_dense(cfg: hv.BlockConfig, wrt: tuple[str, ...] | None, k: int) -> None:
    params, X, Y = _inputs(cfg)
    res = hv.hessian(cfg, params, X, Y, wrt=wrt)
    ref = hv.hessian(cfg, params, X, Y, wrt=wrt, method="autograd")
    V = _columns(res.size, k)
    for term in TERMS:
        HV = res.matvec(V, term)
        assert_close(HV, ref.term(term) @ V, 1e-10, f"{cfg.norm} {wrt} {term} vs autograd")
        assert_close(HV, res.term(term) @ V, 1e-10, f"{cfg.norm} {wrt} {term} vs dense closed form")


@pytest.mark.parametrize("cfg", REAL, ids=lambda c: c.describe())
def test_matvec_matches_autograd_every_block_kind(cfg):
    _assert_matvec_matches_dense(cfg, None, 3)


def test_matvec_matches_torch_func_hvp():
    """(torch.func's jvp over grad trips on a ZeroTensor in torch 2.13 here; grad of grad·v works.)"""
    cfg = REAL[0]
    params, X, Y = _inputs(cfg)
    res = hv.hessian(cfg, params, X, Y)
    theta = reference.flatten(cfg, params, res.names)
    v = _columns(res.size, 1)[:, 0]
    grad = torch.func.grad(reference.loss_of_theta(cfg, params, X, Y, res.names))
    hvp = torch.func.grad(lambda t: torch.dot(grad(t), v))(theta)
    assert_close(res.matvec(v), hvp, 1e-10, "H v vs torch.func reverse-over-reverse")


@pytest.mark.parametrize(
    "wrt", [("W_Q[1]", "b_K[0]", "W_O[1]", "ln2_gamma", "b_2"), ("b_V",), ("ln1_beta", "W_V[0]", "W_V[1]")]
)
def test_head_slices_and_subsets(wrt):
    _assert_matvec_matches_dense(REAL[0], wrt, 4)


def test_block_operator_is_the_dense_block():
    cfg = REAL[1]
    params, X, Y = _inputs(cfg)
    res = hv.hessian(cfg, params, X, Y)
    ref = hv.hessian(cfg, params, X, Y, method="autograd")
    off = res.offsets
    rows = off["W_Q"].start + cfg.head_indices("W_Q[2]")
    for term in TERMS:
        dense = ref.term(term)[rows][:, off["W_1"]]
        op = res.block_operator("W_Q[2]", "W_1", term)
        assert op.shape == dense.shape and op.dtype == np.float64
        x, y = _columns(dense.shape[1], 2).numpy(), _columns(dense.shape[0], 2, seed=1).numpy()
        np.testing.assert_allclose(op @ x, dense.numpy() @ x, rtol=0, atol=1e-12)
        np.testing.assert_allclose(op.rmatvec(y[:, 0]), dense.numpy().T @ y[:, 0], rtol=0, atol=1e-12)


def test_linear_operator_feeds_scipy():
    from scipy.sparse.linalg import cg

    cfg = REAL[0]
    params, X, Y = _inputs(cfg)
    res = hv.hessian(cfg, params, X, Y)
    op = res.linear_operator("outer")
    b = _columns(res.size, 1)[:, 0].numpy()
    damped = op + 1.0 * __import__("scipy.sparse.linalg", fromlist=["aslinearoperator"]).aslinearoperator(
        np.eye(res.size)
    )
    x, info = cg(damped, b, rtol=1e-12, maxiter=2000)
    assert info == 0
    dense = hv.hessian(cfg, params, X, Y, method="autograd").outer.numpy() + np.eye(res.size)
    np.testing.assert_allclose(x, np.linalg.solve(dense, b), rtol=0, atol=1e-8)


def test_large_p_is_refused_only_when_a_dense_term_is_read():
    cfg = hv.BlockConfig(seq_len=4, d_model=24, d_k=8, d_ff=48, norm="post", n_heads=3, out_proj=True)
    params, X, Y = _inputs(cfg)
    hv.set_memory_limit("1MiB")
    try:
        res = hv.hessian(cfg, params, X, Y)
        out = res.matvec(torch.ones(res.size, dtype=torch.float64))
        assert out.shape == (res.size,) and torch.isfinite(out).all()
        with pytest.raises(hv.SizeError):
            _ = res.full
    finally:
        hv.set_memory_limit(None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("cfg", REAL[:2], ids=lambda c: c.describe())
def test_cuda_products_match_cpu(cfg):
    """Products run where the parameters live: on CUDA they agree with the CPU ones."""
    params, X, Y = _inputs(cfg)
    wrt = ("W_Q[1]", "b_K[0]", "W_O[1]", "ln2_gamma", "W_1") if cfg.norm == "post" else None
    cpu = hv.hessian(cfg, params, X, Y, wrt=wrt)
    gpu = hv.hessian(cfg, {n: w.cuda() for n, w in params.items()}, X.cuda(), Y.cuda(), wrt=wrt)
    V = _columns(cpu.size)
    for term in TERMS:
        out = gpu.matvec(V.cuda(), term)
        assert out.device.type == "cuda"
        assert_close(out.cpu(), cpu.matvec(V, term), 1e-10, f"{term} cuda vs cpu")
    top = spectral.top_eigenvalues(gpu, "full", 2, seed=0)
    np.testing.assert_allclose(top, np.linalg.eigvalsh(cpu.full.numpy())[::-1][:2], rtol=1e-8, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_minilm_matches_autograd():
    """The MiniLM-sized layer (P = 1.77M) on CUDA: every term against the autograd products."""
    from hessviz.bench.matfree import minilm_case
    from hessviz.products.autograd import AutogradOperator

    cfg, params, X, Y = minilm_case(32, device="cuda")
    res = hv.hessian(cfg, params, X, Y)
    V = torch.randn(cfg.num_params, 2, generator=torch.Generator().manual_seed(0), dtype=X.dtype).cuda()
    ag = hv.hessian(cfg, params, X, Y, method="autograd")
    assert isinstance(ag.operator(), AutogradOperator)
    for term in TERMS:
        assert_close(res.matvec(V, term), ag.matvec(V, term), 1e-9, f"{term} MiniLM cuda vs autograd")


def test_bad_vectors_are_refused():
    cfg = REAL[2]
    params, X, Y = _inputs(cfg)
    res = hv.hessian(cfg, params, X, Y)
    with pytest.raises(hv.InputError, match="shape"):
        res.matvec(torch.ones(res.size + 1, dtype=torch.float64))
    with pytest.raises(hv.InputError, match="floating"):
        res.matvec(torch.ones(res.size, dtype=torch.int64))
    with pytest.raises(hv.ConfigError, match="term"):
        res.matvec(torch.ones(res.size, dtype=torch.float64), term="hessian")


# ----------------------------------------------------------------------------- spectral tools


@pytest.fixture(scope="module")
def spectral_case():
    cfg = hv.BlockConfig(
        seq_len=6,
        d_model=8,
        d_k=4,
        d_ff=12,
        norm="pre",
        n_heads=2,
        out_proj=True,
        bias=True,
        ln_affine=True,
        activation="gelu",
        loss="ce",
        ln_eps=1e-5,
    )
    params, X, Y = _inputs(cfg, input_norm=4.0)
    res = hv.hessian(cfg, params, X, Y)
    ref = hv.hessian(cfg, params, X, Y, method="autograd")
    return res, ref, {t: torch.linalg.eigvalsh(ref.term(t)).numpy() for t in ("full", "outer")}


def test_eigsh_matches_eigvalsh(spectral_case):
    res, _, eig = spectral_case
    for term in ("full", "outer"):
        top = spectral.eigenpairs(res, term, 4, "top", seed=0, vectors=True)
        np.testing.assert_allclose(top.values, eig[term][-4:], rtol=1e-8, atol=1e-10)
        v = top.vectors[:, -1]
        Hv = res.matvec(torch.from_numpy(v), term).numpy()
        np.testing.assert_allclose(Hv, top.values[-1] * v, atol=1e-7)
    bottom = spectral.eigenpairs(res, "full", 3, "bottom", seed=1)
    np.testing.assert_allclose(bottom.values, eig["full"][:3], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(spectral.top_eigenvalues(res, "full", 2), eig["full"][::-1][:2], rtol=1e-8)


@pytest.mark.parametrize("reorth", ["partial", "selective", "none"])
def test_slq_density_within_stated_error(spectral_case, reorth):
    """20 probes × 40 steps at P = 532: CDF (Kolmogorov) distance ≤ 0.08, trace within 4 standard
    errors of Hutchinson's (SLQ's trace is Hutchinson's on the same probes), likewise tr(H²);
    with the basis kept (semi-orthogonal) and without (the plain three-term recurrence)."""
    res, _, eig = spectral_case
    ev = eig["full"]
    d = spectral.density(res, "full", probes=20, steps=40, seed=0, reorth=reorth)
    assert d.matvecs <= 20 * 40
    grid = np.linspace(ev.min(), ev.max(), 200)
    # the distance of a 20-probe estimate is itself random: over seeds 0–11 it was 0.02–0.047
    # (selective) and 0.019–0.065 (none); 0.05 held seed 0 of "none" on one CPU and not on another
    assert np.abs(d.cdf(grid) - (ev[None, :] <= grid[:, None]).mean(1)).max() <= 0.08
    spread = np.std([res.size * np.sum(w * x) for x, w in zip(d.nodes, d.weights)]) / np.sqrt(20)
    assert abs(d.trace - ev.sum()) <= 4 * spread
    per_probe = [np.sum(w * x**2) for x, w in zip(d.nodes, d.weights)]  # vᵀH²v / ‖v‖²
    assert abs(np.mean(per_probe) - np.mean(ev**2)) <= 4 * np.std(per_probe) / np.sqrt(20)
    x, phi = d.curve()
    assert abs(np.trapezoid(phi, x) - 1.0) < 1e-3


def test_slq_with_enough_steps_is_exact():
    """Lanczos with ``steps ≥ P`` on one probe finds every eigenvalue the probe sees."""
    cfg = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=3, norm="post")
    params, X, Y = _inputs(cfg)
    res = hv.hessian(cfg, params, X, Y, wrt=("W_K",))
    d = spectral.density(res, "full", probes=1, steps=res.size, seed=0)
    ev = torch.linalg.eigvalsh(res.full).numpy()
    assert np.abs(np.sort(d.nodes[0])[[0, -1]] - ev[[0, -1]]).max() < 1e-10


@pytest.mark.parametrize("method", ["hutchinson", "hutch++"])
def test_trace_within_stated_error(spectral_case, method):
    res, _, eig = spectral_case
    for seed in range(3):
        est = spectral.trace(res, "outer", 60, method, seed=seed)
        assert est.matvecs == 60 and est.stderr > 0
        assert abs(est.value - eig["outer"].sum()) <= 4 * est.stderr, (seed, est, eig["outer"].sum())
    exact = spectral.trace(res, "full", res.size, method)
    assert exact.method == "exact" and abs(exact.value - eig["full"].sum()) < 1e-9


def test_block_table_every_weight_and_head(spectral_case):
    res, ref, _ = spectral_case
    cfg = res.cfg
    table = spectral.block_table(res, "full", exact_limit=40, trace_samples=60, seed=0)
    assert [r.name for r in table.rows] == list(spectral.block_names(res))
    assert "W_Q[1]" in [r.name for r in table.rows]
    off = ref.offsets
    for row in table.rows:
        base = row.name.split("[")[0]
        idx = off[base].start + cfg.head_indices(row.name)
        block = ref.full[idx][:, idx]
        vals = torch.linalg.eigvalsh(block).numpy()
        assert row.size == block.shape[0] and row.exact == (row.size <= 40)
        assert abs(row.top - vals[-1]) <= 1e-6 * max(1.0, abs(vals[-1])), row
        assert abs(row.trace - vals.sum()) <= (1e-9 if row.exact else 4 * row.trace_stderr + 1e-9), row


def test_progress_reports_and_cancels(spectral_case):
    res, _, _ = spectral_case
    seen = []
    spectral.density(
        res, "full", probes=2, steps=5, progress=lambda done, total, msg: seen.append((done, total))
    )
    assert seen[-1] == (10, 10) and [d for d, _ in seen] == [2, 4, 6, 8, 10]  # both probes per step

    class Stop(Exception):
        pass

    def cancel(done, total, msg):
        if done >= 3:
            raise Stop

    for run in (
        lambda: spectral.eigenpairs(res, "full", 2, progress=cancel),
        lambda: spectral.density(res, "full", 3, 10, progress=cancel),
        lambda: spectral.trace(res, "full", 30, "hutchinson", progress=cancel),
        lambda: spectral.block_table(res, "full", exact_limit=0, progress=cancel),
    ):
        with pytest.raises(Stop):
            run()


def test_spectral_tools_refuse_bad_arguments(spectral_case):
    res, _, _ = spectral_case
    with pytest.raises(hv.ConfigError, match="probes"):
        spectral.density(res, probes=0)
    with pytest.raises(hv.ConfigError, match="which"):
        spectral.eigenpairs(res, which="largest")
    with pytest.raises(hv.ConfigError, match="method"):
        spectral.trace(res, method="exact")


def test_cli_spectrum_writes_json_and_html(tmp_path):
    from hessviz.cli import main

    out = tmp_path / "spec"
    assert (
        main(
            [
                "spectrum",
                "--norm",
                "post",
                "-L",
                "4",
                "-d",
                "6",
                "--d-k",
                "2",
                "--heads",
                "2",
                "--out-proj",
                "--bias",
                "--ln-affine",
                "--ln-eps",
                "1e-5",
                "--top",
                "3",
                "--density",
                "--probes",
                "3",
                "--steps",
                "10",
                "--trace",
                "9",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = __import__("json").loads(out.with_suffix(".json").read_text())
    cfg = hv.BlockConfig(
        seq_len=4, d_model=6, d_k=2, n_heads=2, out_proj=True, bias=True, ln_affine=True, ln_eps=1e-5
    )
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0)
    ev = torch.linalg.eigvalsh(hv.hessian(cfg, params, X, Y, method="autograd").full).numpy()
    np.testing.assert_allclose(report["top"]["values"], ev[-3:], rtol=1e-7)
    assert len(report["density"]["nodes"]) == 3 and report["trace"]["matvecs"] == 9
    assert "plotly" in out.with_suffix(".html").read_text()


@pytest.mark.parametrize(
    "norm, out_proj, layers",
    [("post", True, 2), ("pre", False, 1), ("parallel", True, 2), ("attention", True, 1)],
)
@pytest.mark.parametrize("kind", ["token", "dense"])
def test_products_for_a_loss_on_some_tokens_sweep_those_rows_alone(norm, out_proj, layers, kind):
    """A :class:`~hessviz.CustomLoss` whose gradient and curvature live on tokens 0 and 3 only (a pooled
    classifier's kind): the products sweep a tape whose last layer runs on those two tokens after its
    attention (its ``Z`` has two rows), and equal the dense engine's on every term, on the full tape."""
    cfg = hv.BlockConfig(
        seq_len=5,
        d_model=4,
        d_k=2,
        d_ff=6,
        norm=norm,
        activation="gelu",
        n_heads=2 if out_proj else 1,
        out_proj=out_proj,
        bias=True,
        ln_affine=norm != "attention",
        ln_eps=1e-5,
        n_layers=layers,
    )
    params = hv.init_params(cfg, seed=1)
    X, _ = hv.sample_inputs(cfg, seed=1)
    gen = torch.Generator().manual_seed(2)
    read = torch.tensor([0, 3])
    g = torch.zeros(5, 4, dtype=torch.float64)
    g[read] = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    B = torch.randn(2, 4, 4, generator=gen, dtype=torch.float64)
    N = torch.zeros(5, 4, 4, dtype=torch.float64)
    N[read] = B @ B.transpose(1, 2)
    if kind == "dense":
        N = torch.block_diag(*N)
        N[0:4, 12:16] = N[12:16, 0:4] = 0.3  # tokens 0 and 3 coupled, as after a pooling
    res = hv.hessian(cfg, params, X, loss=hv.CustomLoss(g, N))
    mf = res.products
    assert torch.equal(mf.Y.read_tokens, read) and mf.sweep_tape is not mf.tape
    assert mf.sweep_tape.values[mf.sweep_tape.output].shape == (2, 4)
    V = torch.randn(res.size, 3, generator=gen, dtype=torch.float64)
    for term in NAMES:
        assert_close(res.matvec(V, term), getattr(res, term) @ V, 1e-12, term, atol=1e-12)
    grad = hv.gradient(cfg, params, X, loss=hv.CustomLoss(g, N))
    swept = hv.api._tape_gradient(cfg, mf.sweep_tape, res.names)
    assert_close(
        torch.cat([swept[n].reshape(-1) for n in grad]),
        torch.cat([t.reshape(-1) for t in grad.values()]),
        1e-13,
        "gradient",
        atol=1e-15,
    )
