r"""Fitting utilities for the claims: power-law slopes with confidence intervals, the Gini
coefficient, and the point where a power law bends.

* :func:`power_law_fit` fits ``log y = a + b log x`` by least squares and gives a
  bootstrap confidence interval for the exponent ``b`` (resampling the points).
* :func:`slope_over_seeds` fits one exponent per seed and summarises them with a
  Student-t interval: the spread over seeds, which is what a reader should trust.
* :func:`local_slopes` and :func:`bend_point` show where a curve leaves its small-``x``
  power law (for attention: where the softmax saturates).
* :func:`gini` is ``G = Σ_i Σ_j |x_i − x_j| / (2 n² x̄)`` (Tomihari & Sato).

Everything here is plain numpy; no torch, no plotting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class PowerLawFit:
    """``y ≈ exp(intercept) · x^slope`` over the points used."""

    slope: float
    intercept: float
    r2: float
    ci: tuple[float, float]
    """95 % interval of the slope (bootstrap over points, or t-interval over seeds)."""
    n: int
    """Number of points (or seeds) behind the interval."""

    def as_dict(self, prefix: str = "slope") -> dict[str, float | list[float]]:
        return {prefix: self.slope, f"{prefix}_ci": [self.ci[0], self.ci[1]], f"{prefix}_r2": self.r2}


def _clean(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same length, got {x.size} and {y.size}")
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    return np.log(x[keep]), np.log(y[keep])


def _ols(lx: np.ndarray, ly: np.ndarray) -> tuple[float, float, float]:
    A = np.stack([np.ones_like(lx), lx], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, ly, rcond=None)
    resid = ly - (a + b * lx)
    ss_tot = float(((ly - ly.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return float(b), float(a), r2


def power_law_fit(x, y, *, n_boot: int = 1000, seed: int = 0) -> PowerLawFit:
    """Least-squares slope of ``log y`` on ``log x`` with a 95 % bootstrap interval.

    Non-positive or non-finite points are dropped; at least two must remain.
    """
    lx, ly = _clean(x, y)
    if lx.size < 2 or np.ptp(lx) == 0:
        raise ValueError("power_law_fit needs at least two distinct positive x values with positive y")
    b, a, r2 = _ols(lx, ly)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        idx = rng.integers(0, lx.size, lx.size)
        if np.ptp(lx[idx]) == 0:
            continue
        boots.append(_ols(lx[idx], ly[idx])[0])
    lo, hi = np.percentile(boots, [2.5, 97.5]) if boots else (b, b)
    return PowerLawFit(b, a, r2, (float(lo), float(hi)), int(lx.size))


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: Student-t interval of the mean of ``values``."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        raise ValueError("t_interval needs at least one finite value")
    m = float(v.mean())
    if v.size == 1:
        return m, m, m
    half = float(stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))
    return m, m - half, m + half


def slope_over_seeds(x, Y) -> PowerLawFit:
    """One log–log slope per row of ``Y (seeds, points)`` against ``x (points)``.

    Returns the mean slope with a 95 % t-interval over seeds; ``r2`` is the mean R².
    """
    Y = np.atleast_2d(np.asarray(Y, dtype=float))
    fits = [power_law_fit(x, row, n_boot=0) for row in Y]
    m, lo, hi = t_interval([f.slope for f in fits])
    return PowerLawFit(
        m,
        float(np.mean([f.intercept for f in fits])),
        float(np.mean([f.r2 for f in fits])),
        (lo, hi),
        len(fits),
    )


def local_slopes(x, y) -> tuple[np.ndarray, np.ndarray]:
    """Centred finite-difference ``d log y / d log x`` at the geometric midpoints of ``x``."""
    lx, ly = _clean(x, y)
    mid = np.exp(0.5 * (lx[1:] + lx[:-1]))
    return mid, np.diff(ly) / np.diff(lx)


def bend_point(x, y, reference: float, tol: float = 0.5) -> float:
    """First ``x`` (midpoint) where the local slope leaves ``reference ± tol``; ``nan`` if never."""
    mid, s = local_slopes(x, y)
    off = np.nonzero(np.abs(s - reference) > tol)[0]
    return float(mid[off[0]]) if off.size else float("nan")


def gini(values) -> float:
    r"""Gini coefficient ``Σ_i Σ_j |x_i − x_j| / (2 n² x̄)`` of non-negative values.

    >>> gini([1, 1, 1, 1])
    0.0
    >>> round(gini([0, 0, 0, 1]), 4)   # (n - 1) / n for one non-zero entry
    0.75
    """
    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("gini needs at least one value")
    if (x < 0).any() or not np.isfinite(x).all():
        raise ValueError("gini needs finite non-negative values")
    mean = x.mean()
    if mean == 0:
        return 0.0
    return float(np.abs(x[:, None] - x[None, :]).sum() / (2 * x.size**2 * mean))


def spearman(a, b) -> float:
    """Spearman rank correlation (``nan`` when either side is constant)."""
    a = np.asarray(a, dtype=float).ravel()
    b = np.asarray(b, dtype=float).ravel()
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(stats.spearmanr(a, b).statistic)


def pearson(a, b) -> float:
    a = np.asarray(a, dtype=float).ravel()
    b = np.asarray(b, dtype=float).ravel()
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])
