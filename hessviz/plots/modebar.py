"""Plotly's mode bar as hessviz shows it, in the app and in a lesson page alike.

Plotly draws a toolbar (the *mode bar*) over each figure's top right corner. Its default holds
buttons a lesson does without, and one it must not offer: plotly.js 3's "Share chart…"
(``sendChartToCloud``, shown unless ``showSendToCloud`` is false) uploads the figure to Plotly Cloud,
on a page handed to a class as needing no network. So every figure hessviz draws in a browser gets
:func:`config`: no logo, no cloud, no selection, ± zoom or hover-mode buttons (a short bar covers
less of the figure's title). On a touch or narrow screen the bar shows all the time (there is no
hover to hide it) and covers the title, so :data:`TOUCH_CSS` hides it there: zoom and pan work by
touch without it, and the downloads under each chart replace its camera button.
"""

from __future__ import annotations

REMOVED = (
    "select2d",
    "lasso2d",
    "zoomIn2d",
    "zoomOut2d",
    "autoScale2d",
    "toggleSpikelines",
    "hoverClosestCartesian",
    "hoverCompareCartesian",
    "sendChartToCloud",
)
"""Mode-bar buttons no hessviz figure shows (the last uploads the figure to Plotly Cloud)."""

TOUCH_CSS = """
@media (hover: none), (pointer: coarse), (max-width: 640px) {
  .js-plotly-plot .modebar-container { display: none !important; }
}
"""
"""CSS: no mode bar on a touch or narrow (≤ 640 px) screen."""


def config(filename: str | None = None) -> dict:
    """Plotly's ``config`` for a hessviz figure (``filename``: the camera button's PNG name).

    >>> c = config("spectrum")
    >>> c["showSendToCloud"], c["displaylogo"], c["toImageButtonOptions"]
    (False, False, {'filename': 'spectrum'})
    """
    out: dict = {
        "displaylogo": False,
        "showSendToCloud": False,
        "modeBarButtonsToRemove": list(REMOVED),
    }
    if filename is not None:
        out["toImageButtonOptions"] = {"filename": filename}
    return out
