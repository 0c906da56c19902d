"""Lanczos breakdown (issue 33): a Krylov space that closes (``β = 0``, or ``β`` at round-off) is an
answer, not an error. The torch core (:func:`hessviz.matfree.lanczos.extremes`), the SLQ
tridiagonalisation and Hutch++ on multiples of the identity, low-rank operators, a start in an
eigenspace and the zero operator, against ``torch.linalg.eigvalsh`` of the dense matrix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hessviz as hv
from hessviz.matfree import lanczos, spectral
from hessviz.pretrained import explore

EPS = torch.finfo(torch.float64).eps


def _in_basis(values: list[float], n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, Q)``: ``A = Q diag(values, 0, …, 0) Qᵀ`` (``n × n``) in a random orthonormal basis ``Q``."""
    Q, _ = torch.linalg.qr(
        torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    )
    d = torch.zeros(n, dtype=torch.float64)
    d[: len(values)] = torch.tensor(values, dtype=torch.float64)
    return (Q * d) @ Q.T, Q


def _operators() -> dict[str, tuple[torch.Tensor, torch.Tensor | None, int]]:
    """name: ``(A, start or None, a k beyond its distinct eigenvalues)``."""
    eigenspace, Q = _in_basis([2.0] * 6 + [1.0] * 34, 40, 2)
    return {
        "identity / 32": (torch.eye(64, dtype=torch.float64) / 32, None, 5),
        "rank 2": (_in_basis([3.0, -0.5], 50, 1)[0], None, 5),
        "start in an eigenspace": (eigenspace, Q[:, :6].sum(1), 8),
        "zero": (torch.zeros(30, 30, dtype=torch.float64), None, 4),
    }


OPERATORS = _operators()


def _reference(ev: torch.Tensor, k: int, which: str) -> torch.Tensor:
    order = {"top": (-ev).argsort(), "bottom": ev.argsort(), "magnitude": (-ev.abs()).argsort()}[which]
    return ev[order[:k]]


def _magnitudes(values: torch.Tensor, which: str) -> torch.Tensor:
    """``which="magnitude"`` ranks ``+1`` and ``−1`` alike: compare ``|λ|`` there."""
    return values.abs() if which == "magnitude" else values


@pytest.mark.parametrize("name", list(OPERATORS))
@pytest.mark.parametrize("which", lanczos.WHICH)
def test_an_invariant_space_gives_the_exact_eigenpairs(name, which):
    """Each operator, each ``which``, both bounds, ``k = 1, 3`` and a ``k`` beyond its distinct
    eigenvalues: the values of ``eigvalsh`` to float64 round-off, orthonormal vectors with true
    residuals at round-off, and ``converged``."""
    A, start, many = OPERATORS[name]
    n = A.shape[0]
    ev = torch.linalg.eigvalsh(A)
    scale = max(float(ev.abs().max()), 1.0 if name == "zero" else 0.0)
    for bound in lanczos.BOUNDS:
        for k in (1, 3, many):
            r = lanczos.extremes(lambda V: V @ A, n, k, which, like=A, bound=bound, vectors=True, start=start)
            truth = _reference(ev, k, which)
            err = (_magnitudes(r.values, which) - _magnitudes(truth, which)).abs().max()
            assert r.converged and float(err) <= 64 * EPS * scale, (bound, k, r.values, truth)
            true = torch.linalg.vector_norm(r.vectors @ A - r.values[:, None] * r.vectors, dim=1)
            assert float(true.max()) <= 1e-13 * scale, (bound, k, true)
            gram = r.vectors @ r.vectors.T
            torch.testing.assert_close(gram, torch.eye(k, dtype=torch.float64), rtol=0, atol=1e-12)


def test_an_invariant_space_costs_a_product_a_value():
    """What the breakdown costs: a multiple of the identity, one product per value (and the ``k``
    products of the check); a rank-2 operator, its three-dimensional Krylov space, then a product or
    two in the null space (round-off decides) when more than its top two are wanted; ``k`` up to
    ``n − 1`` still exact."""
    A, _, _ = OPERATORS["identity / 32"]
    for k in (1, 3):
        r = lanczos.extremes(lambda V: V @ A, 64, k, like=A)
        assert r.matvecs == 2 * k and r.restarts == 0
    full = lanczos.extremes(lambda V: V @ A, 64, 63, "bottom", like=A, bound="value", check=False)
    assert full.converged and full.matvecs == 63
    torch.testing.assert_close(
        full.values, torch.full((63,), 1 / 32, dtype=torch.float64), rtol=4 * EPS, atol=0
    )
    R, _, _ = OPERATORS["rank 2"]
    assert lanczos.extremes(lambda V: V @ R, 50, 1, like=R, check=False).matvecs == 3
    assert lanczos.extremes(lambda V: V @ R, 50, 3, like=R, check=False).matvecs <= 5


