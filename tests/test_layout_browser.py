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
IDLE = (
    "() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
    " return a && a.getAttribute('data-test-script-state') === 'notRunning'; }"
)


@pytest.fixture(scope="module")
def base():
    require_chromium()
    with running_server("streamlit_layout_test.log") as srv:
        yield srv.base


@pytest.fixture(scope="module")
def browser(base):
    with chromium() as b:
        yield b


SIDEWAYS_JS = (
    "() => { const m = document.querySelector('[data-testid=stMain]');"
    " return Math.max(m.scrollWidth - m.clientWidth,"
    " document.documentElement.scrollWidth - innerWidth); }"
)
"""How many pixels the page scrolls sideways (0: none)."""


def first_chart(page, timeout: float = 120_000) -> dict | None:
    """The bounding box (in the page's viewport) of the page's first chart, the one nearest the
    top: a chart of the page itself or of a page it shows in a frame (the Learn page's live tour
    view). None when the page draws no chart (the Claims page is tables)."""
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=stPlotlyChart]')]"
        ".every(e => e.querySelector('.js-plotly-plot .main-svg'))",
        timeout=timeout,
    )
    boxes = [b for b in (c.bounding_box() for c in page.locator(".js-plotly-plot").all()) if b]
    if page.locator("iframe").count():
        frame = page.frame_locator("iframe").first
        frame.locator(".js-plotly-plot").first.wait_for(timeout=timeout)
        page.wait_for_timeout(500)  # the frame's layout settles
        boxes.append(frame.locator(".js-plotly-plot").first.bounding_box())
    return min(boxes, key=lambda b: b["y"]) if boxes else None


def above_the_fold(page, what: str, fold: int) -> list[str]:
    """A problem line unless the first chart's top half is on the first screen (``fold`` pixels)."""
    box = first_chart(page)
    if box is not None and box["y"] + box["height"] / 2 > fold:
        return [
            f"{what}: the first chart starts at {box['y']:.0f} px ({box['height']:.0f} px tall), "
            f"below the fold at {fold}"
        ]
    return []


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
            page.wait_for_timeout(1000)  # a rerun that the first run asked for
            page.wait_for_function(IDLE, timeout=180_000)
            problems += _problems(page, spec, "1280x720")
            page.set_viewport_size(VIEWPORTS["phone"])
            page.wait_for_timeout(1500)  # columns stack, figures relayout
            problems += _problems(page, spec, "390x844")
            # phone first: the chart before the explanation, and nothing to scroll sideways
            problems += above_the_fold(page, f"{spec.title} at 390x844", VIEWPORTS["phone"]["height"])
            if (wide := page.evaluate(SIDEWAYS_JS)) > 1:
                problems.append(f"{spec.title} at 390x844 scrolls sideways by {wide} px")
    finally:
        ctx.close()
    assert not problems, "\n".join(problems)


def test_presentation_mode_puts_the_first_chart_above_the_fold(base, browser):
    """``present=1`` on every page at the projector's 1280×720: the first chart under the title
    (the views were computed by the test above, so each page is a cached rerun)."""
    ctx = browser.new_context(viewport=VIEWPORTS["projector"])
    page = ctx.new_page()
    problems = []
    try:
        for spec in ALL_PAGES:
            page.goto(f"{base}/{'' if spec.default else spec.url_path}?present=1")
            page.wait_for_selector("h1", timeout=180_000)
            page.wait_for_function(IDLE, timeout=180_000)
            page.wait_for_timeout(500)
            problems += above_the_fold(
                page, f"{spec.title} with present=1 at 1280x720", VIEWPORTS["projector"]["height"]
            )
    finally:
        ctx.close()
    assert not problems, "\n".join(problems)
