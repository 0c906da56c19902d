"""The budget's estimates, structure only: every view the budget benchmark measures is priced.

How close the estimates come to the CPU the views really use is measured by ``hessviz bench --suite
budget`` (:mod:`hessviz.app.budget_bench`), not here: a timing read under load is no test (one noisy
run once read 2.06 against a bound of 2).
"""

from __future__ import annotations

import math

import pytest
import torch

from hessviz.app import budget, budget_bench


@pytest.mark.parametrize("name", list(budget_bench.VIEWS))
def test_every_benchmarked_view_is_priced(name):
    case = budget_bench.VIEWS[name]
    c = budget.cost(case.kind, case.view.cfg, **case.extra)
    assert math.isfinite(c.seconds) and c.seconds > 0 and c.bytes > 0


def test_the_benchmark_table_flags_a_ratio_past_two():
    text = budget_bench.render([("a", 1.0, 0.9), ("b", 1.0, 2.06), ("c", 1.0, 0.4)])
    lines = text.splitlines()[2:]
    assert [line.endswith("| yes |") for line in lines] == [True, False, False]
    assert "| 2.06 |" in lines[1]


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