def test_the_closure_test_is_relative():
    """β is compared with ``ε √n ‖T‖``, not with an absolute floor: the rank-2 operator scaled by
    ``1e-30`` gives the same eigenvalues scaled, and a float32 identity closes at float32's round-off."""
    R, _, _ = OPERATORS["rank 2"]
    tiny = R * 1e-30
    for which in lanczos.WHICH:
        r = lanczos.extremes(lambda V: V @ tiny, 50, 3, which, like=tiny)
        truth = _reference(torch.linalg.eigvalsh(tiny), 3, which)
        assert float((r.values - truth).abs().max()) <= 64 * EPS * 3e-30
    eye = 3 * torch.eye(50)
    r32 = lanczos.extremes(lambda V: V @ eye, 50, 4, "top", tol=1e-5, like=eye)
    assert r32.converged and r32.matvecs == 8
    assert float((r32.values - 3.0).abs().max()) <= 8 * torch.finfo(torch.float32).eps * 3


def test_a_repeated_ritz_value_has_a_finite_error_bound():
    """``value_error`` with a zero gap (copies of one eigenvalue) and a zero residual: 0, not 0/0."""
    theta = torch.tensor([1.0, 1.0, 0.5], dtype=torch.float64)
    out = lanczos.value_error(theta, torch.tensor([0.0, 1e-3, 0.1], dtype=torch.float64), 2)
    torch.testing.assert_close(out, torch.tensor([0.0, 1e-3], dtype=torch.float64), rtol=0, atol=0)
    with pytest.raises(ValueError, match="beta > 0"):
        lanczos.Orthogonality(4, 10, EPS).advance(torch.eye(4, dtype=torch.float64), 0, 0.0)


