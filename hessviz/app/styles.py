"""The app's few style rules: room for the chart on a projector, a phone, and presentation mode.

Streamlit's defaults leave a tall empty band above the title and a wide page title; at 1280×720
that pushed every first chart below the fold. The rules are plain CSS on Streamlit's own
``data-testid`` hooks, written once per run by :func:`apply`.
"""

from __future__ import annotations

import streamlit as st

from hessviz.app.address import Lesson
from hessviz.plots import modebar

BASE = """
[data-testid="stMainBlockContainer"] { padding-top: 64px; padding-bottom: 2rem; }
[data-testid="stMainBlockContainer"] h1 { font-size: 2rem; padding-top: 0.25rem; padding-bottom: 0.25rem; }
[data-testid="stMainBlockContainer"] h2 { font-size: 1.5rem; }
:is([data-testid="stMetricLabel"], [data-testid="stMetricValue"]) :is([data-testid="stMarkdownContainer"], p)
{ white-space: normal !important; overflow: visible !important; text-overflow: clip !important; }
[data-testid="stMarkdownContainer"] table { width: 100%; font-size: 0.9em; }
[data-testid="stMarkdownContainer"] :is(th, td) { padding: 0.25rem 0.4rem; }
[data-testid="stMultiSelectTagsContainer"] span
{ max-width: none !important; height: auto !important; white-space: normal !important;
  overflow: visible !important; text-overflow: clip !important; }
@media (max-width: 640px) {
  .st-key-hv_present_hint { display: none; }
  [data-testid="stMainBlockContainer"] { padding: 56px 0.75rem 2rem 0.75rem; }
  [data-testid="stMarkdownContainer"] .katex-display { font-size: 0.78em; overflow: auto hidden; }
  [data-testid="stMainBlockContainer"] h1 { font-size: 1.5rem; }
}
"""
"""Always: a shorter band above the title (Streamlit's header bar is 60 px tall), a smaller title;
a metric's label and value and a multiselect's chips wrap instead of ending in "…" ("64 (of…",
"norm (LayerN…"); a small table (:func:`hessviz.app.ui.table`) fits its column;
narrower margins on a phone, where display math is set smaller and scrolls sideways rather than
being cut off, and no line about presentation mode (the chart comes first there already)."""

_TOP = '[data-testid="stMainBlockContainer"] > [data-testid="stVerticalBlock"] > '
_CHART = '[class*="st-key-chart_"], .st-key-hv_live'
"""A chart drawn by :func:`hessviz.app.ui.chart` (its container's key starts with ``chart_``), or
the Learn page's live tour view."""

CHART_FIRST = f"""
{_TOP}:has(.st-key-hv_header) {{ order: -2; }}
{_TOP}:has({_CHART}):not({_TOP}:has({_CHART}) ~ *) {{ order: -1; }}
"""
"""The page's first chart right under its header: the page's top-level blocks are a flex column,
and CSS ``order`` lifts the header (:func:`hessviz.app.ui.header`'s container) and the first
block that holds a chart above the rest: explanations, controls and notes follow the chart.
Only the drawing order changes; every page keeps its own script order."""

NARROW = f"@media (max-width: 640px) {{ {CHART_FIRST} }}"
"""On a phone the chart comes first on every page, lesson link or not."""

TOOLBAR = modebar.TOUCH_CSS
"""Plotly's mode bar sits over the figure's title; a touch screen shows it all the time (there is
no hover to hide it), so on a touch or narrow screen it is not drawn (:mod:`hessviz.plots.modebar`)."""

PRESENT = """
html { font-size: 18px; }
[data-testid="stMainBlockContainer"] { padding-top: 60px; max-width: 100%; }
[data-testid="stMainBlockContainer"] h1 { font-size: 1.6rem; padding-bottom: 0; }
[data-testid="stMainBlockContainer"] .katex { font-size: 1.1em; }
"""
"""Presentation mode (``present=1``): larger type, the title small, the chart high on the screen."""

NO_SIDEBAR = """
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"]
{ display: none !important; }
"""
"""``hide=sidebar``: no sidebar and no button to open it (the navigation is at the top)."""


EMBEDDED = """
[data-testid="stMainBlockContainer"] { padding-top: 0.5rem !important; }
.st-key-hv_header h1 { display: none; }
"""
"""A page shown inside another (``embed=true``, the Learn page's live tour view): the title is the
story's beside it, and Streamlit draws no header bar to make room for, so the chart starts at
the frame's top."""


def css(lesson: Lesson, embedded: bool = False) -> str:
    """The style sheet for a run with these lesson flags (``embedded``: shown in another page's frame).

    >>> "font-size: 18px" in css(Lesson(present=True)), "stSidebarCollapsedControl" in css(Lesson())
    (True, False)
    >>> css(Lesson(present=True)).count("order: -1"), css(Lesson()).count("order: -1")   # phone only
    (2, 1)
    """
    return (
        BASE
        + NARROW
        + TOOLBAR
        + (PRESENT + CHART_FIRST if lesson.present else "")
        + ("" if lesson.sidebar else NO_SIDEBAR)
        + (EMBEDDED if embedded else "")
    )


def apply(lesson: Lesson) -> None:
    """Write the style sheet into the page (an invisible element)."""
    st.html(f"<style>{css(lesson, bool(st.context.is_embedded))}</style>")
