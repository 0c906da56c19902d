"""Curves over seeds: a centre line and a band per curve, fitted power laws, guides, scatters.

Every curve is measured once per seed, an array ``(n_seeds, n)`` (a ``(n,)`` array is one
seed). :func:`band_plot` draws its centre, a named statistic over seeds
(:func:`hessviz.laws.fitting.center`: ``"median"`` or ``"geomean"``), and the band from the
minimum to the maximum over seeds. The other curve figures are :func:`band_plot` with a
given layout: one sweep (:func:`sweep_plot`), one curve per sweep (:func:`compare_plot`),
one panel per placement (:func:`side_by_side`), training losses (:func:`training_curves`).

>>> import numpy as np
>>> fig = band_plot([1.0, 2.0], {"a": np.array([[1.0, 4.0], [4.0, 16.0]])}, stat="geomean",
...                 x_title="x", y_title="y")
>>> fig.data[-1].y.round(9).tolist(), fig.layout.xaxis.type
([2.0, 8.0], 'log')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hessviz.laws.fitting import RangeFit, center
from hessviz.plots.style import (
    FONT_SIZE,
    GUIDE_COLOR,
    PHONE_WIDTH,
    color_for,
    layout,
    placement_name,
    rgba,
    signed,
    text_width,
)


@dataclass(frozen=True)
class Guide:
    """A dashed power law ``x^exponent`` through the point ``at`` of the centre of ``anchor``."""

    exponent: float
    anchor: str
    at: int = 0
    label: str = ""


def _fit_label(f: RangeFit) -> str:
    fit = f.fit
    text = f" · slope {signed(fit.slope)}"
    if fit.ci[0] != fit.ci[1]:
        text += f" [{signed(fit.ci[0])}, {signed(fit.ci[1])}]"
    return text + (f" (theory {f.expected:g})" if f.expected is not None else "")


def add_bands(
    fig: go.Figure,
    x,
    curves: Mapping[str, np.ndarray],
    *,
    stat: str,
    fits: Mapping[str, RangeFit] | None = None,
    names: Mapping[str, str] | None = None,
    guides: Sequence[Guide] = (),
    row: int | None = None,
    col: int | None = None,
    show_legend: bool = True,
    hover_prefix: str = "",
) -> None:
    """Add each curve's band, centre line, fitted line and the guides to ``fig`` (or one subplot)."""
    x = np.asarray(x, dtype=np.float64)
    at = {"row": row, "col": col} if row is not None else {}
    centres = {}
    for k, (key, Y) in enumerate(curves.items()):
        Y = np.atleast_2d(np.asarray(Y, dtype=np.float64))
        c = centres[key] = center(Y, stat)
        col_ = color_for(key, k)
        name = (names or {}).get(key, key)
        if Y.shape[0] > 1:
            fig.add_trace(
                go.Scatter(
                    x=np.concatenate([x, x[::-1]]),
                    y=np.concatenate([np.nanmax(Y, axis=0), np.nanmin(Y, axis=0)[::-1]]),
                    fill="toself",
                    fillcolor=rgba(col_, 0.18),
                    line={"width": 0},
                    hoverinfo="skip",
                    showlegend=False,
                    legendgroup=key,
                ),
                **at,
            )
        f = (fits or {}).get(key)
        fitted = f is not None and f.fit is not None
        label = name + (_fit_label(f) if fitted else "")
        fig.add_trace(
            go.Scatter(
                x=x,
                y=c,
                mode="lines+markers",
                name=label,
                legendgroup=key,
                showlegend=show_legend,
                line={"color": col_, "width": 3},
                marker={"size": 8},
                hovertemplate=f"{hover_prefix}{name}<br>%{{x:.3g}}<br>{stat} %{{y:.4g}}<extra></extra>",
            ),
            **at,
        )
        if fitted:
            xs = np.array([f.lo, f.hi])
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=np.exp(f.fit.intercept) * xs**f.fit.slope,
                    mode="lines",
                    line={"color": col_, "dash": "dash", "width": 2},
                    showlegend=False,
                    legendgroup=key,
                    hoverinfo="skip",
                ),
                **at,
            )
    seen = set()
    for g in guides:
        c = centres[g.anchor]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=c[g.at] * (x / x[g.at]) ** g.exponent,
                mode="lines",
                name=g.label,
                legendgroup=g.label,
                showlegend=show_legend and g.label not in seen,
                line={"color": GUIDE_COLOR, "dash": "dash"},
                hoverinfo="skip",
            ),
            **at,
        )
        seen.add(g.label)


