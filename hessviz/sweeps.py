r"""Sweeps of block norms over ‖X‖₂, L or d, and log–log slope fits. Numeric, no Streamlit.

A sweep evaluates, for every grid value and seed, the norm of one block ``H[a, b]`` of
each term (``outer``, ``functional``, ``full``), computing only that block. The
median over seeds and its band (min..max) are then fitted on log–log axes,

.. math::
    \log_{10} \|H_{ab}\| \approx s \log_{10} x + c ,

and the slope ``s`` is compared with the exponent the theory gives, where it gives one
(:data:`THEORY`): for self-attention alone the outer W_Q–W_Q block grows like
``‖X‖₂⁶`` (Ormaniec, Dangel & Singh, arXiv 2410.10986) and, at fixed ``‖X‖₂``, decays
like ``1/L³``.

>>> import hessviz as hv
>>> cfg = hv.BlockConfig(seq_len=4, d_model=4, d_k=2, d_ff=4, norm="attention")
>>> res = sweep(cfg, "xnorm", [0.05, 0.1, 0.2], seeds=[0])
>>> round(fit_slope(res.grid, res.median("outer"))[0])
6
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import hessviz as hv
from hessviz.experiments.fitting import power_law_fit
from hessviz.spectra import matrix_norm

TERMS = ("outer", "functional", "full")
AXES = {"xnorm": "input size ‖X‖₂", "L": "sequence length L", "d": "model width d"}
DEFAULT_GRIDS: dict[str, tuple[float, ...]] = {
    "xnorm": tuple(float(v) for v in np.round(np.logspace(-1.5, 1, 11), 4)),
    "L": (2, 4, 8, 16, 32, 64),
    "d": (4, 8, 16, 24, 32, 48),
}
THEORY: dict[tuple[str, str, tuple[str, str], str], float] = {
    ("attention", "outer", ("W_Q", "W_Q"), "xnorm"): 6.0,
    ("attention", "outer", ("W_Q", "W_Q"), "L"): -3.0,
}
"""(norm, term, block pair, axis) -> exponent the theory gives (small ‖X‖₂ / large L regime)."""

PointFn = Callable[[hv.BlockConfig, float, int, tuple[str, str], str], dict[str, float]]


def theory_exponent(norm: str, term: str, pair: tuple[str, str], axis: str) -> float | None:
    """The exponent of :data:`THEORY`, or ``None`` where the theory gives none."""
    return THEORY.get((norm, term, tuple(pair), axis))


def config_at(cfg: hv.BlockConfig, axis: str, value: float) -> tuple[hv.BlockConfig, float | None]:
    """``cfg`` with the swept field set; the second item is the input norm when ``axis == "xnorm"``."""
    if axis == "xnorm":
        return cfg, float(value)
    if axis == "L":
        return dataclasses.replace(cfg, seq_len=int(value)), None
    if axis == "d":
        return dataclasses.replace(cfg, d_model=int(value)), None
    raise hv.ConfigError(f"axis must be one of {', '.join(AXES)}, got {axis!r}")


def largest_block(cfg: hv.BlockConfig, axis: str, grid: Sequence[float], pair: tuple[str, str]) -> int:
    """The largest weight count of ``pair`` over the grid (the swept Hessian block is its square)."""
    sizes = [config_at(cfg, axis, g)[0].param_size(n) for g in grid for n in pair]
    return max(sizes)


def point(cfg: hv.BlockConfig, input_norm: float, seed: int, pair: tuple[str, str],
          kind: str = "spectral") -> dict[str, float]:
    """``term -> ‖H_ab‖`` for one block pair, computing only that block of each term."""
    a, b = pair
    params = hv.init_params(cfg, seed=seed)
    X, Y = hv.sample_inputs(cfg, seed=seed, input_norm=input_norm)
    wrt = (a,) if a == b else (a, b)
    res = hv.hessian(cfg, params, X, Y, wrt=wrt)
    return {t: matrix_norm(res.block(a, b, t), kind) for t in TERMS}


@dataclass(frozen=True)
class SweepResult:
    axis: str
    grid: np.ndarray
    """``(n,)`` swept values."""
    seeds: tuple[int, ...]
    pair: tuple[str, str]
    values: dict[str, np.ndarray]
    """``term -> (n, n_seeds)`` block norms."""

    def median(self, term: str) -> np.ndarray:
        return np.median(self.values[term], axis=1)

    def band(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(min, max) over seeds."""
        v = self.values[term]
        return v.min(axis=1), v.max(axis=1)

    def curves(self, terms: Sequence[str] = TERMS) -> dict[str, dict[str, np.ndarray]]:
        """``term -> {"median", "lo", "hi"}``, the input of :func:`hessviz.plots.scaling_plot`."""
        out = {}
        for t in terms:
            lo, hi = self.band(t)
            out[t] = {"median": self.median(t), "lo": lo, "hi": hi}
        return out

    def table(self) -> dict[str, list]:
        """Long format columns: axis value, seed, term, norm."""
        cols: dict[str, list] = {self.axis: [], "seed": [], "term": [], "norm": []}
        for t, v in self.values.items():
            for i, x in enumerate(self.grid):
                for j, s in enumerate(self.seeds):
                    cols[self.axis].append(float(x))
                    cols["seed"].append(s)
                    cols["term"].append(t)
                    cols["norm"].append(float(v[i, j]))
        return cols


