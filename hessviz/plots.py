r"""Figures: data -> ``plotly.graph_objects.Figure``. Pure functions, no Streamlit.

Every function takes numpy arrays (or plain dicts of them) and returns a figure with
large fonts (readable on a projector) and no fixed colours for text, so Streamlit's
light and dark themes both apply. The Hessian colour scale is a *symmetric log*:

.. math::
    s(h) = \operatorname{sign}(h)\,\log_{10}\!\left(1 + |h| / c\right),

linear for ``|h| ≪ c`` and logarithmic beyond, so that entries spanning many decades
and of both signs stay visible around a white zero.

>>> import numpy as np
>>> fig = hessian_heatmap(np.eye(4), {"W_Q": slice(0, 2), "W_K": slice(2, 4)})
>>> len(fig.data) >= 1
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

FONT_SIZE = 18
TITLE_SIZE = 22
DIVERGING = "RdBu_r"
SEQUENTIAL = "Viridis"
TERM_COLORS = {"full": "#636efa", "outer": "#00a676", "functional": "#ef553b"}
NORM_COLORS = {"attention": "#ab63fa", "post": "#636efa", "pre": "#ffa15a", "none": "#19d3f3"}
PRETTY = {"W_Q": "W<sub>Q</sub>", "W_K": "W<sub>K</sub>", "W_V": "W<sub>V</sub>",
          "W_1": "W<sub>1</sub>", "W_2": "W<sub>2</sub>"}
PLACEMENTS = {"attention": "attention alone", "post": "Post-LN", "pre": "Pre-LN", "none": "no LN"}
MAX_CELLS = 400
"""Largest side (in cells) of a heatmap sent to the browser; larger matrices are reduced."""


def pretty(name: str) -> str:
    return PRETTY.get(name, name)


def _layout(fig: go.Figure, title: str | None = None, height: int = 560) -> go.Figure:
    fig.update_layout(
        title={"text": title, "font": {"size": TITLE_SIZE}} if title else None,
        font={"size": FONT_SIZE}, height=height, margin={"l": 70, "r": 30, "t": 70 if title else 30, "b": 60},
        hoverlabel={"font": {"size": FONT_SIZE}},
        legend={"font": {"size": FONT_SIZE - 2}},
    )
    axis_fonts = {"tickfont": {"size": FONT_SIZE - 2}, "title": {"font": {"size": FONT_SIZE}}}
    fig.update_xaxes(**axis_fonts)
    fig.update_yaxes(**axis_fonts)
    return fig


# ----------------------------------------------------------------------------- symmetric log


def symlog_threshold(H: np.ndarray, decades: float = 4.0) -> float:
    """The linear threshold ``c``: ``max|H| · 10^(−decades)`` (1 when H is all zero)."""
    m = float(np.max(np.abs(H))) if H.size else 0.0
    return m * 10.0 ** (-decades) if m > 0 else 1.0


def symlog(H: np.ndarray, c: float) -> np.ndarray:
    """``sign(H) · log10(1 + |H|/c)``."""
    return np.sign(H) * np.log10(1.0 + np.abs(H) / c)


def symlog_ticks(max_abs: float, c: float) -> tuple[list[float], list[str]]:
    """Colour-bar ticks at ``0, ±10^k`` (in symlog units) labelled with the true values."""
    if max_abs <= 0:
        return [0.0], ["0"]
    hi = math.floor(math.log10(max_abs))
    lo = math.ceil(math.log10(c))
    powers = list(range(lo, hi + 1))
    if len(powers) > 5:
        step = math.ceil(len(powers) / 5)
        powers = powers[::-1][::step][::-1]
    vals, text = [0.0], ["0"]
    for p in powers:
        v = float(np.log10(1 + 10.0**p / c))
        vals = [-v, *vals, v]
        text = [f"−1e{p}", *text, f"1e{p}"]
    return vals, text


# ----------------------------------------------------------------------------- reduction


def reduce_index(n: int, factor: int) -> list[slice]:
    """Tiles of ``factor`` consecutive indices covering ``range(n)`` (the last may be shorter)."""
    return [slice(i, min(i + factor, n)) for i in range(0, n, factor)]


def reduce_blocks(H: np.ndarray, offsets: dict[str, slice], factor: int) -> tuple[np.ndarray, list]:
    """Reduce ``H`` tile by tile within each block, keeping the entry of largest magnitude.

    Returns the reduced matrix and, per reduced index, ``(block, first, last)`` (0-based,
    inclusive, inside the block): tiles never straddle a block boundary.
    """
    starts, labels = [], []
    for name, sl in offsets.items():
        for t in reduce_index(sl.stop - sl.start, factor):
            starts.append(sl.start + t.start)
            labels.append((name, t.start, t.stop - 1))
    starts_a = np.asarray(starts)
    if factor == 1:
        return np.asarray(H)[np.ix_(starts_a, starts_a)], labels
    hi = np.maximum.reduceat(np.maximum.reduceat(H, starts_a, axis=0), starts_a, axis=1)
    lo = np.minimum.reduceat(np.minimum.reduceat(H, starts_a, axis=0), starts_a, axis=1)
    return np.where(np.abs(hi) >= np.abs(lo), hi, lo), labels


def reduction_factor(n: int, max_cells: int = MAX_CELLS) -> int:
    """Smallest tile size that brings ``n`` (plus one cell per block) under ``max_cells``."""
    return max(1, math.ceil(n / max_cells))


# ----------------------------------------------------------------------------- Hessian heatmaps


def _axis_labels(labels: list[tuple], axis: str) -> list[str]:
    word = "row" if axis == "y" else "col"
    out = []
    for name, first, last in labels:
        where = f"{first}" if first == last else f"{first}–{last}"
        out.append(f"{name} {word} {where}")
    return out


def hessian_heatmap(H: np.ndarray, offsets: dict[str, slice], *, title: str | None = None,
                    max_cells: int = MAX_CELLS, decades: float = 4.0, height: int = 720) -> go.Figure:
    """The ``(P, P)`` matrix on a symmetric-log scale with block boundaries and labels.

    Hover shows the block (row weight, column weight), the (row, column) inside the
    block and the value. When ``P > max_cells`` each cell shows the largest-magnitude
    entry of a tile inside one block, and the figure says so.
    """
    H = np.asarray(H, dtype=np.float64)
    P = H.shape[0]
    factor = reduction_factor(P, max_cells)
    R, labels = reduce_blocks(H, offsets, factor)
    c = symlog_threshold(H, decades)
    Z = symlog(R, c)
    zmax = float(np.max(np.abs(Z))) or 1.0
    tickvals, ticktext = symlog_ticks(float(np.max(np.abs(H))) if H.size else 0.0, c)
    ylab, xlab = _axis_labels(labels, "y"), _axis_labels(labels, "x")
    n = len(labels)
    # categorical axes: each cell's label names its block and index (the hover text);
    # shapes still address cells by position (0 … n-1)
    fig = go.Figure(go.Heatmap(
        z=Z.astype(np.float32), customdata=R.astype(np.float32), x=xlab, y=ylab,
        colorscale=DIVERGING, zmid=0, zmin=-zmax, zmax=zmax,
        colorbar={"title": {"text": "H (symlog)"}, "tickvals": tickvals, "ticktext": ticktext},
        hovertemplate="%{y}<br>%{x}<br>H = %{customdata:.4g}<extra></extra>",
    ))
    bounds, centers, names = _block_geometry(labels)
    _block_lines(fig, bounds, n)
    axis = {"tickmode": "array", "tickvals": [xlab[i] for i in centers],
            "ticktext": [pretty(m) for m in names], "showgrid": False, "tickfont": {"size": FONT_SIZE}}
    fig.update_xaxes(**axis, side="top", constrain="domain")
    fig.update_yaxes(**{**axis, "tickvals": [ylab[i] for i in centers]}, autorange="reversed",
                     scaleanchor="x", constrain="domain")
    if factor > 1:
        fig.add_annotation(
            text=(f"Reduced view: P = {P:,} > {max_cells} cells, so each cell is the largest-magnitude "
                  f"entry of a {factor}×{factor} tile.<br>Pick a block pair for full resolution."),
            xref="paper", yref="paper", x=0, y=-0.02, xanchor="left", yanchor="top", showarrow=False,
            font={"size": FONT_SIZE - 4}, bgcolor="rgba(255,200,0,0.25)")
    _layout(fig, title, height)
    fig.update_layout(margin={"b": 110 if factor > 1 else 30})
    return fig


def _block_geometry(labels: list[tuple]) -> tuple[list[int], list[int], list[str]]:
    """Boundaries (cell index where a block starts), centre cell and name of each block."""
    bounds, names = [], []
    for i, (name, _, _) in enumerate(labels):
        if not names or names[-1] != name:
            bounds.append(i)
            names.append(name)
    ends = [*bounds[1:], len(labels)]
    centers = [(b + e - 1) // 2 for b, e in zip(bounds, ends)]
    return bounds, centers, names


def _block_lines(fig: go.Figure, bounds: list[int], n: int) -> None:
    for b in bounds[1:]:
        for kw in ({"x0": b - 0.5, "x1": b - 0.5, "y0": -0.5, "y1": n - 0.5},
                   {"y0": b - 0.5, "y1": b - 0.5, "x0": -0.5, "x1": n - 0.5}):
            fig.add_shape(type="line", xref="x", yref="y", line={"color": "black", "width": 1.5}, **kw)


def block_heatmap(B: np.ndarray, row_name: str, col_name: str, *, row_shape: tuple[int, int] | None = None,
                  col_shape: tuple[int, int] | None = None, title: str | None = None,
                  max_cells: int = 1024, decades: float = 4.0, height: int = 640) -> go.Figure:
    """One block ``H[row_name, col_name]`` at full resolution (reduced only beyond ``max_cells``).

    Hover gives (row, column) inside the block and, when the weight shapes are given,
    the weight entries they stand for (``W_Q[i, j]``).
    """
    B = np.asarray(B, dtype=np.float64)
    m, n = B.shape
    factor = max(reduction_factor(m, max_cells), reduction_factor(n, max_cells))
    if factor > 1:
        ri = np.arange(0, m, factor)
        ci = np.arange(0, n, factor)
        hi = np.maximum.reduceat(np.maximum.reduceat(B, ri, axis=0), ci, axis=1)
        lo = np.minimum.reduceat(np.minimum.reduceat(B, ri, axis=0), ci, axis=1)
        R = np.where(np.abs(hi) >= np.abs(lo), hi, lo)
        rows, cols = ri, ci
    else:
        R, rows, cols = B, np.arange(m), np.arange(n)
    c = symlog_threshold(B, decades)
    Z = symlog(R, c)
    zmax = float(np.max(np.abs(Z))) or 1.0
    tickvals, ticktext = symlog_ticks(float(np.max(np.abs(B))) if B.size else 0.0, c)

    def entry(name: str, shape: tuple[int, int] | None, k: np.ndarray) -> list[str] | None:
        if shape is None:
            return None
        return [f"{name}[{i // shape[1]}, {i % shape[1]}]" for i in k]

    ylab = [f"row {i} ({e})" for i, e in zip(rows, entry(row_name, row_shape, rows))] if row_shape \
        else [f"row {i}" for i in rows]
    xlab = [f"col {j} ({e})" for j, e in zip(cols, entry(col_name, col_shape, cols))] if col_shape \
        else [f"col {j}" for j in cols]
    fig = go.Figure(go.Heatmap(
        z=Z.astype(np.float32), customdata=R.astype(np.float32), x=xlab, y=ylab,
        colorscale=DIVERGING, zmid=0, zmin=-zmax, zmax=zmax,
        colorbar={"title": {"text": "H (symlog)"}, "tickvals": tickvals, "ticktext": ticktext},
        hovertemplate=(f"block {row_name} × {col_name}<br>%{{y}}<br>%{{x}}<br>H = %{{customdata:.4g}}"
                       "<extra></extra>"),
    ))
    fig.update_xaxes(showticklabels=False, showgrid=False, title={"text": f"{pretty(col_name)} (columns)"},
                     side="top", constrain="domain")
    fig.update_yaxes(showticklabels=False, showgrid=False, title={"text": f"{pretty(row_name)} (rows)"},
                     autorange="reversed", constrain="domain", scaleanchor="x" if m == n else None)
    if factor > 1:
        fig.add_annotation(text=f"Reduced view: {m}×{n} block, each cell is the largest-magnitude entry "
                                f"of a {factor}×{factor} tile", xref="paper", yref="paper", x=0, y=-0.02,
                           xanchor="left", yanchor="top", showarrow=False, font={"size": FONT_SIZE - 4},
                           bgcolor="rgba(255,200,0,0.25)")
    return _layout(fig, title or f"Block {pretty(row_name)} × {pretty(col_name)} ({m} × {n})", height)


def block_norm_matrix(norms: np.ndarray, names: Sequence[str], *, kind: str = "spectral",
                      title: str | None = None, height: int = 480) -> go.Figure:
    """The ``(n, n)`` matrix of block norms, log colour scale, each value written in its cell."""
    norms = np.asarray(norms, dtype=np.float64)
    positive = norms[norms > 0]
    floor = float(positive.min()) / 10 if positive.size else 1e-300
    Z = np.log10(np.maximum(norms, floor))
    text = [[f"{v:.2g}" for v in row] for row in norms]
    label = {"spectral": "‖·‖₂", "fro": "‖·‖_F"}.get(kind, kind)
    ticks = [pretty(n) for n in names]
    fig = go.Figure(go.Heatmap(
        z=Z, x=ticks, y=ticks, text=text, texttemplate="%{text}", textfont={"size": FONT_SIZE - 2},
        customdata=norms, colorscale=SEQUENTIAL,
        colorbar={"title": {"text": f"log₁₀ {label}"}},
        hovertemplate=f"block %{{y}} × %{{x}}<br>{label} = %{{customdata:.4g}}<extra></extra>",
    ))
    fig.update_xaxes(side="top", showgrid=False)
    fig.update_yaxes(autorange="reversed", showgrid=False, scaleanchor="x", constrain="domain")
    return _layout(fig, title or f"Block norms {label}", height)


# ----------------------------------------------------------------------------- spectra


def spectrum_sorted(spectra: dict[str, np.ndarray], *, partial: dict[str, bool] | None = None,
                    title: str | None = "Sorted eigenvalues", height: int = 500) -> go.Figure:
    """Eigenvalues of each term in ascending order, symmetric-log y axis via ``asinh``-free symlog."""
    fig = go.Figure()
    allv = np.concatenate([np.asarray(v) for v in spectra.values()]) if spectra else np.zeros(1)
    c = symlog_threshold(allv, 6.0)
    for term, vals in spectra.items():
        vals = np.sort(np.asarray(vals, dtype=np.float64))
        part = bool(partial and partial.get(term))
        fig.add_trace(go.Scatter(
            x=np.arange(vals.size), y=symlog(vals, c),
            customdata=vals, mode="lines+markers" if vals.size <= 200 else "lines",
            name=term + (" (extremes)" if part else ""), line={"color": TERM_COLORS.get(term), "width": 3},
            hovertemplate=f"{term}<br>index %{{x}}<br>λ = %{{customdata:.4g}}<extra></extra>"))
    tv, tt = symlog_ticks(float(np.max(np.abs(allv))) if allv.size else 0.0, c)
    fig.update_yaxes(tickvals=tv, ticktext=tt, title={"text": "eigenvalue λ (symlog)"}, zeroline=True,
                     zerolinewidth=2)
    fig.update_xaxes(title={"text": "index (ascending)"})
    return _layout(fig, title, height)


def spectrum_histogram(spectra: dict[str, np.ndarray], *, bins: int = 80,
                       title: str | None = "Histogram of eigenvalues", height: int = 500) -> go.Figure:
    """Histogram of each term's eigenvalues on a symmetric-log axis (counts on a log axis)."""
    fig = go.Figure()
    allv = np.concatenate([np.asarray(v) for v in spectra.values()]) if spectra else np.zeros(1)
    c = symlog_threshold(allv, 6.0)
    s = symlog(allv, c)
    lo, hi = (float(s.min()), float(s.max())) if s.size else (-1.0, 1.0)
    edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
    for term, vals in spectra.items():
        counts, _ = np.histogram(symlog(np.asarray(vals, dtype=np.float64), c), edges)
        mids = 0.5 * (edges[1:] + edges[:-1])
        fig.add_trace(go.Bar(x=mids, y=counts, name=term, marker={"color": TERM_COLORS.get(term)},
                             opacity=0.65, width=edges[1] - edges[0],
                             hovertemplate=f"{term}<br>%{{y}} eigenvalues<extra></extra>"))
    tv, tt = symlog_ticks(float(np.max(np.abs(allv))) if allv.size else 0.0, c)
    fig.update_xaxes(tickvals=tv, ticktext=tt, title={"text": "eigenvalue λ (symlog)"})
    fig.update_yaxes(type="log", title={"text": "count"})
    fig.update_layout(barmode="overlay")
    return _layout(fig, title, height)


