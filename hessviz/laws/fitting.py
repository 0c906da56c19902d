r"""Fits on measured curves: power-law slopes with confidence intervals, the point where a
power law bends, the Gini coefficient and rank correlation. Used by the sweeps, the claims
and the app alike.

* :func:`power_law_fit` fits ``log y = a + b log x`` by least squares and gives a
  bootstrap confidence interval for the exponent ``b`` (resampling the points).
* :func:`slope_over_seeds` fits one exponent per seed and summarises them with a
  Student-t interval: the spread over seeds, which is what a reader should trust.
* :func:`local_slopes` and :func:`bend_point` show where a curve leaves its small-``x``
  power law (for attention: where the softmax saturates).
* :func:`gini` is ``G = Σ_i Σ_j |x_i − x_j| / (2 n² x̄)`` (Tomihari & Sato).
* :func:`center` is the named statistic over seeds (:data:`STATISTICS`) of a curve
  measured once per seed, ``(n_seeds, n)``; :class:`RangeFit` a fit over a range of ``x``
  with the exponent expected there.

Everything here is plain numpy; no torch, no plotting.

>>> import numpy as np
>>> x = np.logspace(-2, 0, 9)
>>> fit = power_law_fit(x, 3.0 * x**6, n_boot=0)
>>> round(fit.slope, 6), round(float(np.exp(fit.intercept)), 6), fit.n
(6.0, 3.0, 9)
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


@dataclass(frozen=True)
class RangeFit:
    """A power-law fit over ``lo <= x <= hi`` and the exponent expected there (``None``: none)."""

    fit: PowerLawFit | None
    """``None`` when the range held fewer than two usable points."""
    lo: float
    hi: float
    expected: float | None = None

    @property
    def slope(self) -> float:
        return self.fit.slope if self.fit is not None else float("nan")


STATISTICS = ("median", "geomean")
"""The centre of a curve over seeds: the ``median``, or the geometric mean ``geomean``."""


def center(Y, stat: str) -> np.ndarray:
    """The statistic ``stat`` (:data:`STATISTICS`) over the rows (seeds) of ``Y (n_seeds, n)``.

    ``geomean`` is ``exp(mean log y)``, ignoring non-positive or non-finite entries (``nan``
    where none is left).

    >>> Y = np.array([[1.0, 1.0], [4.0, 100.0], [16.0, 10.0]])
    >>> center(Y, "median").tolist(), center(Y, "geomean").round(12).tolist()
    ([4.0, 10.0], [4.0, 10.0])
    >>> center(Y, "mean")
    Traceback (most recent call last):
    ...
    ValueError: stat must be one of median, geomean, got 'mean'
    """
    if stat not in STATISTICS:
        raise ValueError(f"stat must be one of {', '.join(STATISTICS)}, got {stat!r}")
    Y = np.atleast_2d(np.asarray(Y, dtype=np.float64))
    if stat == "median":
        return np.median(Y, axis=0)
    ok = np.isfinite(Y) & (Y > 0)
    if ok.all():
        return np.exp(np.log(Y).mean(axis=0))
    with np.errstate(all="ignore"):
        return np.exp(np.nanmean(np.log(np.where(ok, Y, np.nan)), axis=0))


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


def pooled_power_law_fit(x, Y, lo: float = -np.inf, hi: float = np.inf, *, n_boot: int = 1000) -> PowerLawFit:
    """One log–log fit through every seed's points: ``Y (seeds, points)`` against ``x (points)``,
    over the points with ``lo <= x <= hi`` whose column is finite for every seed.

    >>> import numpy as np
    >>> x = np.logspace(-4, 0, 9)
    >>> Y = np.stack([x**-2, 2 * x**-2])
    >>> round(pooled_power_law_fit(x, Y, hi=1e-2, n_boot=0).slope, 6)
    -2.0
    """
    x = np.asarray(x, dtype=float)
    Y = np.atleast_2d(np.asarray(Y, dtype=float))
    m = (x >= lo) & (x <= hi) & np.isfinite(Y).all(axis=0)
    return power_law_fit(np.tile(x[m], Y.shape[0]), Y[:, m].ravel(), n_boot=n_boot)


def gradient_summary(norms: np.ndarray) -> dict[str, float | bool]:
    """``gini``: the Gini coefficient of the block gradient norms (:func:`hessviz.laws.fitting.gini`; 0: all
    blocks equal, near 1: a few blocks carry the gradient); ``positive``: every norm is above 0 (a
    log axis can draw them)."""
    norms = np.asarray(norms, dtype=float)
    return {"gini": float(gini(norms)), "positive": bool(np.all(norms > 0))}