def sweep(cfg: hv.BlockConfig, axis: str, grid: Sequence[float], seeds: Sequence[int],
          pair: tuple[str, str] = ("W_Q", "W_Q"), *, input_norm: float = 1.0, kind: str = "spectral",
          evaluate: PointFn = point, progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Block norms of ``pair`` for every grid value and seed; ``progress(done, total)`` after each."""
    cfg.check_name(pair[0])
    cfg.check_name(pair[1])
    grid_a = np.asarray(grid, dtype=np.float64)
    seeds = tuple(int(s) for s in seeds)
    vals = {t: np.zeros((grid_a.size, len(seeds))) for t in TERMS}
    total, done = grid_a.size * len(seeds), 0
    for i, x in enumerate(grid_a):
        c, xn = config_at(cfg, axis, x)
        for j, s in enumerate(seeds):
            got = evaluate(c, input_norm if xn is None else xn, s, tuple(pair), kind)
            for t in TERMS:
                vals[t][i, j] = got[t]
            done += 1
            if progress is not None:
                progress(done, total)
    return SweepResult(axis, grid_a, seeds, tuple(pair), vals)


def fit_mask(axis: str, grid: Sequence[float]) -> np.ndarray:
    """Which points a slope fit uses: the regime the theory describes.

    ``xnorm``: ``‖X‖₂ ≤ 1`` (softmax still close to uniform); ``L``: ``L ≥ 4``; ``d``: all.
    """
    g = np.asarray(grid, dtype=np.float64)
    if axis == "xnorm":
        m = g <= 1.0
    elif axis == "L":
        m = g >= 4
    else:
        m = np.ones_like(g, dtype=bool)
    return m if m.sum() >= 2 else np.ones_like(g, dtype=bool)


def fit_slope(x: Sequence[float], y: Sequence[float],
              mask: Sequence[bool] | None = None) -> tuple[float, float]:
    """Least-squares ``(slope, intercept)`` of ``log10 y`` on ``log10 x`` over ``mask`` (positive y only).

    Returns ``(nan, nan)`` with fewer than two usable points.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    m = np.ones_like(x, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    try:
        fit = power_law_fit(x[m], y[m], n_boot=0)    # drops non-positive / non-finite points
    except ValueError:
        return float("nan"), float("nan")
    return fit.slope, float(fit.intercept / np.log(10.0))


def fits(result: SweepResult, norm: str, terms: Sequence[str] = TERMS) -> dict[str, dict]:
    """``term -> {"slope", "intercept", "mask", "theory"}`` for :func:`hessviz.plots.scaling_plot`."""
    mask = fit_mask(result.axis, result.grid)
    out = {}
    for t in terms:
        s, c = fit_slope(result.grid, result.median(t), mask)
        out[t] = {"slope": s, "intercept": c, "mask": mask,
                  "theory": theory_exponent(norm, t, result.pair, result.axis)}
    return out
