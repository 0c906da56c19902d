"""``hessviz bench --suite budget``: the app budget's estimates against the CPU its views really use.

Every page asks :func:`hessviz.app.budget.cost` before it computes; the estimate decides whether a
view runs, and says "about 25 s" before a long one. Here a few representative views (:data:`VIEWS`)
run through the app's own cache functions (the code path of a live view) on one torch thread, as the
app runs (``app.py``), and the table gives each one's estimate, its measured CPU and their ratio; the
estimates are meant to lie within a factor :data:`FACTOR` of the measurement either way.

The CPU is the calling thread's (:func:`time.thread_time`; on one torch thread the view's work runs
there), so a background thread does not count, and it is the least of ``repeats`` runs from a cleared
cache: contention on a shared machine only adds time (one noisy run once read 2.06 on a view that
reads 0.9 on a quiet machine, which is why this is a benchmark and not a test). Small cases only
(about 8 s in all); the large ones are measured by ``benchmarks/``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hessviz.app import budget, cache
from hessviz.app.state import View

FACTOR = 2.0
"""How far an estimate may be from the measured CPU, either way, before its row says so."""


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


@dataclass(frozen=True)
class BudgetView:
    """One view of the suite: the budget's ``kind`` and ``extra`` arguments, the sidebar ``values``
    and ``run``, the view's computations through :mod:`hessviz.app.cache`."""

    kind: str
    values: dict[str, int]
    run: Callable[[View], None]
    extra: dict[str, object]

    @property
    def view(self) -> View:
        return View.from_values(self.values)

    def estimate(self) -> float:
        """The budget's estimate in core-seconds."""
        return budget.cost(self.kind, self.view.cfg, **self.extra).seconds


VIEWS = {
    "map d=24": BudgetView("map", {"d": 24, "dff": 48}, _map, {}),
    "spectrum": BudgetView("spectrum", {}, _spectrum, {"dense_limit": 4096, "k": 64}),
    "ln_collapse block": BudgetView("ln_collapse", {}, _ln_block, {"points": 4, "whole": 1}),
    "heterogeneity d=32": BudgetView(
        "heterogeneity", {"d": 32, "dff": 64}, _heterogeneity, {"samples": 30, "by_head": 1}
    ),
    "matrix-free spectrum": BudgetView(
        "spectrum_matfree",
        {},
        _matfree,
        {"k": 5, "probes": 4, "steps": 30, "terms": 3, "group_bytes": cache.SLQ_GROUP_BYTES},
    ),
}


def cpu_seconds(case: BudgetView) -> float:
    """The calling thread's CPU seconds for one run of a view's computations from a cleared cache."""
    view = case.view
    cache.clear()
    start = time.thread_time()
    case.run(view)
    used = time.thread_time() - start
    cache.clear()
    return used


def rows(repeats: int = 3) -> list[tuple[str, float, float]]:
    """``(view, estimated s, measured s)`` of each of :data:`VIEWS`: the least CPU of ``repeats``
    runs on one torch thread (the first-call costs, lazy imports, paid before)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cache.clear()
        _map(View.from_values({"L": 4, "d": 4, "dk": 2, "dff": 8}))
        return [
            (name, case.estimate(), min(cpu_seconds(case) for _ in range(repeats)))
            for name, case in VIEWS.items()
        ]
    finally:
        torch.set_num_threads(before)
        cache.clear()


def render(table: list[tuple[str, float, float]]) -> str:
    """The table in Markdown, each row's ratio measured / estimated and whether it is within
    :data:`FACTOR`."""
    lines = [
        "| view | estimated CPU s | measured CPU s | measured / estimated | within ×2 |",
        "|---|---:|---:|---:|---|",
    ]
    for name, est, used in table:
        ok = est / FACTOR <= used <= est * FACTOR
        lines.append(f"| {name} | {est:.3f} | {used:.3f} | {used / est:.2f} | {'yes' if ok else '**no**'} |")
    return "\n".join(lines)


def main(repeats: int = 3) -> str:
    """Measure and print the table; returns it."""
    text = render(rows(repeats))
    print(text)
    return text