@pytest.mark.parametrize("reorth", lanczos.REORTH)
def test_slq_quadrature_is_exact_with_fewer_nodes(reorth):
    """A probe whose Krylov space closes stops there: one node for a multiple of the identity and for
    the zero operator, three for a rank-2 operator (its two values and 0), and those nodes and weights
    are the probe's measure exactly: ``Σ τ_j θ_j^p = vᵀ A^p v / vᵀ v`` for ``p ≤ 5`` to round-off.
    The same at ``1e-30`` of the scale (the old absolute floor stopped such a probe after one step).
    Without a basis (``"none"``) the plain recurrence can leave β at 100 ε rather than round-off on the
    rank-2 operator and go on with ghosts: more nodes, the same moments."""
    R, _, _ = OPERATORS["rank 2"]
    cases = [(OPERATORS["identity / 32"][0], 1), (OPERATORS["zero"][0], 1), (R, 3), (R * 1e-30, 3)]
    for A, nodes in cases:
        n = A.shape[0]
        v0 = torch.randn(2, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        runs = lanczos.tridiagonal(lambda V, A=A: V @ A, v0, 20, reorth=reorth)
        scale = max(float(torch.linalg.matrix_norm(A, 2)), 1e-300)
        for (alpha, beta), v in zip(runs, v0):
            assert len(beta) == len(alpha) - 1
            assert len(alpha) == nodes or (reorth == "none" and nodes > 1)
            T = torch.diag(alpha) + torch.diag(beta, 1) + torch.diag(beta, -1)
            theta, Y = torch.linalg.eigh(T)
            tau = Y[0] ** 2
            u = v / torch.linalg.vector_norm(v)
            for p in range(6):
                moment = float((tau * theta**p).sum())
                exact = float(u @ torch.linalg.matrix_power(A, p) @ u)
                assert abs(moment - exact) <= 1e-13 * scale**p, (p, moment, exact)
    with pytest.raises(ValueError, match="nonzero"):
        lanczos.tridiagonal(lambda V: V @ R, torch.zeros(1, 50, dtype=torch.float64), 5, reorth=reorth)


@pytest.fixture(scope="module")
def b2():
    """The issue's repro: the ``b_2`` block of a Pre-LN block at ``d_model = 64``, whose Hessian is
    exactly ``I / 32`` (the loss ``‖Z − Y‖² / (L d)`` and ``Z`` linear in ``b_2``)."""
    cfg = hv.BlockConfig(seq_len=3, d_model=64, d_k=4, d_ff=8, norm="pre", bias=True)
    return hv.hessian(cfg, hv.init_params(cfg, seed=0), *hv.sample_inputs(cfg, seed=0), wrt=("b_2",))


def test_the_issue_repro_through_the_public_api(b2):
    """``eigenpairs(res, k=3, solver="torch", start=torch.ones(64), bound="value")`` raised
    ``ZeroDivisionError`` for every ``which``; now ``1/32`` for any ``k``, either bound, with vectors;
    the functional term (zero) gives 0."""
    assert torch.equal(b2.full, torch.eye(64, dtype=torch.float64) / 32)
    for which in lanczos.WHICH:
        for bound in lanczos.BOUNDS:
            for k in (1, 3, 10):
                e = hv.matfree.eigenpairs(
                    b2, k=k, which=which, solver="torch", start=torch.ones(64), bound=bound, vectors=True
                )
                assert e.converged and np.allclose(e.values, 1 / 32, rtol=0, atol=64 * EPS / 32), e.values
                np.testing.assert_allclose(e.vectors.T @ e.vectors, np.eye(k), rtol=0, atol=1e-12)
    zero = hv.matfree.eigenpairs(b2, "functional", k=3, which="magnitude", solver="torch", bound="value")
    assert zero.converged and bool((zero.values == 0).all())


def test_slq_and_hutchpp_on_the_closed_blocks(b2):
    """SLQ on ``I / 32``: one node a probe at ``1/32``, the trace ``64 / 32 = 2`` exactly; on the zero
    functional term one node at 0. Hutch++ on the zero term: 0 with no spread; on a rank-deficient
    term (the outer term ``JᵀAJ`` of ``W_1`` at ``L = 1``, rank ≤ ``d = 4`` of 64), whose sketch holds
    its whole range: the dense trace to round-off."""
    d = spectral.density(b2, "full", probes=3, steps=10)
    assert d.matvecs == 30 and [len(x) for x in d.nodes] == [1, 1, 1]
    assert np.allclose(d.all_nodes, 1 / 32, rtol=0, atol=4 * EPS) and d.trace == pytest.approx(2.0, abs=1e-14)
    flat = spectral.density(b2, "functional", probes=2, steps=10)
    assert bool((flat.all_nodes == 0).all()) and flat.trace == 0.0
    t = spectral.trace(b2, "functional", 30)
    assert t.value == 0.0 and t.stderr == 0.0
    cfg = hv.BlockConfig(seq_len=1, d_model=4, d_k=2, d_ff=16)
    low = hv.hessian(cfg, hv.init_params(cfg, seed=0), *hv.sample_inputs(cfg, seed=0), wrt=("W_1",))
    outer = low.term("outer")
    assert int(torch.linalg.matrix_rank(outer)) <= 4 and low.size == 64
    est = spectral.trace(low, "outer", 30)
    exact = float(torch.trace(outer))
    assert abs(est.value - exact) <= 1e-12 * abs(exact) and est.stderr <= 1e-12 * abs(exact)
    top = spectral.eigenpairs(low, "outer", k=6, which="top", solver="torch", bound="value")
    truth = np.sort(torch.linalg.eigvalsh(outer).numpy())[-6:]
    np.testing.assert_allclose(top.values, truth, rtol=0, atol=1e-13 * abs(truth).max())


def test_the_curvature_table_of_an_identity_block():
    """The Real model page's path (``explore.curvature_table``, Lanczos with ``bound="value"`` past
    ``EXACT_BLOCK`` entries) on a block whose Hessian is ``I / 512`` with a start for which β is exactly
    0 (``d = 1024``: the Rademacher start's ``±1/32`` entries are exact): it raised
    ``ZeroDivisionError``; now the top eigenvalue ``1/512``."""
    cfg = hv.BlockConfig(seq_len=2, d_model=1024, d_k=2, d_ff=4, norm="pre", bias=True)
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0)
    out = explore.curvature_table(cfg, params, X, Y, None, ["b_2"], samples=30)
    assert (
        out["names"] == ["b_2"] and not out["exact"][0] and out["top"][0] == pytest.approx(1 / 512, abs=1e-18)
    )
