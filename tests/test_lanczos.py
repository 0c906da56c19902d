"""The torch Lanczos core (:mod:`hessviz.matfree.lanczos`) against ``eigvalsh`` and scipy's ``eigsh``,
batched products against looped ones, products kept at a point, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hessviz as hv
from hessviz.matfree import lanczos, spectral
from hessviz.runtime import pages


def _symmetric(n: int, seed: int) -> torch.Tensor:
    A = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return 0.5 * (A + A.T)


def _reference(ev: torch.Tensor, k: int, which: str) -> torch.Tensor:
    order = {"top": (-ev).argsort(), "bottom": ev.argsort(), "magnitude": (-ev.abs()).argsort()}[which]
    return ev[order[:k]]


@pytest.mark.parametrize("which", lanczos.WHICH)
def test_extremes_match_eigvalsh(which):
    """A dense indefinite matrix (semicircle spectrum, hard for Lanczos): the 5 extremes of each
    kind to 1e-10, the stated residual met by the *true* residuals, the vectors orthonormal."""
    A = _symmetric(300, 0)
    ev = torch.linalg.eigvalsh(A)
    r = lanczos.extremes(lambda V: V @ A, 300, 5, which, tol=1e-10, like=A, vectors=True)
    assert r.converged and r.restarts > 0  # restarted, not just a long Krylov space
    torch.testing.assert_close(r.values, _reference(ev, 5, which), rtol=0, atol=1e-10)
    assert bool((r.residuals <= 1e-9 * r.values.abs()).all()), r.residuals
    torch.testing.assert_close(r.vectors @ r.vectors.T, torch.eye(5, dtype=torch.float64), rtol=0, atol=1e-10)
    again = lanczos.extremes(lambda V: V @ A, 300, 5, which, tol=1e-10, like=A)
    assert torch.equal(again.values, r.values) and again.matvecs == r.matvecs  # same seed, same numbers
    other = lanczos.extremes(lambda V: V @ A, 300, 5, which, tol=1e-10, like=A, seed=1)
    torch.testing.assert_close(other.values, r.values, rtol=0, atol=1e-10)


def test_slq_without_reorthogonalisation(case):
    """SLQ by the plain three-term recurrence (``reorth="none"``, curvlinops' way): no basis kept,
    all probes in one product per step, and the quadrature still matches the spectrum: the same
    trace estimate as the reorthogonalised run on the same probes (its first moment), the extreme
    nodes at the extreme eigenvalues (the CDF bound: ``test_slq_density_within_stated_error``)."""
    res, _ = case
    ev = torch.linalg.eigvalsh(res.full).numpy()
    plain = spectral.density(res, "full", probes=4, steps=60, seed=0, reorth="none")
    kept = spectral.density(res, "full", probes=4, steps=60, seed=0)
    assert plain.matvecs == kept.matvecs == 240
    assert abs(plain.trace - kept.trace) <= 1e-12 * abs(kept.trace)
    nodes = plain.all_nodes
    assert abs(nodes.max() - ev.max()) < 1e-8 and abs(nodes.min() - ev.min()) < 1e-8
    with pytest.raises(ValueError, match="reorth"):
        spectral.density(res, reorth="partly")


def test_float32_norms_accumulate_in_float64():
    """``lanczos.norm`` of 2 M positive float32 entries is right to float32's rounding (a CPU's float32
    ``vector_norm`` sums term after term, 1e-5 off here), rows and all; float64 is untouched."""
    x = torch.rand(2, 1 << 21, generator=torch.Generator().manual_seed(0))
    exact = torch.linalg.vector_norm(x.double(), dim=1)
    assert lanczos.norm(x[0]).dtype == torch.float32
    assert abs(float(lanczos.norm(x[0])) / float(exact[0]) - 1) < 1e-6
    assert ((lanczos.norm(x, dim=1).double() / exact - 1).abs() < 1e-6).all()
    assert torch.equal(lanczos.norm(x.double()), torch.linalg.vector_norm(x.double()))


def test_extremes_on_a_small_space_and_float32():
    """``ncv = n`` is one exact Krylov space; float32 basis and products agree to float32."""
    A = _symmetric(12, 3)
    ev = torch.linalg.eigvalsh(A)
    r = lanczos.extremes(lambda V: V @ A, 12, 3, "bottom", like=A)
    torch.testing.assert_close(r.values, ev[:3], rtol=0, atol=1e-12)
    A32 = _symmetric(200, 4).float()
    r32 = lanczos.extremes(lambda V: V @ A32, 200, 3, "top", tol=1e-5, like=A32)
    ref = torch.linalg.eigvalsh(A32.double()).flip(0)[:3]
    torch.testing.assert_close(r32.values, ref, rtol=1e-5, atol=1e-5)


def _spectrum(values: torch.Tensor, seed: int) -> torch.Tensor:
    """``Q diag(values) Qᵀ`` for a seeded random orthogonal ``Q``."""
    n = values.numel()
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return (Q * values) @ Q.T


@pytest.mark.parametrize("which", ["top", "magnitude"])
def test_the_value_bound_stops_sooner_and_holds(which):
    """``bound="value"``: each eigenvalue within ``tol`` of the truth, the stated bound ``errors`` at
    least the true error, for fewer products than the residual test at the same ``tol``; the
    recurrence's residual estimates (``check=False``) equal the true ones up to round-off."""
    A = _symmetric(400, 7)
    ev = torch.linalg.eigvalsh(A)
    truth = _reference(ev, 2, which)
    by_value = lanczos.extremes(lambda V: V @ A, 400, 2, which, tol=1e-4, like=A, bound="value")
    by_residual = lanczos.extremes(lambda V: V @ A, 400, 2, which, tol=1e-4, like=A)
    err = (by_value.values - truth).abs()
    assert bool((err <= 1e-4 * truth.abs()).all()) and bool((by_value.errors >= err).all())
    assert by_value.matvecs < by_residual.matvecs
    estimate = lanczos.extremes(lambda V: V @ A, 400, 2, which, tol=1e-4, like=A, bound="value", check=False)
    assert estimate.matvecs == by_value.matvecs - 2  # the Ritz values, the Rayleigh quotients
    torch.testing.assert_close(estimate.values, by_value.values, rtol=1e-13, atol=0)
    torch.testing.assert_close(estimate.residuals, by_value.residuals, rtol=1e-6, atol=1e-12)
    with pytest.raises(ValueError, match="bound"):
        lanczos.extremes(lambda V: V @ A, 400, 2, like=A, bound="eigenvalue")