def block_norm_bars(norms: dict[str, np.ndarray], names: Sequence[str], *, kind: str = "spectral",
                    title: str | None = None, height: int = 460) -> go.Figure:
    """Diagonal and off-diagonal block norms per term as grouped bars on a log axis."""
    n = len(names)
    pairs = [(i, j) for i in range(n) for j in range(i, n)]
    xs = [f"{names[i]}–{names[j]}" for i, j in pairs]
    fig = go.Figure()
    for term, M in norms.items():
        fig.add_trace(go.Bar(x=xs, y=[M[i, j] for i, j in pairs], name=term,
                             marker={"color": TERM_COLORS.get(term)},
                             hovertemplate=f"{term}<br>%{{x}}<br>%{{y:.4g}}<extra></extra>"))
    label = {"spectral": "‖·‖₂", "fro": "‖·‖_F"}.get(kind, kind)
    fig.update_yaxes(type="log", title={"text": f"block norm {label}"})
    fig.update_layout(barmode="group")
    return _layout(fig, title or f"Per-block norms {label}", height)


def diagonal_norm_bars(norms: dict[str, dict[str, float]], *, title: str | None = None,
                       height: int = 420) -> go.Figure:
    """``term -> {block name -> norm}`` as grouped bars on a log axis (one group per block)."""
    fig = go.Figure()
    for term, by_block in norms.items():
        fig.add_trace(go.Bar(x=[pretty(n) for n in by_block], y=list(by_block.values()), name=term,
                             marker={"color": TERM_COLORS.get(term)},
                             hovertemplate=f"{term}<br>%{{x}}<br>%{{y:.4g}}<extra></extra>"))
    fig.update_yaxes(type="log", title={"text": "spectral norm ‖·‖₂"})
    fig.update_layout(barmode="group")
    return _layout(fig, title, height)


