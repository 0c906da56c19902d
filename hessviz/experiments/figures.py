"""Figures for the claims: pure functions from measured data to ``plotly.graph_objects.Figure``.

No Streamlit here; the app pages and the report writer both call these.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
PLACEMENT_COLOURS = {"attention": "#1f77b4", "none": "#7f7f7f", "post": "#d62728", "pre": "#2ca02c"}
PLACEMENT_NAMES = {"attention": "attention alone", "none": "no LN", "post": "Post-LN", "pre": "Pre-LN"}


def _layout(fig: go.Figure, title: str, xlabel: str, ylabel: str, logx=True, logy=True) -> go.Figure:
    fig.update_layout(
        title=title,
        template="plotly_white",
        height=460,
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
        margin=dict(l=60, r=20, t=80, b=50),
    )
    fig.update_xaxes(title=xlabel, type="log" if logx else "linear")
    fig.update_yaxes(title=ylabel, type="log" if logy else "linear", exponentformat="power")
    return fig


def _band(fig, x, Y, name, colour, dash=None, show_seeds=False):
    """Geometric mean over seeds, with the min–max band."""
    Y = np.asarray(Y, dtype=float)
    Y = np.where(Y > 0, Y, np.nan)
    mean = np.exp(np.nanmean(np.log(Y), axis=0))
    lo, hi = np.nanmin(Y, axis=0), np.nanmax(Y, axis=0)
    fig.add_trace(
        go.Scatter(
            x=np.concatenate([x, x[::-1]]),
            y=np.concatenate([hi, lo[::-1]]),
            fill="toself",
            fillcolor=colour,
            opacity=0.15,
            line=dict(width=0),
            hoverinfo="skip",
            showlegend=False,
            legendgroup=name,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=mean,
            mode="lines+markers",
            name=name,
            legendgroup=name,
            line=dict(color=colour, dash=dash),
            marker=dict(size=5),
        )
    )


def _fit_line(fig, fit, lo, hi, colour, name):
    xs = np.array([lo, hi], dtype=float)
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=np.exp(fit.intercept) * xs**fit.slope,
            mode="lines",
            line=dict(color=colour, dash="dot", width=3),
            name=f"{name}: fit slope {fit.slope:.2f} [{fit.ci[0]:.2f}, {fit.ci[1]:.2f}]",
        )
    )


def loglog_sweep(
    sweep,
    fits: dict | None = None,
    *,
    title: str = "",
    reference: dict | None = None,
    ylabel: str = "spectral norm",
) -> go.Figure:
    """Every curve of a :class:`~hessviz.experiments.scaling.Sweep` on log–log axes.

    ``fits``: key -> ``(PowerLawFit, (lo, hi))`` drawn as dotted lines; ``reference``: key ->
    expected exponent, shown in the legend name.
    """
    fig = go.Figure()
    for i, (key, Y) in enumerate(sweep.values.items()):
        colour = PALETTE[i % len(PALETTE)]
        name = key.replace("_", " ")
        if reference and key in reference:
            name += f" (paper: slope {reference[key]:g})"
        _band(fig, sweep.x, Y, name, colour)
        if fits and key in fits:
            fit, (lo, hi) = fits[key]
            _fit_line(fig, fit, lo, hi, colour, key.replace("_", " "))
    xlabel = "‖X‖₂" if sweep.variable == "input_norm" else sweep.variable
    return _layout(fig, title or sweep.label, xlabel, ylabel)


def placement_sweep(sweeps: dict, key: str = "QQ_outer") -> go.Figure:
    """One curve per placement for the block ``key``."""
    fig = go.Figure()
    for norm, sw in sweeps.items():
        _band(fig, sw.x, sw.values[key], PLACEMENT_NAMES.get(norm, norm), PLACEMENT_COLOURS.get(norm, "#333"))
    return _layout(fig, f"{key.replace('_', ' ')} block vs ‖X‖₂ by placement", "‖X‖₂", "spectral norm")


def length_sweep_figure(sweeps: dict, key: str = "QQ_outer") -> go.Figure:
    """``key`` vs sequence length, one curve per sweep (``name -> Sweep``), with ``L⁻³`` guides."""
    fig = go.Figure()
    for i, (r, sw) in enumerate(sweeps.items()):
        name = r if isinstance(r, str) else f"‖X‖₂ = {r:g}"
        _band(fig, sw.x, sw.values[key], name, PALETTE[i % len(PALETTE)])
        Ls = sw.x
        m = np.exp(np.log(sw.values[key]).mean(axis=0))
        fig.add_trace(
            go.Scatter(
                x=Ls,
                y=m[0] * (Ls / Ls[0]) ** -3.0,
                mode="lines",
                showlegend=i == 0,
                line=dict(color="#999", dash="dash"),
                name="L⁻³ guide",
            )
        )
    return _layout(
        fig, f"{key.replace('_', ' ')} block vs sequence length at fixed ‖X‖₂", "L", "spectral norm"
    )


def curves_figure(
    x, curves: dict, *, title: str, xlabel: str, ylabel: str, logx=True, logy=True, guides: dict | None = None
) -> go.Figure:
    """Generic: ``curves`` name -> ``(seeds, n)`` or ``(n,)`` values over ``x``; optional power guides
    ``name -> (exponent, anchor_index_curve_name)``."""
    fig = go.Figure()
    x = np.asarray(x, dtype=float)
    for i, (name, Y) in enumerate(curves.items()):
        Y = np.atleast_2d(np.asarray(Y, dtype=float))
        _band(fig, x, Y, name, PALETTE[i % len(PALETTE)])
    for gname, (p, anchor) in (guides or {}).items():
        Y = np.atleast_2d(np.asarray(curves[anchor], dtype=float))
        y0 = float(np.exp(np.log(Y[:, -1]).mean()))
        fig.add_trace(
            go.Scatter(
                x=x, y=y0 * (x / x[-1]) ** p, mode="lines", name=gname, line=dict(color="#999", dash="dash")
            )
        )
    return _layout(fig, title, xlabel, ylabel, logx, logy)


def bar_figure(
    categories, groups: dict, *, title: str, ylabel: str, errors: dict | None = None, logy: bool = False
) -> go.Figure:
    """Grouped bars: ``groups`` name -> values per category (optional symmetric ``errors``)."""
    fig = go.Figure()
    for i, (name, vals) in enumerate(groups.items()):
        err = None
        if errors and name in errors:
            err = dict(type="data", array=list(np.asarray(errors[name], dtype=float)))
        colour = PLACEMENT_COLOURS.get(name, PALETTE[i % len(PALETTE)])
        fig.add_trace(
            go.Bar(
                x=list(categories),
                y=list(np.asarray(vals, dtype=float)),
                name=PLACEMENT_NAMES.get(name, name),
                error_y=err,
                marker_color=colour,
            )
        )
    fig.update_layout(barmode="group")
    return _layout(fig, title, "", ylabel, logx=False, logy=logy)


def scatter_figure(
    points: dict,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx=True,
    logy=True,
    diagonal: bool = False,
    hover: dict | None = None,
) -> go.Figure:
    """``points`` name -> ``(x, y)`` arrays; ``diagonal`` draws ``y = x``."""
    fig = go.Figure()
    lo, hi = np.inf, -np.inf
    for i, (name, (x, y)) in enumerate(points.items()):
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        if x.size:
            lo, hi = min(lo, np.nanmin(x), np.nanmin(y)), max(hi, np.nanmax(x), np.nanmax(y))
        colour = PLACEMENT_COLOURS.get(name, PALETTE[i % len(PALETTE)])
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="markers",
                name=PLACEMENT_NAMES.get(name, name),
                marker=dict(color=colour, size=7, opacity=0.75),
                text=(hover or {}).get(name),
            )
        )
    if diagonal and np.isfinite(lo):
        fig.add_trace(
            go.Scatter(
                x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(color="#333", dash="dash")
            )
        )
    return _layout(fig, title, xlabel, ylabel, logx, logy)


def histogram_figure(
    samples: dict, *, title: str, xlabel: str, logx: bool = True, vline: float | None = None
) -> go.Figure:
    """Overlaid histograms (log-spaced values shown via ``log10`` when ``logx``)."""
    fig = go.Figure()
    for i, (name, v) in enumerate(samples.items()):
        v = np.asarray(v, dtype=float)
        v = v[np.isfinite(v) & (v > 0)] if logx else v[np.isfinite(v)]
        fig.add_trace(
            go.Histogram(
                x=np.log10(v) if logx else v,
                name=name,
                opacity=0.6,
                nbinsx=40,
                marker_color=PALETTE[i % len(PALETTE)],
            )
        )
    if vline is not None:
        fig.add_vline(x=np.log10(vline) if logx else vline, line_dash="dash", line_color="#333")
    fig.update_layout(barmode="overlay")
    return _layout(fig, title, ("log₁₀ " if logx else "") + xlabel, "count", logx=False, logy=False)


def training_curves(
    curves: dict,
    *,
    title: str = "Training loss",
    threshold: float | None = None,
) -> go.Figure:
    """``curves`` name -> ``(seeds, steps)`` losses; log-y with the seed band."""
    fig = go.Figure()
    for i, (name, Y) in enumerate(curves.items()):
        Y = np.atleast_2d(np.asarray(Y, dtype=float))
        steps = np.arange(Y.shape[1])
        _band(fig, steps, Y, name, PALETTE[i % len(PALETTE)])
    if threshold is not None:
        fig.add_hline(
            y=threshold, line_dash="dash", line_color="#333", annotation_text=f"threshold {threshold:g}"
        )
    return _layout(fig, title, "step", "training loss", logx=False, logy=True)


def spectrum_figure(spectra: dict, *, title: str) -> go.Figure:
    """Sorted eigenvalues of each term (symlog-like: ``sign(λ)·log10(1 + |λ|/τ)`` with a shared τ)."""
    fig = go.Figure()
    allv = np.concatenate([np.abs(np.asarray(v, dtype=float)) for v in spectra.values()])
    tau = float(np.max(allv)) * 1e-6 if allv.size and np.max(allv) > 0 else 1.0
    for i, (name, v) in enumerate(spectra.items()):
        v = np.sort(np.asarray(v, dtype=float))
        y = np.sign(v) * np.log10(1 + np.abs(v) / tau)
        fig.add_trace(
            go.Scatter(
                x=np.arange(v.size),
                y=y,
                mode="lines",
                name=name,
                line=dict(color=PALETTE[i % len(PALETTE)]),
                customdata=v,
                hovertemplate="λ = %{customdata:.3e}<extra>" + name + "</extra>",
            )
        )
    fig.add_hline(y=0, line_color="#333", line_width=1)
    return _layout(
        fig,
        title + f" (axis: sign(λ)·log₁₀(1+|λ|/τ), τ = {tau:.1e})",
        "index (sorted)",
        "signed log eigenvalue",
        logx=False,
        logy=False,
    )