def _three_term_run(spectrum: torch.Tensor, steps: int, reorthogonalise: bool):
    """Plain Lanczos on ``diag(spectrum)`` with Simon's estimates alongside, as the core's partial
    pass runs it; per step the true drift ``max_i |q_{j+1}ᵀ q_i|``, the estimate ``max_i |ω_{j+1,i}|``
    and whether the basis was read."""
    n = spectrum.numel()
    Q = torch.zeros(steps + 1, n, dtype=torch.float64)
    T = torch.zeros(steps, steps, dtype=torch.float64)
    q = torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    Q[0] = q / q.norm()
    omega = lanczos.Orthogonality(steps, n, torch.finfo(torch.float64).eps)
    beta, drift, estimate, passes = 0.0, [], [], []
    for j in range(steps):
        w = spectrum * Q[j]
        alpha = float(Q[j] @ w)
        lanczos.three_term_(w, Q, j, alpha, beta)
        T[j, j] = alpha
        if j:
            T[j - 1, j] = beta
        beta = float(w.norm())
        due = omega.advance(T, j, beta) and reorthogonalise
        if due:
            left = lanczos.partial_pass_(w, Q[: j + 1], omega.eps1)
            beta = float(w.norm())
            omega.orthogonalised(j, left)
        Q[j + 1] = w / beta
        drift.append(float((Q[: j + 1] @ Q[j + 1]).abs().max()))
        estimate.append(float(omega.current[: j + 1].abs().max()))
        passes.append(due)
    return drift, estimate, passes


def test_partial_reorthogonalisation_keeps_the_basis_semi_orthogonal():
    """Simon's estimates (:class:`~hessviz.matfree.lanczos.Orthogonality`) on a spectrum whose top
    converges fast, so the plain recurrence loses orthogonality within a few dozen steps: left alone,
    the true drift passes ``√ε`` and the estimate has passed it no later; with the basis read when
    the estimate asks, every vector stays within ``√ε`` of the others, for passes on a minority of
    the steps."""
    spectrum = torch.cat([10.0 * 0.7 ** torch.arange(8.0), torch.linspace(-1.0, 1.0, 3000)]).double()
    level = torch.finfo(torch.float64).eps ** 0.5
    drift, estimate, _ = _three_term_run(spectrum, 90, reorthogonalise=False)
    lost = next(j for j, d in enumerate(drift) if d > level)
    assert any(e > level for e in estimate[: lost + 1])
    drift, estimate, passes = _three_term_run(spectrum, 90, reorthogonalise=True)
    assert max(drift) <= level
    assert 0 < sum(passes) < len(passes) / 3, sum(passes)


