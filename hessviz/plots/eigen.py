"""Eigenvalue spectra: sorted eigenvalues and histograms on a symmetric-log axis.

>>> import numpy as np
>>> fig = spectrum_sorted({"full": np.array([-1.0, 0.0, 2.0])})
>>> fig.data[0].customdata.tolist(), fig.data[0].name
([-1.0, 0.0, 2.0], 'full')
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from hessviz.plots.scale import symlog, symlog_threshold, symlog_ticks
from hessviz.plots.style import TERM_COLORS, layout


def _pooled(spectra: dict[str, np.ndarray]) -> tuple[np.ndarray, float, tuple[list, list]]:
    """Every term's eigenvalues in one array (a zero when there are none), the symlog threshold ``c`` of
    that pool and its ticks ``(values, labels)``: all terms of a figure share one symlog axis."""
    allv = np.concatenate([np.asarray(v) for v in spectra.values()]) if spectra else np.zeros(1)
    c = symlog_threshold(allv, 6.0)
    return allv, c, symlog_ticks(float(np.max(np.abs(allv))) if allv.size else 0.0, c)


def spectrum_sorted(
    spectra: dict[str, np.ndarray],
    *,
    partial: dict[str, bool] | None = None,
    title: str | None = "Sorted eigenvalues",
    height: int = 500,
    theme: str = "light",
) -> go.Figure:
    """Eigenvalues of each term in ascending order, symmetric-log y axis via ``asinh``-free symlog."""
    _, c, (tv, tt) = _pooled(spectra)
    fig = go.Figure()
    for term, vals in spectra.items():
        vals = np.sort(np.asarray(vals, dtype=np.float64))
        part = bool(partial and partial.get(term))
        fig.add_trace(
            go.Scatter(
                x=np.arange(vals.size),
                y=symlog(vals, c),
                customdata=vals,
                mode="lines+markers" if vals.size <= 200 else "lines",
                name=term + (" (extremes)" if part else ""),
                line={"color": TERM_COLORS.get(term), "width": 3},
                hovertemplate=f"{term}<br>index %{{x}}<br>λ = %{{customdata:.4g}}<extra></extra>",
            )
        )
    fig.update_yaxes(
        tickvals=tv, ticktext=tt, title={"text": "eigenvalue λ (symlog)"}, zeroline=True, zerolinewidth=2
    )
    fig.update_xaxes(title={"text": "index (ascending)"})
    return layout(fig, title, height, theme=theme)


def spectrum_histogram(
    spectra: dict[str, np.ndarray],
    *,
    bins: int = 80,
    title: str | None = "Histogram of eigenvalues",
    height: int = 500,
    theme: str = "light",
) -> go.Figure:
    """Histogram of each term's eigenvalues on a symmetric-log axis (counts on a log axis)."""
    allv, c, (tv, tt) = _pooled(spectra)
    s = symlog(allv, c)
    lo, hi = (float(s.min()), float(s.max())) if s.size else (-1.0, 1.0)
    edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
    fig = go.Figure()
    for term, vals in spectra.items():
        counts, _ = np.histogram(symlog(np.asarray(vals, dtype=np.float64), c), edges)
        mids = 0.5 * (edges[1:] + edges[:-1])
        true = np.sign(edges) * c * (10.0 ** np.abs(edges) - 1)  # symlog's inverse: the bin's λ
        fig.add_trace(
            go.Bar(
                x=mids,
                y=counts,
                name=term,
                marker={"color": TERM_COLORS.get(term)},
                opacity=0.65,
                width=edges[1] - edges[0],
                customdata=np.stack([true[:-1], true[1:]], axis=1),
                hovertemplate=f"{term}<br>%{{y}} eigenvalues in λ ∈ [%{{customdata[0]:.3g}}, "
                f"%{{customdata[1]:.3g}}]<extra></extra>",
            )
        )
    fig.update_xaxes(tickvals=tv, ticktext=tt, title={"text": "eigenvalue λ (symlog)"}, tickangle=-45)
    fig.update_yaxes(type="log", title={"text": "count"})
    fig.update_layout(barmode="overlay")
    return layout(fig, title, height, theme=theme)


def spectral_density(
    curves: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    extremes: dict[str, np.ndarray] | None = None,
    title: str | None = "Spectral density (SLQ)",
    height: int = 500,
    theme: str = "light",
) -> go.Figure:
    """Each term's density ``φ(λ)`` (``(grid, φ)``, e.g. ``hessviz.matfree.Density.curve()``) on a
    log y axis, and its extreme eigenvalues (Lanczos) as markers on the curve's floor."""
    fig = go.Figure()
    floor = 1e-12
    peaks = [float(np.max(phi)) for _, phi in curves.values() if np.size(phi)]
    base = max(floor, min(peaks) * 1e-6) if peaks else 1.0
    for term, (grid, phi) in curves.items():
        fig.add_trace(
            go.Scatter(
                x=np.asarray(grid),
                y=np.maximum(np.asarray(phi), base),
                mode="lines",
                name=f"{term} density",
                line={"color": TERM_COLORS.get(term), "width": 3},
                hovertemplate=f"{term}<br>λ = %{{x:.4g}}<br>φ = %{{y:.3g}}<extra></extra>",
            )
        )
    for term, vals in (extremes or {}).items():
        vals = np.asarray(vals, dtype=np.float64)
        fig.add_trace(
            go.Scatter(
                x=vals,
                y=np.full(vals.size, base),
                mode="markers",
                name=f"{term} extremes (Lanczos)",
                marker={
                    "color": TERM_COLORS.get(term),
                    "symbol": "line-ns-open",
                    "size": 18,
                    "line": {"width": 3},
                },
                hovertemplate=f"{term}<br>λ = %{{x:.6g}} (Lanczos)<extra></extra>",
            )
        )
    fig.update_yaxes(type="log", title={"text": "density φ(λ)"})
    fig.update_xaxes(title={"text": "eigenvalue λ"}, zeroline=True, zerolinewidth=2)
    return layout(fig, title, height, theme=theme)