def band_plot(
    x,
    curves: Mapping[str, np.ndarray],
    *,
    stat: str,
    x_title: str,
    y_title: str,
    title: str | None = None,
    fits: Mapping[str, RangeFit] | None = None,
    names: Mapping[str, str] | None = None,
    guides: Sequence[Guide] = (),
    logx: bool = True,
    logy: bool = True,
    height: int = 520,
    theme: str = "light",
) -> go.Figure:
    """Curves ``name -> (n_seeds, n)`` over ``x``: the ``stat`` centre and the min–max band.

    ``fits[name]`` adds a dashed fitted line over its range and its slope to the legend;
    ``names`` renames curves in the legend; ``guides`` draws power laws.
    """
    fig = go.Figure()
    add_bands(fig, x, curves, stat=stat, fits=fits, names=names, guides=guides)
    fig.update_xaxes(type="log" if logx else "linear", title={"text": x_title})
    fig.update_yaxes(type="log" if logy else "linear", title={"text": y_title}, exponentformat="power")
    return layout(fig, title, height, theme=theme)


def collapse_plot(
    x,
    curves: Mapping[str, np.ndarray],
    *,
    title: str | None,
    x_title: str = "σ_min",
    guide: bool = False,
    theme: str = "light",
) -> go.Figure:
    """Spectral norms ``name -> (n_seeds, n)`` against the σ of a collapsing LayerNorm input row on
    log–log axes: the geometric mean over the seeds and the min–max band (:func:`band_plot`);
    ``guide`` draws the law σ⁻² through the last point of the first curve."""
    first = next(iter(curves))
    return band_plot(
        x,
        curves,
        stat="geomean",
        title=title,
        x_title=x_title,
        y_title="spectral norm",
        guides=[Guide(-2.0, first, -1, "σ⁻² guide")] if guide else (),
        theme=theme,
    )


def _logx(sweep) -> bool:
    """Log axes for the power laws in ‖X‖₂, L and d; a linear axis for the depth of a stack."""
    return sweep.axis != "layers"


def _x_title(sweep) -> str:
    from hessviz.laws.sweeps import AXES

    return AXES.get(sweep.axis, sweep.axis)


def sweep_plot(
    sweep,
    keys: Sequence[str] | None = None,
    *,
    stat: str,
    y_title: str = "block norm",
    x_title: str | None = None,
    title: str | None = None,
    fits: Mapping[str, RangeFit] | None = None,
    names: Mapping[str, str] | None = None,
    height: int = 520,
    theme: str = "light",
) -> go.Figure:
    """The curves ``keys`` (all by default) of one :class:`hessviz.laws.sweeps.Sweep` on log–log axes."""
    keys = list(sweep.values) if keys is None else list(keys)
    return band_plot(
        sweep.grid,
        {k: sweep.values[k] for k in keys},
        stat=stat,
        fits=fits,
        names=names,
        x_title=x_title or _x_title(sweep),
        y_title=y_title,
        title=title or sweep.label or None,
        logx=_logx(sweep),
        height=height,
        theme=theme,
    )


