"""The look every figure shares: one template per theme, fonts, and one colour per name.

A figure is drawn for a ``theme`` (:data:`THEMES`):

* ``"light"`` (the default; the report's HTML figures) and ``"dark"``: a plotly template
  with our fonts, on white or dark backgrounds;
* ``"host"``: no template of our own; the embedding application's (Streamlit's light or
  dark theme, which it registers as plotly's default template) styles the figure.

:func:`apply_theme` re-themes a finished figure, so a host can draw any figure of
:mod:`hessviz.plots` in its own theme. Fonts are large (readable on a projector) and set
on the figure itself, so they are the same in every theme.

Every figure also reads on a phone (:data:`PHONE_WIDTH`) as well as on a projector, whatever
width it is drawn at (:func:`layout` sets this for all): the legend sits below the plot,
horizontal, so it never takes the plot's width; long titles wrap (:func:`wrap`); a title pushes
the margin clear of tick labels drawn above the plot; every axis keeps one notation, and a log
axis is labelled 1-2-5 or in powers of ten from its data (:func:`readable_ticks`); colour bars
are slim, their title turned along them. Text that must fit a fixed share of the width (heatmap
cells, subplot titles) is sized for :data:`PHONE_WIDTH` with :func:`text_width`.

Colours: one per term (:data:`TERM_COLORS`), one per LayerNorm placement
(:data:`PLACEMENT_COLORS`, named by :data:`PLACEMENT_NAMES`), and :data:`PALETTE` for
anything else, in order.

>>> import plotly.graph_objects as go
>>> layout(go.Figure(), "t", theme="dark").layout.template.layout.paper_bgcolor
'rgb(17,17,17)'
>>> color_for("pre", 0) == PLACEMENT_COLORS["pre"] and color_for("x", 1) == PALETTE[1]
True
>>> wrap("Per-block curvature, layer 3 of all-MiniLM-L6-v2", 30)
'Per-block curvature, layer 3<br>of all-MiniLM-L6-v2'
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
from collections.abc import Iterator

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

FONT_SIZE = 18
TITLE_SIZE = 22
DIVERGING = "RdBu_r"
SEQUENTIAL = "Viridis"
THEMES = {"light": "plotly_white", "dark": "plotly_dark", "host": None}
"""Theme -> plotly template (``None``: the host's default template)."""
TERM_COLORS = {"full": "#636efa", "outer": "#00a676", "functional": "#ef553b"}
PLACEMENT_COLORS = {
    "attention": "#ab63fa",
    "post": "#636efa",
    "pre": "#ffa15a",
    "none": "#19d3f3",
    "parallel": "#00cc96",
    "peri": "#ff6692",
}
PLACEMENT_NAMES = {
    "attention": "attention alone",
    "post": "Post-LN",
    "pre": "Pre-LN",
    "none": "no LN",
    "parallel": "parallel",
    "peri": "Peri-LN",
}
PALETTE = ("#636efa", "#ef553b", "#00a676", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880")
GUIDE_COLOR = "#999999"
PHONE_WIDTH = 358
"""The narrowest width a figure is drawn at, in CSS pixels: a 390-px phone less Streamlit's padding."""
TITLE_CHARS = 27
"""A title wraps after about this many characters: at :data:`TITLE_SIZE` that fills :data:`PHONE_WIDTH`."""
CHAR_WIDTH = 0.6
"""Width of an average glyph of our fonts, as a fraction of the font size (digits, lower case; a
slight overestimate, so that text sized with it fits)."""
LEGEND_BELOW = {
    "orientation": "h",
    "xref": "container",
    "yref": "container",
    "x": 0.0,
    "xanchor": "left",
    "y": 0.0,
    "yanchor": "bottom",
    "font": {"size": FONT_SIZE - 2},
}
"""Legends sit under the plot, left-aligned and horizontal (wrapping into rows), at the bottom of
the figure: container coordinates make plotly reserve their space below the axis titles."""
COLORBAR = {"thickness": 14, "tickfont": {"size": FONT_SIZE - 4}, "title": {"side": "right"}}
_LN_PRETTY = {"gamma": "γ", "beta": "β"}


def visible(text: str) -> str:
    """``text`` as drawn: HTML tags (``<sub>``, ``<br>``) removed."""
    return re.sub(r"<[^>]*>", "", text)


def signed(value: float, digits: int = 2) -> str:
    """``value`` to ``digits`` decimals with a true minus sign (U+2212), the way every figure, page
    and story prints a fitted slope, so that a story's ``−0.05`` is its chart's ``−0.05``.

    >>> signed(-0.049), signed(5.982), signed(-0.001)
    ('−0.05', '5.98', '0.00')
    """
    text = f"{value:.{digits}f}"
    return text[1:] if float(text) == 0 else text.replace("-", "−")


def text_width(text: str, size: float) -> float:
    """Estimated drawn width in pixels of ``text`` (HTML allowed; its longest line) at font ``size``."""
    lines = re.split(r"<br\s*/?>", text)
    return max(len(visible(line)) for line in lines) * size * CHAR_WIDTH


def wrap(text: str, width: int = TITLE_CHARS) -> str:
    """Break ``text`` at spaces into lines of at most ``width`` visible characters, joined by
    ``<br>`` (existing ``<br>`` kept; a word longer than ``width`` stays whole)."""
    out = []
    for para in re.split(r"<br\s*/?>", text):
        line = ""
        for word in para.split(" "):
            candidate = f"{line} {word}" if line else word
            if line and len(visible(candidate)) > width:
                out.append(line)
                line = word
            else:
                line = candidate
        out.append(line)
    return "<br>".join(out)


def pretty(name: str) -> str:
    """A weight's name with its subscript in HTML: ``W_Q -> W<sub>Q</sub>``,
    ``b_O[1] -> b<sub>O</sub>[1]`` (a head slice keeps its index), ``ln1_gamma -> γ<sub>1</sub>``,
    ``ln2_out_beta -> β<sub>2,out</sub>``, the QK-norms ``q_norm_gamma -> γ<sub>q</sub>``;
    in a stack the layer prefix stays, ``l1.W_Q -> l1.W<sub>Q</sub>``; anything else unchanged."""
    layer, dot, local = name.partition(".")
    if dot and layer[:1] == "l" and layer[1:].isdigit():
        return f"{layer}.{pretty(local)}"
    base, bracket, rest = name.partition("[")
    head = bracket + rest
    if base.startswith("ln") and "_" in base and base[2:].split("_")[0].isdigit():
        layer, _, which = base[2:].partition("_")
        out, _, after = which.partition("_")  # Peri-LN's output norms: ln1_out_gamma
        if out == "out" and after in _LN_PRETTY:
            return f"{_LN_PRETTY[after]}<sub>{layer},out</sub>{head}"
        if which in _LN_PRETTY:
            return f"{_LN_PRETTY[which]}<sub>{layer}</sub>{head}"
    qk, norm, which = base.partition("_norm_")
    if norm and qk in ("q", "k") and which in _LN_PRETTY:
        return f"{_LN_PRETTY[which]}<sub>{qk}</sub>{head}"
    letter, underscore, sub = base.partition("_")
    if underscore and letter in ("W", "b") and sub.isalnum():
        return f"{letter}<sub>{sub}</sub>{head}"
    return name


def color_for(name: str, index: int) -> str:
    """A term's or placement's own colour, else the ``index``-th of :data:`PALETTE`."""
    return TERM_COLORS.get(name) or PLACEMENT_COLORS.get(name) or PALETTE[index % len(PALETTE)]


def placement_name(name: str) -> str:
    return PLACEMENT_NAMES.get(name, name)


def rgba(hex_color: str, alpha: float) -> str:
    """``"#rrggbb"`` with opacity ``alpha`` as a CSS ``rgba(...)``."""
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def check_theme(theme: str) -> None:
    if theme not in THEMES:
        raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {theme!r}")


_DRAWN_IN: contextvars.ContextVar[str | None] = contextvars.ContextVar("hessviz_drawn_in", default=None)


@contextlib.contextmanager
def drawn_in(theme: str) -> Iterator[None]:
    """Inside, every figure of :mod:`hessviz.plots` is laid out in ``theme``, whatever theme the
    plot function was given. An application that shows figures in its own theme (the app:
    ``"host"``) uses it so that no figure first gets a template only to have it replaced:
    giving a figure a template validates the whole template, each time (its CPU: ``benchmarks/APP.md``)."""
    check_theme(theme)
    token = _DRAWN_IN.set(theme)
    try:
        yield
    finally:
        _DRAWN_IN.reset(token)


def apply_theme(fig: go.Figure, theme: str) -> go.Figure:
    """Give ``fig`` the template of ``theme`` (:data:`THEMES`); returns ``fig``. A figure that
    this function already gave that theme is left as it is."""
    check_theme(theme)
    if getattr(fig, "_hessviz_theme", None) != theme:
        fig.update_layout(template=THEMES[theme] or pio.templates.default)
        fig._hessviz_theme = theme
    return fig


def layout(fig: go.Figure, title: str | None = None, height: int = 560, *, theme: str = "light") -> go.Figure:
    """The common layout: theme (or the one of :func:`drawn_in`), title, fonts, margins, height and
    the rules that make a figure read at any width (module docstring); returns ``fig``."""
    apply_theme(fig, _DRAWN_IN.get() or theme)
    title = wrap(title) if title else None
    lines = title.count("<br>") + 1 if title else 0
    fig.update_layout(
        font={"size": FONT_SIZE},
        height=height + 28 * max(lines - 1, 0),
        margin={"l": 70, "r": 30, "t": 30, "b": 60},
        hoverlabel={"font": {"size": FONT_SIZE}},
        legend=LEGEND_BELOW,
    )
    axis_fonts = {"tickfont": {"size": FONT_SIZE - 2}, "title": {"font": {"size": FONT_SIZE}}}
    fig.update_xaxes(**axis_fonts)
    fig.update_yaxes(**axis_fonts)
    readable_ticks(fig)
    fig.for_each_xaxis(lambda ax: _few_log_labels(ax, 3))
    fig.for_each_yaxis(lambda ax: _few_log_labels(ax, 4))
    subtitles = _subplot_titles_height(fig)
    if subtitles:
        _title_over_subplots(fig, title, subtitles)
    elif title:
        fig.update_layout(title=_title(title))
    fig.update_traces(colorbar=COLORBAR, selector=lambda tr: "colorbar" in tr)
    return fig


def _title_over_subplots(fig: go.Figure, title: str | None, subtitles: int) -> None:
    """A figure of subplots with titles: the top margin holds the figure's title and, under it,
    the subplot titles (plotly's title automargin moves the plot area but leaves heatmaps and
    subplot titles where they were: measured in Chromium). Anchored at its bottom, a title of
    ``n`` lines is drawn from its first line down: its first line's foot goes 34 px from the top."""
    line = round(1.3 * TITLE_SIZE)
    lines = title.count("<br>") + 1 if title else 0
    top = 10 + subtitles + (39 + line * (lines - 1) if title else 10)
    fig.update_layout(margin={"t": top})
    if title:
        fig.update_layout(
            title={
                "text": title,
                "font": {"size": TITLE_SIZE},
                "x": 0.01,
                "xanchor": "left",
                "yref": "container",
                "y": 1 - 34 / fig.layout.height,
                "yanchor": "bottom",
            }
        )


def _title(title: str) -> dict:
    """The title at the top left of the figure; plotly reserves its height above everything else
    (title automargin in container coordinates), so tick labels drawn above a heatmap and
    subplot titles sit below it. Plotly draws a title of ``n > 1`` lines anchored at its top
    ``n`` line heights too high (measured in Chromium: 2 lines 58 px, 3 lines 87 px, at 22 px),
    so the top pad adds that and the bottom pad takes it back: the reserved height stays the
    title's own."""
    lines = title.count("<br>") + 1
    shift = round(1.3 * TITLE_SIZE * lines) if lines > 1 else 0
    return {
        "text": title,
        "font": {"size": TITLE_SIZE},
        "x": 0.01,
        "xanchor": "left",
        "yref": "container",
        "y": 1,
        "yanchor": "top",
        "automargin": True,
        "pad": {"t": 10 + shift, "b": 10 - shift},
    }


def _subplot_titles_height(fig: go.Figure) -> int:
    """Pixels that the titles of the top row of subplots (annotations standing on the top of the
    plot area, as ``make_subplots`` places them) take above it; the top margin makes room for them
    under the figure's title."""
    tops = [
        a
        for a in fig.layout.annotations
        if a.yref == "paper" and a.yanchor == "bottom" and a.y is not None and a.y >= 0.999 and a.text
    ]
    heights = [round(1.3 * (a.font.size or FONT_SIZE) * (a.text.count("<br>") + 1)) for a in tops]
    return max(heights, default=0)


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_label(value: float) -> str:
    """``value`` (a 1, 2, 3 or 5 times a power of ten) in powers of ten, as plotly's ``power``
    format writes them: ``1``, ``10``, ``10⁻⁵``, ``2×10⁻⁵``, signs kept.

    >>> [power_label(v) for v in (1.0, 10.0, 1e-5, 2e-5, -3e6)]
    ['1', '10', '10⁻⁵', '2×10⁻⁵', '−3×10⁶']
    """
    sign = "−" if value < 0 else ""
    k = math.floor(math.log10(abs(value)) + 1e-9)
    m = round(abs(value) / 10.0**k)
    power = {0: "1", 1: "10"}.get(k, f"10{str(k).translate(SUPERSCRIPT)}")
    if m == 1:
        return sign + power
    return sign + (f"{m * 10**k:g}" if k in (0, 1) else f"{m}×{power}")


def log_ticks(lo: float, hi: float, *, cover: bool = False) -> tuple[list[float], list[str]] | None:
    """Tick values and labels for a log axis over the data range ``[lo, hi]``: 1-2-5 steps within
    two decades (``0.1, 0.2, 0.5, 1, 2, 5, 10``), 1-3 steps within three and a half, else powers
    of ten (every k-th, 1 among them). One notation per axis: plain numbers when every label is
    between 0.001 and 10⁴, else powers of ten for all. None when fewer than two ticks fall in range.
    With ``cover`` the last tick is the first step at or above ``hi`` (the thinned powers counted
    down from it), so the tallest bar's value can be read against a tick above it.

    >>> log_ticks(2, 64)[1]
    ['2', '5', '10', '20', '50']
    >>> log_ticks(1e-4, 1.0)[1]
    ['10⁻⁴', '10⁻³', '10⁻²', '10⁻¹', '1']
    >>> log_ticks(1e-15, 10.0)[1]
    ['10⁻¹⁵', '10⁻¹²', '10⁻⁹', '10⁻⁶', '10⁻³', '1']
    >>> log_ticks(1e-9, 4e-3, cover=True)[1]
    ['10⁻⁸', '10⁻⁶', '10⁻⁴', '10⁻²']
    """
    if not (np.isfinite(lo) and np.isfinite(hi) and 0 < lo < hi):
        return None
    decades = math.log10(hi / lo)
    steps = (1, 2, 5) if decades <= 2 else (1, 3) if decades <= 3.5 else (1,)
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    grid = [m * 10.0**k for k in range(first, last + 2) for m in steps]
    top = next(v for v in grid if v >= hi / 1.001) if cover else hi * 1.001
    vals = [v for v in grid if lo / 1.001 <= v <= max(top, hi * 1.001)]
    if steps == (1,) and len(vals) > 6:
        every = math.ceil(len(vals) / 6)
        anchor = round(math.log10(top)) if cover else 0  # the tick above the data, else 1
        vals = [v for v in vals if (round(math.log10(v)) - anchor) % every == 0]
    if len(vals) < 2:
        return None
    plain = all(1e-3 <= v < 1e4 for v in vals)
    return vals, [f"{v:g}" if plain else power_label(v) for v in vals]


def _axis_data(fig: go.Figure, letter: str, ref: str) -> np.ndarray:
    """Every finite positive value the traces draw on axis ``ref`` (``x``, ``y2``, …)."""
    out = []
    for trace in fig.data:
        if (getattr(trace, letter + "axis", None) or letter) != ref:
            continue
        values = getattr(trace, letter, None)
        if values is None:
            continue
        try:
            a = np.asarray(values, dtype=float).ravel()
        except (TypeError, ValueError):
            continue
        out.append(a[np.isfinite(a) & (a > 0)])
    return np.concatenate(out) if out else np.zeros(0)


def readable_ticks(fig: go.Figure) -> go.Figure:
    """Every axis of ``fig`` in one notation: a log axis gets :func:`log_ticks` over its data
    (instead of plotly's minor digits "2 5 10 2 5" and mixed "100µ", "0.01", "10⁻¹⁸"), a linear axis
    plotly's ``power`` format (not SI prefixes such as "1µ"). Axes with their own ticks are kept."""
    for name in list(fig.layout):
        match = re.fullmatch(r"([xy])axis(\d*)", name)
        if not match:
            continue
        axis = fig.layout[name]
        if axis.tickvals is not None or axis.dtick is not None:
            continue
        if axis.type != "log":
            if axis.exponentformat is None:
                axis.exponentformat = "power"
            continue
        ref = match[1] + match[2]
        data = _axis_data(fig, match[1], ref)
        bars = any(
            t.type == "bar" and (getattr(t, match[1] + "axis", None) or match[1]) == ref for t in fig.data
        )
        ticks = log_ticks(float(data.min()), float(data.max()), cover=bars) if data.size else None
        if ticks is not None:
            axis.tickvals, axis.ticktext = ticks
            if bars and axis.range is None:  # bars: the axis reaches the tick above the tallest
                bottom, top = math.log10(min(data.min(), ticks[0][0])), math.log10(ticks[0][-1])
                pad = 0.04 * max(top - bottom, 1.0)
                axis.range = [bottom - pad, top + pad]
    return fig


def _few_log_labels(axis, nticks: int) -> None:
    """A log axis asks plotly for about ``nticks`` labels: within a decade or two it labels 2 and 5
    (not every digit 2 … 9, which overprint on a narrow axis), over many decades every k-th
    power. Axes with their own ticks are left alone."""
    if axis.type == "log" and axis.tickvals is None and axis.dtick is None and axis.nticks is None:
        axis.nticks = nticks