def test_slq_partial_reorthogonalisation_reads_the_basis_rarely(monkeypatch):
    """``tridiagonal(reorth="partial")`` (SLQ's default) against ``"full"`` on two probes of a
    spectrum whose top converges fast: the same extreme nodes (Ritz values) to 1e-10, the same
    quadrature moments to 1e-12, for basis passes on under a third of the steps (full: every one)."""
    spectrum = torch.cat([10.0 * 0.7 ** torch.arange(8.0), torch.linspace(-1.0, 1.0, 3000)]).double()
    v0 = torch.randn(2, spectrum.numel(), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    passes = []
    for name in ("orthogonalise_", "partial_pass_"):
        real = getattr(lanczos, name)
        monkeypatch.setattr(lanczos, name, lambda *a, real=real, **kw: passes.append(1) or real(*a, **kw))
    runs = {}
    for reorth in ("partial", "full"):
        passes.clear()
        runs[reorth] = (lanczos.tridiagonal(lambda V: V * spectrum, v0, 80, reorth=reorth), len(passes))
    assert runs["full"][1] == 160 and 0 < runs["partial"][1] < 160 / 3, runs["partial"][1]
    for (a, b), (fa, fb) in zip(runs["partial"][0], runs["full"][0]):
        T = torch.diag(a) + torch.diag(b, 1) + torch.diag(b, -1)
        F = torch.diag(fa) + torch.diag(fb, 1) + torch.diag(fb, -1)
        theta, Y = torch.linalg.eigh(T)
        phi, Z = torch.linalg.eigh(F)
        torch.testing.assert_close(theta[-3:], phi[-3:], rtol=0, atol=1e-10)
        torch.testing.assert_close(theta[:2], phi[:2], rtol=0, atol=1e-10)
        for power in (1, 2, 3):  # vᵀHᵖv / ‖v‖², the quadrature's moments
            torch.testing.assert_close(
                (Y[0] ** 2 * theta**power).sum(), (Z[0] ** 2 * phi**power).sum(), rtol=1e-12, atol=0
            )


@pytest.mark.parametrize("which", lanczos.WHICH)
def test_partial_and_full_reorthogonalisation_agree(which):
    """The core with a semi-orthogonal first pass (the default for ``bound="value"`` in float64)
    against full reorthogonalisation and ``eigvalsh``: the same values to ``tol``, the stated
    bounds held; ``reorth`` and its default checked."""
    A = _symmetric(400, 7)
    truth = _reference(torch.linalg.eigvalsh(A), 3, which)
    runs = {
        reorth: lanczos.extremes(
            lambda V: V @ A, 400, 3, which, tol=1e-10, like=A, bound="value", reorth=reorth
        )
        for reorth in ("auto", "partial", "full")
    }
    assert torch.equal(runs["auto"].values, runs["partial"].values)
    roundoff = 100 * torch.finfo(torch.float64).eps * truth.abs()  # no bound sees below it
    for r in runs.values():
        err = (r.values - truth).abs()
        assert r.converged and bool((err <= 1e-10 * truth.abs()).all()), err
        assert bool((r.errors + roundoff >= err).all())
    assert lanczos.default_ncv(400, 3, A, "partial") == 48 and lanczos.default_ncv(400, 3, A, "full") == 20
    assert lanczos.default_ncv(10**8, 3, A, "partial") == 20  # a basis within BASIS_BYTES
    assert lanczos._reorth("auto", A, "residual") == "full"
    assert lanczos._reorth("auto", A.float(), "value") == "full"
    with pytest.raises(ValueError, match="reorth"):
        lanczos.extremes(lambda V: V @ A, 400, 3, like=A, reorth="selective")


def test_the_largest_magnitude_waits_for_both_ends():
    """An isolated top eigenvalue (fast to converge) and a slightly larger negative one at the edge of
    a dense cluster (slow): ``which="magnitude"`` must return the negative one, under either bound,
    though the top end passes its own test long before."""
    values = torch.cat([torch.tensor([1.0]), torch.linspace(-1.02, 0.2, 299)]).to(torch.float64)
    A = _spectrum(values, 4)
    for bound in lanczos.BOUNDS:
        r = lanczos.extremes(lambda V: V @ A, 300, 1, "magnitude", tol=1e-3, like=A, bound=bound)
        assert float(r.values[0]) == pytest.approx(-1.02, rel=1e-3), (bound, r)


def test_a_start_near_the_answer_saves_products():
    """A start vector near the top eigenvector (the seeded normal mixed in) converges in fewer
    products to the same value; a zero start is the seeded start; a wrong shape is refused."""
    values = torch.linspace(0.0, 1.0, 300, dtype=torch.float64) ** 3
    A = _spectrum(values, 1)
    u = torch.linalg.eigh(A).eigenvectors[:, -1]
    noise = torch.randn(300, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    guess = u + 0.3 * noise / 300**0.5
    cold = lanczos.extremes(lambda V: V @ A, 300, 1, tol=1e-8, like=A)
    warm = lanczos.extremes(lambda V: V @ A, 300, 1, tol=1e-8, like=A, start=guess)
    assert warm.matvecs < cold.matvecs
    torch.testing.assert_close(warm.values, cold.values, rtol=1e-12, atol=0)
    zero = lanczos.extremes(
        lambda V: V @ A, 300, 1, tol=1e-8, like=A, start=torch.zeros(300, dtype=torch.float64)
    )
    assert torch.equal(zero.values, cold.values) and zero.matvecs == cold.matvecs
    with pytest.raises(ValueError, match="start"):
        lanczos.extremes(lambda V: V @ A, 300, 1, like=A, start=torch.ones(299, dtype=torch.float64))
    with pytest.raises(ValueError, match="start"):
        lanczos.extremes(lambda V: V @ A, 300, 1, like=A, start=torch.full((300,), float("nan")))


def test_k1_stops_on_an_invariant_krylov_space():
    """A rank-2 block (a classifier head's on two sequences): the Krylov space is invariant after
    two products, which hold the top eigenvalue exactly; ``k = 1`` stops there instead of filling
    the basis with null vectors, ``k = 2`` (which might lack a repeated eigenvalue) does not."""
    values = torch.zeros(200, dtype=torch.float64)
    values[-2:] = torch.tensor([0.5, 3.0], dtype=torch.float64)
    A = _spectrum(values, 3)
    one = lanczos.extremes(lambda V: V @ A, 200, 1, tol=1e-10, like=A)
    assert one.matvecs <= 4 and one.converged
    torch.testing.assert_close(one.values, torch.tensor([3.0], dtype=torch.float64), rtol=1e-12, atol=0)
    two = lanczos.extremes(lambda V: V @ A, 200, 2, tol=1e-10, like=A)
    torch.testing.assert_close(two.values, torch.tensor([3.0, 0.5], dtype=torch.float64), rtol=1e-12, atol=0)


def _case_inputs():
    cfg = hv.BlockConfig(
        seq_len=5,
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
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0, input_norm=4.0)
    return cfg, params, X, Y


@pytest.fixture(scope="module")
def case():
    res = hv.hessian(*_case_inputs())
    return res, {t: torch.linalg.eigvalsh(res.term(t)).numpy() for t in ("full", "outer")}


@pytest.mark.parametrize("which", ["top", "bottom", "magnitude"])
def test_torch_core_matches_eigvalsh_and_eigsh(case, which):
    """On a block's products (P ≈ 900, indefinite ``full``): the torch core, scipy ``eigsh`` and
    the dense ``eigvalsh`` agree to 1e-8 relative; the returned residuals are true ones."""
    res, eig = case
    for term in ("full", "outer") if which == "top" else ("full",):
        ours = spectral.eigenpairs(res, term, 4, which, solver="torch", vectors=True)
        ref = spectral.eigenpairs(res, term, 4, which, solver="scipy")
        dense = _reference(torch.from_numpy(eig[term]), 4, which).sort().values.numpy()
        np.testing.assert_allclose(ours.values, dense, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(ours.values, ref.values, rtol=1e-8, atol=1e-10)
        assert ours.method.startswith("thick-restart") and ref.method.endswith("eigsh)")
        assert ours.converged and ours.residuals is not None
        v = torch.from_numpy(ours.vectors)
        true = torch.linalg.vector_norm(res.matvec(v, term) - v * torch.from_numpy(ours.values), dim=0)
        np.testing.assert_allclose(ours.residuals, true.numpy(), rtol=1e-6, atol=1e-14)
        assert bool((true <= 1e-8 * torch.from_numpy(ours.values).abs() + 1e-12).all())


def test_block_table_and_density_use_the_torch_core(case):
    """Blocks past ``exact_limit`` go through the torch core (P' ≥ SCIPY_BELOW would anyway);
    the SLQ density comes from its ``tridiagonal``."""
    res, _ = case
    table = spectral.block_table(
        res, "full", ("W_Q[0]", "W_1", "ln1_gamma"), exact_limit=0, trace_samples=6, seed=0
    )
    for row in table.rows:
        H = res.block(row.name, row.name)
        assert abs(row.top - float(torch.linalg.eigvalsh(H)[-1])) <= 1e-6 * max(1.0, abs(row.top))
    d = spectral.density(res, "full", probes=1, steps=res.size, seed=0)
    ev = torch.linalg.eigvalsh(res.full).numpy()
    assert np.abs(np.sort(d.nodes[0])[[0, -1]] - ev[[0, -1]]).max() < 1e-9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_torch_core_on_cuda_matches_cpu(case):
    """The core runs on the device of the products: top-4, the SLQ nodes and a batched product on
    CUDA equal the CPU's (same seeds, the start vectors drawn on the host), every reorthogonalisation."""
    res, eig = case
    cfg, params, X, Y = _case_inputs()
    gpu = hv.hessian(cfg, {n: w.cuda() for n, w in params.items()}, X.cuda(), Y.cuda())
    for kw in ({}, {"bound": "value"}):
        ours = spectral.eigenpairs(gpu, "full", 4, "top", solver="torch", **kw)
        ref = spectral.eigenpairs(res, "full", 4, "top", solver="torch", **kw)
        np.testing.assert_allclose(ours.values, ref.values, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(ours.values, np.sort(eig["full"])[-4:], rtol=1e-8, atol=1e-10)
    for reorth in ("none", "partial", "full"):  # rounding differs: what the quadrature rests on agrees
        d_gpu = spectral.density(gpu, "full", probes=3, steps=40, seed=0, reorth=reorth)
        d_cpu = spectral.density(res, "full", probes=3, steps=40, seed=0, reorth=reorth)
        assert d_gpu.matvecs == d_cpu.matvecs == 120
        assert abs(d_gpu.trace - d_cpu.trace) <= 1e-10 * abs(d_cpu.trace)
        for lo_hi in (np.min, np.max):
            assert abs(lo_hi(d_gpu.all_nodes) - lo_hi(d_cpu.all_nodes)) <= 1e-8 * np.abs(eig["full"]).max()
    V = torch.randn(res.size, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = gpu.matvec(V.T.contiguous().T.cuda())
    assert out.device.type == "cuda"
    ref = res.matvec(V)
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=1e-12 * float(ref.abs().max()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_products_replay_as_graphs_bit_identically(monkeypatch):
    """On a GPU the second product of a kind is recorded as a CUDA graph and later ones replayed:
    single, batched and into a basis row, each bit-identical to the products run as usual
    (``HESSVIZ_CUDA_GRAPHS=0``), and so is a whole top-4 and SLQ run; a head-slice block too."""
    from hessviz.products import graphs

    cfg, params, X, Y = _case_inputs()
    on_gpu = ({n: w.cuda() for n, w in params.items()}, X.cuda(), Y.cuda())
    replayed = hv.hessian(cfg, *on_gpu)
    gen = torch.Generator().manual_seed(5)
    vs = [torch.randn(replayed.size, generator=gen, dtype=torch.float64).cuda() for _ in range(3)]
    V = torch.randn(replayed.size, 3, generator=gen, dtype=torch.float64).cuda()
    rows, cols = ["W_Q[1]", "W_1"], ["W_K[0]", "ln1_gamma"]
    W = torch.randn(replayed.products.layout(cols).size, 2, generator=gen, dtype=torch.float64).cuda()

    def run(res):
        out = [res.matvec(v, term) for v in vs for term in ("full", "outer")]
        out += [res.matvec(V), res.matvec(V), res.matvec(W, "full", rows=rows, cols=cols)]
        out += [res.matvec(W, "full", rows=rows, cols=cols)]
        top = spectral.eigenpairs(res, "full", 4, "top", solver="torch")
        dens = spectral.density(res, "full", probes=3, steps=30, seed=0)
        return out, top, dens

    got, top, dens = run(replayed)
    recorded = replayed.products.kept(graphs.Replays, graphs.Replays)._graphs
    assert sum(r is not None for r in recorded.values()) >= 4, recorded.keys()
    monkeypatch.setenv(graphs.ENV, "0")
    want, top0, dens0 = run(hv.hessian(cfg, *on_gpu))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert np.array_equal(top.values, top0.values) and top.matvecs == top0.matvecs
    assert np.array_equal(dens.all_nodes, dens0.all_nodes)


def in_layout(V: torch.Tensor, layout: str) -> torch.Tensor:
    """``V (n, k)`` with the same values in ``layout``: C- or F-contiguous, the transpose of rows of a
    ``(k + 2, n)`` tensor, every other column of a ``(n, 2k)`` tensor, or float32 (cast on the way in)."""
    if layout == "C":
        return V.contiguous()
    if layout == "F":
        return V.T.contiguous().T
    if layout == "transpose":  # rows 1..k of a (k + 2, n) tensor, transposed
        W = torch.zeros(V.shape[1] + 2, V.shape[0], dtype=V.dtype)
        W[1:-1] = V.T
        return W[1:-1].T
    if layout == "slice":
        W = torch.zeros(V.shape[0], 2 * V.shape[1], dtype=V.dtype)
        W[:, ::2] = V
        return W[:, ::2]
    return V.float()


@pytest.mark.parametrize("layout", ["C", "F", "transpose", "slice", "float32"])
def test_batched_products_equal_looped(case, layout):
    """``res.matvec(V)``, ``V (P, k)`` in any layout (C- or F-contiguous, a transpose, a column
    slice; float32 cast), equals ``k`` single products to 1e-15 (each column runs the same GEMMs as
    alone), for whole weights and for head slices (whose products are gathered by copy, not written
    in place). The columns are taken by one tiled copy (``hessviz.products.columns``), exact."""
    res, _ = case
    V = torch.randn(res.size, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    V = in_layout(V, layout)
    assert V.is_contiguous() == (layout in ("C", "float32"))
    for term in ("full", "outer", "functional"):
        batched = res.matvec(V, term)
        looped = torch.stack([res.matvec(V[:, i].contiguous(), term) for i in range(7)], 1)
        assert batched.shape == V.shape
        torch.testing.assert_close(batched, looped, rtol=0, atol=1e-15 * float(looped.abs().max()))
    rows, cols = ["W_Q[1]", "W_1", "b_O"], ["W_K[0]", "W_2", "ln1_gamma"]
    n = res.products.layout(cols).size
    W = in_layout(torch.randn(n, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64), layout)
    batched = res.matvec(W, "full", rows=rows, cols=cols)
    looped = torch.stack(
        [res.matvec(W[:, i].contiguous(), "full", rows=rows, cols=cols) for i in range(5)], 1
    )
    torch.testing.assert_close(batched, looped, rtol=0, atol=1e-15 * float(looped.abs().max()))


@pytest.mark.parametrize("k", [4, 11])
def test_c_order_and_sliced_columns_are_swept_columns_last(case, monkeypatch, k):
    """On the CPU the closed-form engine sweeps a C-contiguous ``V (P, k)`` as it is when ``k ≤ BATCH``
    (its weight tangents are views of ``V``: ``hessviz.ops.batched.columns_last``), and a column slice,
    or a wider C block's chunks, after one streaming copy in C order, into a buffer the point lends
    again on the next call; the products equal ``k`` single ones to 1e-15."""
    from hessviz.products import operator

    res, _ = case
    swept: list[list[tuple[int, int]]] = []
    swept_chunks = operator.swept_chunks

    def recorded(V, bounds, columns_last, scratch=None):
        got = swept_chunks(V, bounds, columns_last, scratch)
        swept.append([(c.data_ptr(), c.stride(0)) for c in got])
        return got

    monkeypatch.setattr(operator, "swept_chunks", recorded)
    gen = torch.Generator().manual_seed(6)
    base = torch.randn(res.size, k, generator=gen, dtype=torch.float64)
    looped = torch.stack([res.matvec(base[:, i].contiguous()) for i in range(k)], 1)
    for layout in ("C", "slice"):
        V = in_layout(base, layout)
        swept.clear()
        for _ in range(2):  # the second call borrows the first call's buffer
            got = res.matvec(V)
            torch.testing.assert_close(got, looped, rtol=0, atol=1e-15 * float(looped.abs().max()))
        first, second = swept
        assert len(first) == -(-k // operator.BATCH) and all(stride == 1 for _, stride in first)
        if layout == "C" and k <= operator.BATCH:
            assert first == [(V.data_ptr(), 1)]  # no copy at all
        else:
            assert all(ptr != V.data_ptr() for ptr, _ in first) and first == second  # the same buffer


def test_chunks_in_c_order_are_one_exact_tiled_copy(monkeypatch):
    """``swept_chunks``: a C block or a column slice of ``k`` columns, in chunks of sizes 3, 4, 4, copied
    in C order in tiles of rows (5 here), chunk by chunk the transpose of a C-contiguous block, bit for
    bit; unit-stride rows and non-columns-last engines are not copied in C order."""
    from hessviz.products import columns

    monkeypatch.setattr(columns, "TILE_BYTES", 64 * 8 * 11)  # 1 024-row tiles of the (n, 11) rows
    V = torch.randn(4100, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    bounds = [(0, 3), (3, 7), (7, 11)]
    for block in (V, torch.cat([V, V], 1)[:, ::2]):
        got = columns.swept_chunks(block.T, bounds, True)
        for (a, b), chunk in zip(bounds, got, strict=True):
            assert columns.is_columns_last(chunk) and torch.equal(chunk, block.T[a:b])
        assert got[0].data_ptr() != block.data_ptr()
    assert columns.swept_chunks(V.T, [(0, 11)], True)[0].data_ptr() == V.data_ptr()  # one C chunk: itself
    F = V.T.contiguous()
    assert all(c.stride(1) == 1 for c in columns.swept_chunks(V.T, bounds, False))  # unit rows (tiled)
    assert columns.swept_chunks(F, bounds, True)[1].data_ptr() == F[3].data_ptr()  # rows: views


def test_columns_are_taken_without_a_copy_or_by_one_exact_tiled_copy(monkeypatch):
    """``unit_rows``: unit-stride rows are handed back as they are (no copy); a transposed or sliced
    block is copied in tiles (several here: the tile is shrunk) bit for bit, into ``out`` when given."""
    from hessviz.products import columns
    from hessviz.products.hessian_operator import as_columns

    monkeypatch.setattr(columns, "TILE_BYTES", 64 * 8 * 3)  # 1 024-column tiles: 5 of them below
    V = torch.randn(4100, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    F = V.T.contiguous()
    same, _ = as_columns(F.T, 4100, V)
    assert same.data_ptr() == F.data_ptr()  # a (k, n) tensor's transpose: a view
    for block in (V, torch.cat([V, V], 1)[:, ::2]):
        got, _ = as_columns(block, 4100, V)
        assert got.stride(1) == 1 and torch.equal(got, block.T)
    out = torch.empty(3, 4100, dtype=torch.float64)
    assert columns.unit_rows(V.T, out) is out and torch.equal(out, V.T)


def test_whole_weight_products_are_written_in_place(case):
    """The sweep writes each whole weight's product into its columns of the result
    (``Layout.destinations``): the product handed back *is* that view, so nothing is copied."""
    from hessviz.products.tape import sweep

    res, _ = case
    mf = res.products
    lay = mf.layout()
    V = torch.randn(3, lay.size, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    out = torch.empty(3, lay.size, dtype=torch.float64)
    into = lay.destinations(out)
    prods = sweep([mf.tape], lay.scatter(V), "full", lay.bases, into=into)
    for name in ("W_Q", "W_O", "W_1", "W_2"):
        assert prods[name].data_ptr() == into[name].data_ptr() and prods[name].stride() == into[name].stride()
    torch.testing.assert_close(lay.gather(prods, 3, V, out=out), lay.gather(prods, 3, V), rtol=0, atol=0)
    torch.testing.assert_close(out, mf.operator().apply(V), rtol=0, atol=0)


def test_large_buffers_are_plain_tensors():
    """:func:`pages.empty` above the huge-page threshold is an ordinary contiguous tensor of the
    asked shape, dtype and device (the advice changes the mapping only)."""
    like = torch.zeros(1, dtype=torch.float64)
    n = pages.HUGE_FROM // 8 + 12345
    t = pages.empty((3, n), like)
    assert t.shape == (3, n) and t.dtype == torch.float64 and t.is_contiguous()
    src = torch.randn(3, n, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    t.copy_(src)
    assert torch.equal(t, src)
    assert pages.empty((2, 3), like.float()).dtype == torch.float32


def test_products_kept_at_the_point_repeat_exactly(case):
    """The forward record, the first-order adjoints and the loss curvature are kept: a repeated
    product gives the same bits, and a fresh result at the same point the same numbers."""
    res, _ = case
    v = torch.randn(res.size, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    tape = res.products.tape
    first = res.matvec(v)
    for _ in range(3):
        assert torch.equal(res.matvec(v), first)
    assert res.products.tape is tape  # built once
    cfg = res.cfg
    fresh = hv.hessian(cfg, hv.init_params(cfg, seed=0), *hv.sample_inputs(cfg, seed=0, input_norm=4.0))
    torch.testing.assert_close(fresh.matvec(v), first, rtol=0, atol=1e-14)


def test_bad_arguments_name_the_argument(case):
    res, _ = case
    n = res.size
    A = _symmetric(10, 0)
    with pytest.raises(ValueError, match="k must be < the operator size"):
        spectral.eigenpairs(res, k=n, solver="torch")
    with pytest.raises(ValueError, match="k must be < the operator size"):
        lanczos.extremes(lambda V: V @ A, 10, 10, like=A)
    for tol in (0.0, -1e-3, float("nan")):
        with pytest.raises(ValueError, match="tol"):
            spectral.eigenpairs(res, tol=tol)
        with pytest.raises(ValueError, match="tol"):
            lanczos.extremes(lambda V: V @ A, 10, 2, tol=tol, like=A)
    with pytest.raises(ValueError, match="ncv"):
        lanczos.extremes(lambda V: V @ A, 10, 2, ncv=2, like=A)
    with pytest.raises(ValueError, match="which"):
        lanczos.extremes(lambda V: V @ A, 10, 2, "largest", like=A)
    with pytest.raises(ValueError, match="probes"):
        spectral.density(res, probes=0)
    with pytest.raises(ValueError, match="samples"):
        spectral.trace(res, samples=0, method="hutchinson")
    with pytest.raises(ValueError, match="solver"):
        spectral.eigenpairs(res, solver="arpack")
    with pytest.raises(ValueError, match="v must be a floating-point"):
        res.matvec(torch.ones(n, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="probes"):
        spectral.density(res, probes=-3, reorth="none")
    v32 = torch.randn(n, 3, generator=torch.Generator().manual_seed(8)).float()  # cast, as documented
    assert torch.equal(res.matvec(v32), res.matvec(v32.double()))
    assert torch.equal(res.matvec(v32.numpy()), res.matvec(v32.double()))


def test_torch_core_reports_progress_and_cancels(case):
    res, _ = case
    seen = []

    class Stop(Exception):
        pass

    def cancel(done, total, msg):
        seen.append(done)
        if done >= 5:
            raise Stop

    with pytest.raises(Stop):
        spectral.eigenpairs(res, "full", 2, solver="torch", progress=cancel)
    assert seen == [1, 2, 3, 4, 5]


def test_dense_extremes_use_the_torch_core():
    """:func:`hessviz.matfree.spectra.eigenvalues` past ``dense_limit``: the ``k`` largest and smallest of a
    dense ``H`` by the torch core, equal to ``eigvalsh``'s."""
    from hessviz.matfree import spectra

    A = _symmetric(150, 5)
    spec = spectra.eigenvalues(A, k=4, dense_limit=100)
    ev = torch.linalg.eigvalsh(A).numpy()
    assert spec.partial and spec.method.startswith("thick-restart Lanczos")
    np.testing.assert_allclose(spec.values, np.concatenate([ev[:4], ev[-4:]]), rtol=0, atol=1e-9)


def test_speed_section_is_rewritten_in_place(tmp_path):
    """The bench section of MATFREE.md is replaced, not appended, and the rest of the file kept."""
    from hessviz.bench import matfree_spectra

    row = {
        "row": "slq",
        "L": 8,
        "P": 10,
        "probes": 2,
        "steps": 3,
        "seconds": 1.5,
        "products": 6,
        "peak_mib": 1.0,
        "support": [-1.0, 2.0],
        "load": (1.0, 1.0, 1.0),
    }
    out = tmp_path / "MATFREE.md"
    out.write_text("# Products\n\nold table\n")
    matfree_spectra.write_section(out, matfree_spectra.markdown([row]), "first\n\n")
    matfree_spectra.write_section(out, matfree_spectra.markdown([dict(row, seconds=2.5)]), "second\n\n")
    text = out.read_text()
    assert text.startswith("# Products\n\nold table\n") and text.count(matfree_spectra.SECTION) == 1
    assert "second" in text and "2.5 s, 6 products" in text and "first" not in text


def test_speed_cases_round_trip(tmp_path, monkeypatch):
    """``--save-cases`` keeps the bench's layer and text for a machine without the checkpoint:
    ``$HESSVIZ_SPEED_CASES`` gives back the same tensors, on the device asked for; a length not
    saved is refused by name."""
    from hessviz.bench import matfree_spectra

    f64 = torch.float64
    saved = {
        3: (
            hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=8),
            {"W_Q": torch.eye(4, dtype=f64)},
            torch.ones(3, 4, dtype=f64),
            torch.zeros(3, 4, dtype=f64),
        )
    }
    torch.save(saved, tmp_path / "cases.pt")
    monkeypatch.setenv(matfree_spectra.CASES_ENV, str(tmp_path / "cases.pt"))
    cfg, params, X, Y = matfree_spectra.real_case(3, "cpu")
    assert cfg == saved[3][0] and torch.equal(X, saved[3][2])
    assert torch.equal(params["W_Q"], saved[3][1]["W_Q"])
    with pytest.raises(ValueError, match="seq_len 5 is not among the saved cases"):
        matfree_spectra.real_case(5)
