"""Bars: block norms per term, grouped values with error bars, and timings.

>>> fig = grouped_bars(["a", "b"], {"post": [1.0, 2.0]}, errors={"post": [0.1, 0.2]}, title="t", ylabel="y")
>>> fig.data[0].name, list(fig.data[0].error_y.array)
('Post-LN', [0.1, 0.2])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from hessviz.plots.style import FONT_SIZE, TERM_COLORS, color_for, layout, placement_name, pretty


def block_norm_bars(
    norms: dict[str, np.ndarray],
    names: Sequence[str],
    *,
    kind: str = "spectral",
    title: str | None = None,
    height: int = 460,
    theme: str = "light",
) -> go.Figure:
    """Diagonal and off-diagonal block norms per term as grouped bars on a log axis."""
    n = len(names)
    pairs = [(i, j) for i in range(n) for j in range(i, n)]
    xs = [f"{pretty(names[i])}–{pretty(names[j])}" for i, j in pairs]
    fig = go.Figure()
    for term, M in norms.items():
        fig.add_trace(
            go.Bar(
                x=xs,
                y=[M[i, j] for i, j in pairs],
                name=term,
                marker={"color": TERM_COLORS.get(term)},
                hovertemplate=f"{term}<br>%{{x}}<br>%{{y:.4g}}<extra></extra>",
            )
        )
    label = {"spectral": "‖·‖₂", "fro": "‖·‖_F"}.get(kind, kind)
    fig.update_yaxes(type="log", title={"text": f"block norm {label}"})
    fig.update_layout(barmode="group")
    fig = layout(fig, title or f"Per-block norms {label}", height, theme=theme)
    return fig.update_xaxes(tickfont={"size": FONT_SIZE - 4})  # n(n+1)/2 pair labels: keep them apart


def diagonal_norm_bars(
    norms: dict[str, dict[str, float]], *, title: str | None = None, height: int = 420, theme: str = "light"
) -> go.Figure:
    """``term -> {block name -> norm}`` as grouped bars on a log axis (one group per block)."""
    fig = go.Figure()
    for term, by_block in norms.items():
        fig.add_trace(
            go.Bar(
                x=[pretty(n) for n in by_block],
                y=list(by_block.values()),
                name=term,
                marker={"color": TERM_COLORS.get(term)},
                hovertemplate=f"{term}<br>%{{x}}<br>%{{y:.4g}}<extra></extra>",
            )
        )
    fig.update_yaxes(type="log", title={"text": "spectral norm ‖·‖₂"})
    fig.update_layout(barmode="group")
    return layout(fig, title, height, theme=theme)


def timing_bars(
    times: dict[str, float],
    *,
    title: str | None = "Time for full, outer and functional",
    height: int = 360,
    theme: str = "light",
) -> go.Figure:
    """Horizontal bars of wall times (seconds), with the speed-up in the title."""
    labels = {"closed_form": "closed form", "autograd": "autograd (torch.func)"}
    names = list(times)
    fig = go.Figure(
        go.Bar(
            x=[times[n] for n in names],
            y=[labels.get(n, n) for n in names],
            orientation="h",
            text=[f"{times[n] * 1e3:.0f} ms" for n in names],
            textposition="auto",
            marker={"color": ["#00a676" if n == "closed_form" else "#636efa" for n in names]},
            hovertemplate="%{y}: %{x:.4f} s<extra></extra>",
        )
    )
    fig.update_xaxes(title={"text": "seconds (best of 2)"})
    return layout(fig, title, height, theme=theme)


def grouped_bars(
    categories: Sequence[str],
    groups: Mapping[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    errors: Mapping[str, Sequence[float]] | None = None,
    logy: bool = False,
    height: int = 460,
    theme: str = "light",
) -> go.Figure:
    """Grouped bars: ``groups`` name -> one value per category, optional symmetric ``errors``."""
    fig = go.Figure()
    for i, (name, vals) in enumerate(groups.items()):
        err = None
        if errors and name in errors:
            err = {"type": "data", "array": list(np.asarray(errors[name], dtype=float))}
        fig.add_trace(
            go.Bar(
                x=list(categories),
                y=list(np.asarray(vals, dtype=float)),
                name=placement_name(name),
                error_y=err,
                marker={"color": color_for(name, i)},
            )
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log" if logy else "linear", title={"text": ylabel})
    return layout(fig, title, height, theme=theme)


def block_spectrum_bars(
    names: Sequence[str],
    top: np.ndarray,
    trace: np.ndarray,
    *,
    trace_errors: np.ndarray | None = None,
    title: str | None = None,
    height: int = 640,
    theme: str = "light",
) -> go.Figure:
    """Per diagonal block ``H[b, b]`` (every weight, or every head ``W_Q[h]``): its top eigenvalue
    (upper panel) and its trace with error bars where estimated (lower panel). Heads of one weight
    share its colour. A panel is on a log axis when all its values are positive; the trace panel
    only when every trace is positive beyond two standard errors. A trace within two standard
    errors of 0 (Hutch++ gives 0.021 ± 0.173) is not significant: on a log axis it would read as
    a positive curvature, so the panel stays linear, its error bar crosses 0, the bar is hatched
    and its hover says so."""
    from plotly.subplots import make_subplots

    top, trace = np.asarray(top, dtype=np.float64), np.asarray(trace, dtype=np.float64)
    weights = list(dict.fromkeys(n.partition("[")[0] for n in names))
    colors = [color_for(n.partition("[")[0], weights.index(n.partition("[")[0])) for n in names]
    labels = [pretty(n) for n in names]
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("top eigenvalue λ_max(H[b, b])", "trace tr H[b, b]"),
    )
    fig.add_trace(
        go.Bar(
            x=labels,
            y=top,
            marker={"color": colors},
            name="λ_max",
            showlegend=False,
            hovertemplate="%{x}<br>λ_max = %{y:.4g}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    se = np.zeros_like(trace) if trace_errors is None else np.asarray(trace_errors, dtype=np.float64)
    err = None if trace_errors is None else {"type": "data", "array": se, "visible": True}
    vague = np.abs(trace) <= 2 * se  # not told apart from 0 by the estimate
    fig.add_trace(
        go.Bar(
            x=labels,
            y=trace,
            marker={
                "color": colors,
                "opacity": np.where(vague, 0.45, 1.0),
                "pattern": {"shape": ["/" if v else "" for v in vague]},
            },
            name="trace",
            showlegend=False,
            error_y=err,
            customdata=[
                f" ± {e:.2g}: not significant (within 2 standard errors of 0)"
                if v
                else (f" ± {e:.2g}" if e else "")
                for v, e in zip(vague, se)
            ],
            hovertemplate="%{x}<br>trace = %{y:.4g}%{customdata}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    for row, low in ((1, top), (2, trace - 2 * se)):
        if low.size and np.all(low > 0):
            fig.update_yaxes(type="log", row=row, col=1)
    return layout(fig, title or "Per-block curvature", height, theme=theme)