def compare_plot(
    sweeps: Mapping[str, object],
    key: str,
    *,
    stat: str,
    y_title: str = "block norm",
    x_title: str | None = None,
    title: str | None = None,
    guide: float | None = None,
    guide_label: str = "",
    logx: bool = True,
    height: int = 520,
    theme: str = "light",
) -> go.Figure:
    """Curve ``key`` of each sweep (``name -> Sweep``, same grid), one colour per name (placements
    get theirs); ``guide`` draws ``x^guide`` through each curve's first point."""
    first = next(iter(sweeps.values()))
    curves = {n: sw.values[key] for n, sw in sweeps.items()}
    guides = [Guide(guide, n, 0, guide_label) for n in curves] if guide is not None else ()
    return band_plot(
        first.grid,
        curves,
        stat=stat,
        names={n: placement_name(n) for n in curves},
        guides=guides,
        x_title=x_title or _x_title(first),
        y_title=y_title,
        title=title,
        logx=logx,
        height=height,
        theme=theme,
    )


def side_by_side(
    sweeps: Mapping[str, object],
    *,
    stat: str,
    y_title: str = "block norm",
    x_title: str | None = None,
    fits: Mapping[str, Mapping[str, RangeFit]] | None = None,
    title: str | None = None,
    height: int = 520,
    theme: str = "light",
) -> go.Figure:
    """One log–log panel per placement (``name -> Sweep``, e.g. attention alone, Post-LN, Pre-LN),
    one y axis shared by all; each panel's title gives its fitted ``outer`` slope. Up to three panels
    stand in one row; four (with Peri-LN) stand two by two, so that each title keeps half a phone's
    width (:func:`subplot_title_size`) and the chart grows by a third."""
    names = list(sweeps)
    cols = len(names) if len(names) <= 3 else 2
    rows = -(-len(names) // cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        shared_yaxes=True,
        horizontal_spacing=0.06,
        vertical_spacing=0.16,
        subplot_titles=[_panel_title(n, (fits or {}).get(n)) for n in names],
    )
    for i, pname in enumerate(names):
        sw = sweeps[pname]
        row, col = divmod(i, cols)
        row, col = row + 1, col + 1
        add_bands(
            fig,
            sw.grid,
            sw.values,
            stat=stat,
            row=row,
            col=col,
            show_legend=i == 0,
            hover_prefix=f"{pname}, ",
        )
        middle = row == rows and col == (cols + 1) // 2  # one x title, under the bottom row's middle
        fig.update_xaxes(
            type="log" if _logx(sw) else "linear",
            title={"text": x_title or _x_title(sw) if middle else None},
            row=row,
            col=col,
        )
    span = _log_range(sweeps) if rows > 1 else None
    every = None if span is None else max(1, int(np.ceil((span[1] - span[0]) / 5)))  # decades a tick
    fig.update_yaxes(type="log", exponentformat="power", range=span, dtick=every)
    for row in range(1, rows + 1):
        fig.update_yaxes(title={"text": y_title}, row=row, col=1)
    titles = [a.text for a in fig.layout.annotations]
    fig.update_annotations(font={"size": subplot_title_size(titles[:cols])})
    fig = layout(fig, title, height if rows == 1 else height * 4 // 3, theme=theme)
    return fig.update_xaxes(tickfont={"size": FONT_SIZE - 5})  # narrow panels: 0.01, 2, 5, 0.1 apart


def _log_range(sweeps: Mapping[str, object], pad: float = 0.25) -> list[float] | None:
    """``[log10 lo, log10 hi]`` over every positive value of every sweep, ``pad`` decades wider each
    side: one y range for all the panels of a grid (a row's panels share theirs; rows set it alike).
    ``None`` when there is no positive value (plotly's own range then)."""
    values = np.concatenate(
        [np.ravel(np.asarray(v, dtype=np.float64)) for sw in sweeps.values() for v in sw.values.values()]
    )
    values = values[np.isfinite(values) & (values > 0)]
    if not values.size:
        return None
    return [float(np.log10(values.min())) - pad, float(np.log10(values.max())) + pad]


def _panel_title(name: str, fits: Mapping[str, RangeFit] | None) -> str:
    """The placement on one line, its fitted outer slope on the next (``Post-LN<br>outer slope 4.02``),
    to the two decimals the page's table and the tour's story print."""
    label = placement_name(name)
    if fits and "outer" in fits and np.isfinite(fits["outer"].slope):
        label += f"<br>outer slope {signed(fits['outer'].slope)}"
    return label


def subplot_title_size(titles: Sequence[str], *, reserved: int = 100) -> int:
    """The largest font, up to ``FONT_SIZE − 2`` and at least 11, at which each of ``titles`` (one
    per side-by-side panel) fits its panel's share of :data:`~hessviz.plots.style.PHONE_WIDTH`
    less ``reserved`` pixels (axis labels, margins): titles of neighbouring panels never meet."""
    share = (PHONE_WIDTH - reserved) / max(len(titles), 1)
    widest = max((text_width(s, 1.0) for s in titles), default=0.0)
    return max(11, min(FONT_SIZE - 2, int(share / widest))) if widest else FONT_SIZE - 2


def training_curves(
    curves: Mapping[str, np.ndarray],
    *,
    title: str = "Training loss",
    threshold: float | None = None,
    height: int = 460,
    theme: str = "light",
) -> go.Figure:
    """``name -> (n_seeds, steps + 1)`` losses on a log axis: geometric mean and band over seeds."""
    n = max(np.atleast_2d(np.asarray(Y)).shape[1] for Y in curves.values())
    fig = band_plot(
        np.arange(n),
        curves,
        stat="geomean",
        x_title="step",
        y_title="training loss",
        title=title,
        logx=False,
        height=height,
        theme=theme,
    )
    if threshold is not None:
        fig.add_hline(
            y=threshold, line_dash="dash", line_color=GUIDE_COLOR, annotation_text=f"threshold {threshold:g}"
        )
    return fig


def scatter_figure(
    points: Mapping[str, tuple],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    logy: bool = True,
    diagonal: bool = False,
    level: tuple[float, str] | None = None,
    hover: Mapping[str, Sequence[str]] | None = None,
    height: int = 520,
    theme: str = "light",
) -> go.Figure:
    """``points`` name -> ``(x, y)`` arrays as markers; ``diagonal`` draws ``y = x``; ``level``
    ``(y, name)`` draws the horizontal line ``y`` across the points' x range, named in the legend
    (a ratio's 1: which side of it a point falls on is the verdict)."""
    fig = go.Figure()
    lo, hi = np.inf, -np.inf
    for i, (name, (x, y)) in enumerate(points.items()):
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        if x.size:
            lo, hi = min(lo, np.nanmin(x), np.nanmin(y)), max(hi, np.nanmax(x), np.nanmax(y))
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="markers",
                name=placement_name(name),
                marker={"color": color_for(name, i), "size": 8, "opacity": 0.75},
                text=(hover or {}).get(name),
            )
        )
    if diagonal and np.isfinite(lo):
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo, hi],
                mode="lines",
                name="y = x",
                line={"color": GUIDE_COLOR, "dash": "dash"},
            )
        )
    xs = [np.asarray(x, dtype=float) for x, _ in points.values()]
    xs = np.concatenate(xs) if xs else np.zeros(0)
    if level is not None and xs.size and np.isfinite(xs).any():
        fig.add_trace(
            go.Scatter(
                x=[np.nanmin(xs), np.nanmax(xs)],
                y=[level[0]] * 2,
                mode="lines",
                name=level[1],
                line={"color": GUIDE_COLOR, "dash": "dash"},
            )
        )
    fig.update_xaxes(type="log" if logx else "linear", title={"text": xlabel})
    fig.update_yaxes(type="log" if logy else "linear", title={"text": ylabel}, exponentformat="power")
    return layout(fig, title, height, theme=theme)
