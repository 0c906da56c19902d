"""Every page at a projector's 1280×720 and a phone's 390×844, in headless Chromium: no text of
a figure is cut by its edge or overlaps another (title, subplot titles, axis titles, tick labels,
legend, colour bar, the numbers in heatmap cells), and no label, button or metric of the page is
cut by its box (:mod:`tests.figure_layout` measures both).

Needs Chromium (``HESSVIZ_CHROMIUM``); skipped without it, failed without it when ``CI`` is set.
"""

from __future__ import annotations

import pytest

from hessviz.app.registry import ALL_PAGES
from tests.figure_layout import CUT_TEXT_JS, FIGURE_PROBLEMS_JS
from tests.streamlit_server import chromium, require_chromium, running_server

pytestmark = pytest.mark.browser

VIEWPORTS = {"projector": {"width": 1280, "height": 720}, "phone": {"width": 390, "height": 844}}
IDLE = ("() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
        " return a && a.getAttribute('data-test-script-state') === 'notRunning'; }")


@pytest.fixture(scope="module")
def base():
    require_chromium()
    with running_server("streamlit_layout_test.log") as srv:
        yield srv.base


@pytest.fixture(scope="module")
def browser(base):
    with chromium() as b:
        yield b


def _problems(page, spec, size: str) -> list[str]:
    found = page.evaluate(FIGURE_PROBLEMS_JS) + page.evaluate(CUT_TEXT_JS)
    return [f"{spec.title} at {size}: {f}" for f in found]


def test_nothing_is_cut_or_overlapping(base, browser):
    """Each page is opened once at the projector's size and then narrowed to the phone's: the
    columns stack and every figure is redrawn at the new width (plotly's responsive layout)."""
    ctx = browser.new_context(viewport=VIEWPORTS["projector"])
    page = ctx.new_page()
    problems = []
    try:
        for spec in ALL_PAGES:
            page.set_viewport_size(VIEWPORTS["projector"])
            page.goto(f"{base}/{'' if spec.default else spec.url_path}")
            page.wait_for_selector("h1", timeout=180_000)
            page.wait_for_function(IDLE, timeout=180_000)
            page.wait_for_timeout(1000)                     # a rerun that the first run asked for
            page.wait_for_function(IDLE, timeout=180_000)
            problems += _problems(page, spec, "1280x720")
            page.set_viewport_size(VIEWPORTS["phone"])
            page.wait_for_timeout(1500)                     # columns stack, figures relayout
            problems += _problems(page, spec, "390x844")
    finally:
        ctx.close()
    assert not problems, "\n".join(problems)
