"""The app's own running indicator: a "Running…" badge at the top of the screen while a script run
goes on past half a second, on every page and screen.

Streamlit marks a run on its root element (``data-test-script-state="running"``), and a style rule
on that mark draws the badge; a CSS animation delays it by half a second, so a cheap rerun does not
flash it. Streamlit's own indicator (the running man in the toolbar) waits for 500 ms without a
re-render before it shows, and a page that draws a spinner, a bar or an element more often than
that never let it show: the SmolLM2 view of issue 44 ran 338 s with nothing on screen saying it
worked. :func:`show` is the first thing a run writes (:func:`hessviz.app.main.main`), before the
imports of a cold server's first run (2-3 s), and imports nothing heavy.
"""

from __future__ import annotations

import streamlit as st

RUNNING = """
[data-testid="stApp"][data-test-script-state="running"]::after
{ content: "Running…"; position: fixed; top: 0.55rem; left: 50%; transform: translateX(-50%);
  z-index: 1000100; padding: 0.1rem 0.75rem; border-radius: 1rem; font-size: 0.85rem;
  background: rgba(255, 75, 75, 0.92); color: #fff; pointer-events: none;
  opacity: 0; animation: hv-running 0.2s ease-in 0.5s forwards; }
@keyframes hv-running { to { opacity: 1; } }
"""
"""The badge's style: the root element's mark selects it, the animation shows it after 0.5 s."""


def show() -> None:
    """Write the badge's style into the page (an invisible element)."""
    st.html(f"<style>{RUNNING}</style>")
