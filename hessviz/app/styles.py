"""The app's few style rules: room for the chart on a projector, a phone, and presentation mode.

Streamlit's defaults leave a tall empty band above the title and a wide page title; at 1280×720
that pushed every first chart below the fold. The rules are plain CSS on Streamlit's own
``data-testid`` hooks, written once per run by :func:`apply`.
"""

from __future__ import annotations

import streamlit as st

from hessviz.app.address import Lesson

BASE = """
[data-testid="stMainBlockContainer"] { padding-top: 64px; padding-bottom: 2rem; }
[data-testid="stMainBlockContainer"] h1 { font-size: 2rem; padding-top: 0.25rem; padding-bottom: 0.25rem; }
[data-testid="stMainBlockContainer"] h2 { font-size: 1.5rem; }
@media (max-width: 640px) {
  [data-testid="stMainBlockContainer"] { padding: 56px 0.75rem 2rem 0.75rem; }
  [data-testid="stMarkdownContainer"] .katex-display { font-size: 0.78em; overflow: auto hidden; }
  [data-testid="stMainBlockContainer"] h1 { font-size: 1.5rem; }
}
"""
"""Always: a shorter band above the title (Streamlit's header bar is 60 px tall), a smaller title;
narrower margins on a phone, where display math is set smaller and scrolls sideways rather than
being cut off."""

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


def css(lesson: Lesson) -> str:
    """The style sheet for a run with these lesson flags.

    >>> "font-size: 18px" in css(Lesson(present=True)), "display: none" in css(Lesson())
    (True, False)
    """
    return BASE + (PRESENT if lesson.present else "") + ("" if lesson.sidebar else NO_SIDEBAR)


def apply(lesson: Lesson) -> None:
    """Write the style sheet into the page (an invisible element)."""
    st.html(f"<style>{css(lesson)}</style>")