# ----------------------------------------------------------------------------- scaling laws


def scaling_plot(x: np.ndarray, curves: dict[str, dict[str, np.ndarray]], *, x_title: str,
                 y_title: str = "block norm", fits: dict[str, dict] | None = None,
                 colors: dict[str, str] | None = None, title: str | None = None,
                 height: int = 520) -> go.Figure:
    """Log–log curves: for each name a median line and a band (min..max over seeds).

    ``curves[name] = {"median": (n,), "lo": (n,), "hi": (n,)}``; ``fits[name] =
    {"slope": s, "intercept": b, "mask": bool (n,), "theory": t | None}`` adds a dashed
    fitted line over the points the fit used.
    """
    fig = go.Figure()
    colors = colors or {}
    palette = ["#636efa", "#ef553b", "#00a676", "#ab63fa", "#ffa15a", "#19d3f3"]
    x = np.asarray(x, dtype=np.float64)
    for k, (name, c) in enumerate(curves.items()):
        col = colors.get(name) or TERM_COLORS.get(name) or NORM_COLORS.get(name) or palette[k % 6]
        fill = _rgba(col, 0.18)
        fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]),
                                 y=np.concatenate([c["hi"], np.asarray(c["lo"])[::-1]]),
                                 fill="toself", fillcolor=fill, line={"width": 0}, hoverinfo="skip",
                                 showlegend=False, legendgroup=name))
        fit = (fits or {}).get(name)
        label = name
        if fit is not None and np.isfinite(fit.get("slope", np.nan)):
            theory = fit.get("theory")
            label += f" · slope {fit['slope']:.2f}" + (f" (theory {theory:g})" if theory is not None else "")
        fig.add_trace(go.Scatter(x=x, y=c["median"], mode="lines+markers", name=label, legendgroup=name,
                                 line={"color": col, "width": 3}, marker={"size": 8},
                                 hovertemplate=f"{name}<br>%{{x:.3g}}<br>median %{{y:.4g}}<extra></extra>"))
        if fit is not None and np.isfinite(fit.get("slope", np.nan)):
            xm = x[np.asarray(fit["mask"], dtype=bool)]
            if xm.size:
                yf = 10 ** (fit["intercept"] + fit["slope"] * np.log10(xm))
                fig.add_trace(go.Scatter(x=xm, y=yf, mode="lines", line={"color": col, "dash": "dash",
                                                                          "width": 2},
                                         showlegend=False, legendgroup=name, hoverinfo="skip"))
    fig.update_xaxes(type="log", title={"text": x_title})
    fig.update_yaxes(type="log", title={"text": y_title}, exponentformat="power")
    return _layout(fig, title, height)


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def side_by_side(x: np.ndarray, panels: dict[str, dict[str, dict[str, np.ndarray]]], *, x_title: str,
                 y_title: str = "block norm", fits: dict[str, dict[str, dict]] | None = None,
                 title: str | None = None, height: int = 520) -> go.Figure:
    """One log–log panel per placement (e.g. attention alone, Post-LN, Pre-LN), shared y axis."""
    names = list(panels)
    fig = make_subplots(rows=1, cols=len(names), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[_panel_title(n, (fits or {}).get(n)) for n in names])
    x = np.asarray(x, dtype=np.float64)
    for col, pname in enumerate(names, start=1):
        for name, c in panels[pname].items():
            color = TERM_COLORS.get(name, "#636efa")
            fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]),
                                     y=np.concatenate([c["hi"], np.asarray(c["lo"])[::-1]]),
                                     fill="toself", fillcolor=_rgba(color, 0.18), line={"width": 0},
                                     hoverinfo="skip", showlegend=False), row=1, col=col)
            fig.add_trace(go.Scatter(x=x, y=c["median"], mode="lines+markers", name=name, legendgroup=name,
                                     showlegend=col == 1, line={"color": color, "width": 3},
                                     hovertemplate=f"{pname}, {name}<br>%{{x:.3g}}<br>%{{y:.4g}}"
                                                   "<extra></extra>"),
                          row=1, col=col)
        fig.update_xaxes(type="log", title={"text": x_title}, row=1, col=col)
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_yaxes(title={"text": y_title}, row=1, col=1)
    fig.update_annotations(font={"size": FONT_SIZE})
    return _layout(fig, title, height)


