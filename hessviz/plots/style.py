"""The look every figure shares: one template per theme, fonts, and one colour per name.

A figure is drawn for a ``theme`` (:data:`THEMES`):

* ``"light"`` (the default; the report's HTML figures) and ``"dark"``: a plotly template
  with our fonts, on white or dark backgrounds;
* ``"host"``: no template of our own; the embedding application's (Streamlit's light or
  dark theme, which it registers as plotly's default template) styles the figure.

:func:`apply_theme` re-themes a finished figure, so a host can draw any figure of
:mod:`hessviz.plots` in its own theme. Fonts are large (readable on a projector) and set
on the figure itself, so they are the same in every theme.

Colours: one per term (:data:`TERM_COLORS`), one per LayerNorm placement
(:data:`PLACEMENT_COLORS`, named by :data:`PLACEMENT_NAMES`), and :data:`PALETTE` for
anything else, in order.

>>> import plotly.graph_objects as go
>>> layout(go.Figure(), "t", theme="dark").layout.template.layout.paper_bgcolor
'rgb(17,17,17)'
>>> color_for("pre", 0) == PLACEMENT_COLORS["pre"] and color_for("x", 1) == PALETTE[1]
True
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import plotly.graph_objects as go
import plotly.io as pio

FONT_SIZE = 18
TITLE_SIZE = 22
DIVERGING = "RdBu_r"
SEQUENTIAL = "Viridis"
THEMES = {"light": "plotly_white", "dark": "plotly_dark", "host": None}
"""Theme -> plotly template (``None``: the host's default template)."""
TERM_COLORS = {"full": "#636efa", "outer": "#00a676", "functional": "#ef553b"}
PLACEMENT_COLORS = {"attention": "#ab63fa", "post": "#636efa", "pre": "#ffa15a", "none": "#19d3f3"}
PLACEMENT_NAMES = {"attention": "attention alone", "post": "Post-LN", "pre": "Pre-LN", "none": "no LN"}
PALETTE = ("#636efa", "#ef553b", "#00a676", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880")
GUIDE_COLOR = "#999999"
_LN_PRETTY = {"gamma": "γ", "beta": "β"}


def pretty(name: str) -> str:
    """A weight's name with its subscript in HTML: ``W_Q -> W<sub>Q</sub>``,
    ``b_O[1] -> b<sub>O</sub>[1]`` (a head slice keeps its index), ``ln1_gamma -> γ<sub>1</sub>``;
    in a stack the layer prefix stays, ``l1.W_Q -> l1.W<sub>Q</sub>``; anything else unchanged."""
    layer, dot, local = name.partition(".")
    if dot and layer[:1] == "l" and layer[1:].isdigit():
        return f"{layer}.{pretty(local)}"
    base, bracket, rest = name.partition("[")
    head = bracket + rest
    if base.startswith("ln") and "_" in base and base[2:].split("_")[0].isdigit():
        layer, _, which = base[2:].partition("_")
        if which in _LN_PRETTY:
            return f"{_LN_PRETTY[which]}<sub>{layer}</sub>{head}"
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
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
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
    giving a figure a template validates the whole template, 20–50 ms of CPU each time."""
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
    """The common layout: theme (or the one of :func:`drawn_in`), title, fonts, margins and
    height; returns ``fig``."""
    apply_theme(fig, _DRAWN_IN.get() or theme)
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
