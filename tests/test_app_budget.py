"""The budget's estimates against the CPU the views really use, on this machine.

Every page asks :func:`hessviz.app.budget.cost` before it computes; the estimate decides whether a
view runs, and says "about 25 s" before a long one. Here a few representative views run through the
app's own cache functions (the code path of a live view), one torch thread as the app runs
(``app.py``), and their measured CPU must lie within a factor 2 of the estimate either way.

The CPU is the calling thread's (:func:`time.thread_time`; on one torch thread the view's work runs
there), so a background thread of the test process does not count, and it is the least of
:data:`REPEATS` runs from a cleared cache: contention on a shared machine only adds time, and one
noisy run once read 2.06 on a view that reads 0.9 here. Small cases only (about 8 s in all); the
large ones are measured by ``benchmarks/``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from hessviz.app import budget, cache
from hessviz.app.state import View

FACTOR = 2.0
REPEATS = 3


def _map(v: View) -> None:
    from hessviz import plots

    H = cache.term(v.key, "full")
    cache.block_norms(v.key, "full", "spectral")
    plots.hessian_heatmap(H, cache.offsets(v.key))


def _spectrum(v: View) -> None:
    for t in ("full", "outer", "functional"):
        cache.spectrum(v.key, t, k=64)
        cache.block_norms(v.key, t, "spectral")


def _ln_block(v: View) -> None:
    sig = np.logspace(0, -1, 4)
    c = v.cfg
    cache.ln_block_sweep(tuple(sig), c.ln_eps, (0,), c.seq_len, c.d_model, c.d_k, c.d_ff, v.input_norm, True)


def _heterogeneity(v: View) -> None:
    cache.block_table(v.key, "full", True, 30, 0)


def _matfree(v: View) -> None:
    for t in ("full", "outer", "functional"):
        cache.matfree_spectrum(v.key, t, 5, 4, 30, 0)


VIEWS = {  # id: (kind, sidebar values, the view's computations, the budget's extras)
    "map d=24": ("map", {"d": 24, "dff": 48}, _map, {}),
    "spectrum": ("spectrum", {}, _spectrum, {"dense_limit": 4096, "k": 64}),
    "ln_collapse block": ("ln_collapse", {}, _ln_block, {"points": 4, "whole": 1}),
    "heterogeneity d=32": (
        "heterogeneity",
        {"d": 32, "dff": 64},
        _heterogeneity,
        {"samples": 30, "by_head": 1},
    ),
    "matrix-free spectrum": (
        "spectrum_matfree",
        {},
        _matfree,
        {"k": 5, "probes": 4, "steps": 30, "terms": 3, "group_bytes": cache.SLQ_GROUP_BYTES},
    ),
}


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    cache.clear()
    _map(
        View.from_values({"L": 4, "d": 4, "dk": 2, "dff": 8})
    )  # first-call costs (lazy imports) off the clock
    yield
    torch.set_num_threads(before)
    cache.clear()


def _cpu_seconds(run, view: View) -> float:
    """The calling thread's CPU seconds for one run of a view's computations from a cleared cache."""
    cache.clear()
    start = time.thread_time()
    run(view)
    used = time.thread_time() - start
    cache.clear()
    return used


@pytest.mark.parametrize("name", list(VIEWS))
def test_estimate_within_a_factor_two_of_measured_cpu(one_thread, name):
    kind, values, run, extra = VIEWS[name]
    view = View.from_values(values)
    estimate = budget.cost(kind, view.cfg, **extra).seconds
    used = min(_cpu_seconds(run, view) for _ in range(REPEATS))
    assert estimate / FACTOR <= used <= estimate * FACTOR, (
        f"{name}: estimated {estimate:.3f} s, measured {used:.3f} s of CPU (ratio {used / estimate:.2f})"
    )


def test_a_long_view_says_how_long():
    c = budget.Cost(24.6, 0, "the spectrum (three dense terms of P = 5,632)")
    words = budget.long_words(c)
    assert "about 25 s" in words and "progress" in words and "stops it" in words
    assert budget.long_words(budget.Cost(budget.LONG_SECONDS * 0.9, 0, "x")) == ""


def test_lanczos_norm_equals_the_dense_one():
    """:func:`hessviz.matfree.spectra.matrix_norm` past :data:`LANCZOS_NORM_MIN` (one eigenvalue by Lanczos)
    against the dense route: a symmetric indefinite one with the all-ones vector in its null space
    (as LayerNorm's terms have; a start of ones would fail there), a wide and a tall one, and zero."""
    from hessviz.matfree.spectra import LANCZOS_NORM_MIN, matrix_norm

    n = LANCZOS_NORM_MIN + 44
    g = torch.Generator().manual_seed(0)
    center = torch.eye(n, dtype=torch.float64) - 1.0 / n
    B = torch.randn(n, n, generator=g, dtype=torch.float64)
    S = center @ (B + B.T) @ center  # symmetric, ones in its null space, indefinite
    dense = float(torch.linalg.eigvalsh(S).abs().max())
    assert matrix_norm(S, symmetric=True) == pytest.approx(dense, rel=1e-12)
    W = torch.randn(n, n + 200, generator=g, dtype=torch.float64)
    exact = float(torch.linalg.svdvals(W)[0])
    assert matrix_norm(W) == pytest.approx(exact, rel=1e-12)
    assert matrix_norm(W.T) == pytest.approx(exact, rel=1e-12)
    assert matrix_norm(torch.zeros(n, n, dtype=torch.float64), symmetric=True) == 0.0