def _panel_title(name: str, fits: dict | None) -> str:
    label = PLACEMENTS.get(name, name)
    if fits and "outer" in fits and np.isfinite(fits["outer"].get("slope", np.nan)):
        label += f" (outer slope {fits['outer']['slope']:.1f})"
    return label


# ----------------------------------------------------------------------------- verify & speed


def error_matrix(errors: dict[str, np.ndarray], names: Sequence[str], *,
                 title: str | None = "Relative error, closed form vs autograd",
                 height: int = 440) -> go.Figure:
    """One panel per term: ``log10`` relative error of every block pair, value in each cell."""
    terms = list(errors)
    fig = make_subplots(rows=1, cols=len(terms), subplot_titles=terms, horizontal_spacing=0.06)
    ticks = [pretty(n) for n in names]
    allv = np.concatenate([np.asarray(e).ravel() for e in errors.values()])
    floor = 1e-17
    zmin, zmax = -17.0, max(-8.0, float(np.log10(max(allv.max(), floor))))
    for k, t in enumerate(terms, start=1):
        E = np.asarray(errors[t], dtype=np.float64)
        fig.add_trace(go.Heatmap(
            z=np.log10(np.maximum(E, floor)), x=ticks, y=ticks, customdata=E,
            text=[[f"{v:.0e}" if v > 0 else "0" for v in row] for row in E], texttemplate="%{text}",
            textfont={"size": FONT_SIZE - 6}, colorscale="Greens_r", zmin=zmin, zmax=zmax,
            showscale=k == len(terms), colorbar={"title": {"text": "log₁₀ rel. err."}},
            hovertemplate=f"{t}: block %{{y}} × %{{x}}<br>relative error %{{customdata:.2e}}<extra></extra>"),
            row=1, col=k)
        fig.update_yaxes(autorange="reversed", row=1, col=k)
        fig.update_xaxes(side="bottom", row=1, col=k)
    fig.update_annotations(font={"size": FONT_SIZE})
    return _layout(fig, title, height)


def timing_bars(times: dict[str, float], *, title: str | None = "Time for full, outer and functional",
                height: int = 360) -> go.Figure:
    """Horizontal bars of wall times (seconds), with the speed-up in the title."""
    labels = {"closed_form": "closed form", "autograd": "autograd (torch.func)"}
    names = list(times)
    fig = go.Figure(go.Bar(
        x=[times[n] for n in names], y=[labels.get(n, n) for n in names], orientation="h",
        text=[f"{times[n] * 1e3:.0f} ms" for n in names], textposition="auto",
        marker={"color": ["#00a676" if n == "closed_form" else "#636efa" for n in names]},
        hovertemplate="%{y}: %{x:.4f} s<extra></extra>"))
    fig.update_xaxes(title={"text": "seconds (best of 2)"})
    return _layout(fig, title, height)
