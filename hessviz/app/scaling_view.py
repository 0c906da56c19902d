"""The Scaling page's sweeps, computed once for the page and for the tour's story.

The page draws :func:`sweep` and :func:`side_sweeps`; the tour (:mod:`hessviz.app.tour`) quotes
the slopes and bends of the same sweeps, read from the same cached points
(:func:`hessviz.app.cache.sweep_point`), so the words and the chart cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable

from hessviz import sweeps
from hessviz.app import cache
from hessviz.app.state import View
from hessviz.experiments.scaling import BEND_TOL
from hessviz.fitting import bend_point

PLACEMENTS = ("attention", "post", "pre")
"""The side-by-side view: attention alone, Post-LN and Pre-LN."""

STAT = "median"
"""The centre the page draws and fits: the median over seeds."""


def placed(view: View, norm: str) -> View:
    """``view`` with LayerNorm placed at ``norm`` (no γ/β where there is no LayerNorm)."""
    return view.with_values(norm=norm, affine=view.cfg.ln_affine and norm in ("post", "pre"))


def side_pair(pair: tuple[str, str]) -> tuple[str, str]:
    """The block the side-by-side view draws: ``pair`` when it is an attention block, else W_Q–W_Q."""
    return pair if all(n.partition("[")[0] in ("W_Q", "W_K", "W_V") for n in pair) else ("W_Q", "W_Q")


def sweep(view: View, axis: str, pair: tuple[str, str], seeds: list[int], *, layer: int = 0,
          progress: Callable[[int, int], None] | None = None, label: str = "") -> sweeps.Sweep:
    """The block ``pair``'s norms (outer, functional, full) of ``view``'s block over the default
    grid of ``axis``, one cached point per grid value and seed."""

    def measure(c, input_norm: float, seed: int) -> dict[str, float]:
        return cache.sweep_point(c, input_norm, seed, pair, layer=layer)

    return sweeps.sweep(view.cfg, axis, sweeps.DEFAULT_GRIDS[axis], seeds, measure,
                        input_norm=view.input_norm, progress=progress, label=label)


def bend(result: sweeps.Sweep, norm: str, pair: tuple[str, str], term: str = "outer") -> float:
    """Where the drawn ``term`` curve leaves its theory's slope by more than ``BEND_TOL`` (``nan``
    when it never does, or when the theory gives no exponent)."""
    expected = sweeps.theory_exponent(norm, term, pair, result.axis)
    if expected is None:
        return float("nan")
    return bend_point(result.grid, result.center(term, STAT), expected, tol=BEND_TOL)


def outer_slope(result: sweeps.Sweep, norm: str, pair: tuple[str, str]) -> float:
    """The fitted slope of the drawn outer curve (the page's fit, over its marked regime)."""
    return float(sweeps.fits(result, norm, pair, stat=STAT)["outer"].slope)

