"""Every page at a projector's 1280×720 and a phone's 390×844, and in presentation mode, in headless
Chromium (issue 44 item 4), each page opened once: one server, one browser, one walk
(:func:`walk`) whose findings the tests below read, each its own kind.

* **Nothing cut or overlapping** (at 1280×720, then narrowed to 390×844: the columns stack and every
  figure is redrawn at the new width, plotly's responsive layout): no text of a figure is cut by its
  edge or overlaps another (title, subplot titles, axis titles, tick labels, legend, colour bar, the
  numbers in heatmap cells), no label, button or metric of the page is cut by its box
  (:mod:`tests.figure_layout` measures both); on the phone the first chart's top half is on the first
  screen and nothing scrolls sideways.
* **Presentation mode** (``present=1`` at 1280×720): the whole first chart is on the first screen.
  On the Learn page the first chart is the live tour view's, in its frame.
* **A projector's screen**: as it is, the first chart's top half is on the first screen, or the
  header's one line (:data:`hessviz.app.controls.PRESENT_HINT`) is, and its link is this very view
  with ``present=1``; on the phone, where the chart comes first, the line is not shown. Following
  it, presentation mode no longer offers itself, each panel of the first chart that draws a heatmap
  is at least :data:`HEATMAP_PX` pixels on its shorter side, and no text of the page's figures is cut
  or overlaps another (tick labels included).

Screenshots of both modes at 1280×720 and of the page at 390×844 go to ``.pytest_cache/projector/``.
Needs Chromium (``HESSVIZ_CHROMIUM``); skipped without it, failed without it when ``CI`` is set.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from hessviz.app.registry import ALL_PAGES
from tests.figure_layout import CUT_TEXT_JS, FIGURE_PROBLEMS_JS
from tests.streamlit_server import ROOT

pytestmark = pytest.mark.browser

VIEWPORTS = {"projector": {"width": 1280, "height": 720}, "phone": {"width": 390, "height": 844}}
IDLE = (
    "() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
    " return a && a.getAttribute('data-test-script-state') === 'notRunning'; }"
)
HEATMAP_PX = 300
"""The shortest side of a heatmap's plot area that a class reads from the back of the room."""
FOLD = VIEWPORTS["projector"]["height"]
SHOTS = ROOT / ".pytest_cache" / "projector"

SIDEWAYS_JS = (
    "() => { const m = document.querySelector('[data-testid=stMain]');"
    " return Math.max(m.scrollWidth - m.clientWidth,"
    " document.documentElement.scrollWidth - innerWidth); }"
)
"""How many pixels the page scrolls sideways (0: none)."""

HEATMAP_PANELS_JS = r"""
() => {
  // the first figure on the page (the one nearest the top): its panels that draw a heatmap, each
  // measured by the drag rectangle plotly lays over a subplot's plot area
  const plots = [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent && p.data);
  if (!plots.length) return null;
  const plot = plots.reduce((a, b) => a.getBoundingClientRect().top <= b.getBoundingClientRect().top ? a : b);
  const panels = new Set(plot.data.filter(t => t.type === 'heatmap')
    .map(t => (t.xaxis || 'x') + (t.yaxis || 'y')));
  return [...panels].map(id => {
    const r = plot.querySelector(`.nsewdrag[data-subplot="${id}"]`).getBoundingClientRect();
    return {panel: id, width: Math.round(r.width), height: Math.round(r.height),
            title: (plot.querySelector('.gtitle')?.textContent || '').slice(0, 40)};
  });
}
"""


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


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("h1", timeout=180_000)
    page.wait_for_function(IDLE, timeout=180_000)
    page.wait_for_timeout(1000)  # a rerun that the first run asked for
    page.wait_for_function(IDLE, timeout=180_000)


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query, keep_blank_values=True)


def _hint(page) -> tuple[dict | None, str | None]:
    """The header's line about presentation mode: its link's box and address (None when not shown)."""
    link = page.locator(".st-key-hv_present_hint a")
    if not link.count() or not link.first.is_visible():
        return None, None
    return link.first.bounding_box(), link.first.get_attribute("href")


def _heatmaps(page) -> list[dict]:
    """The heatmap panels of the first chart: the page's own, or the Learn page's frame's."""
    if page.locator("iframe").count():
        frame = next(f for f in page.frames if f is not page.main_frame and f.url.startswith("http"))
        return frame.evaluate(HEATMAP_PANELS_JS) or []
    return page.evaluate(HEATMAP_PANELS_JS) or []


def _cut(page, where: str) -> list[str]:
    return [f"{where}: {f}" for f in page.evaluate(FIGURE_PROBLEMS_JS) + page.evaluate(CUT_TEXT_JS)]


def _visit(page, base: str, spec, found: dict[str, list[str]], measured: dict[str, int]) -> None:
    """One page on the server at ``base``: as it is at 1280×720, narrowed to 390×844, then its
    presentation mode at 1280×720; each problem goes to its kind in ``found``."""
    name = spec.url_path or "home"
    page.set_viewport_size(VIEWPORTS["projector"])
    _open(page, f"{base}/{'' if spec.default else spec.url_path}")
    page.screenshot(path=str(SHOTS / f"{name}.png"))
    where = f"{spec.title} at 1280x720"
    found["cut"] += _cut(page, where)
    box = first_chart(page)
    hint, link = _hint(page)
    if hint is None or link is None:
        found["projector"].append(f"{where}: no line about presentation mode in the header")
    else:
        if box is not None and box["y"] + box["height"] / 2 > FOLD and hint["y"] + hint["height"] > FOLD:
            found["projector"].append(
                f"{where}: the chart starts at {box['y']:.0f} px and the line at {hint['y']:.0f}"
            )
        want = {**_query(page.url), "present": ["1"]}
        if _query(link) != want or urlsplit(link).path != urlsplit(page.url).path:
            found["projector"].append(f"{where}: the line links {link}, not this view with present=1: {want}")

    page.set_viewport_size(VIEWPORTS["phone"])
    page.wait_for_timeout(1500)  # columns stack, figures relayout
    page.screenshot(path=str(SHOTS / f"{name}_phone.png"))
    where = f"{spec.title} at 390x844"
    found["cut"] += _cut(page, where)
    # phone first: the chart before the explanation, and nothing to scroll sideways
    found["cut"] += above_the_fold(page, where, VIEWPORTS["phone"]["height"])
    if (wide := page.evaluate(SIDEWAYS_JS)) > 1:
        found["cut"].append(f"{where} scrolls sideways by {wide} px")
    if _hint(page)[0] is not None:
        found["projector"].append(f"{where}: the line about presentation mode is shown")

    page.set_viewport_size(VIEWPORTS["projector"])
    where = f"{spec.title} with present=1 at 1280x720"
    # the header's link when it offers one (checked above to be this view with present=1)
    _open(page, link or f"{base}/{'' if spec.default else spec.url_path}?present=1")
    page.screenshot(path=str(SHOTS / f"{name}_present.png"))
    box = first_chart(page)
    if box is not None and box["y"] + box["height"] > FOLD + 1:
        found["present"].append(
            f"{where}: the first chart spans {box['y']:.0f}–{box['y'] + box['height']:.0f} px, "
            f"past the fold at {FOLD}"
        )
    if _hint(page)[0] is not None:
        found["projector"].append(f"{where}: still offers presentation mode")
    panels = _heatmaps(page)
    measured[name] = len(panels)
    for p in panels:
        if min(p["width"], p["height"]) < HEATMAP_PX:
            found["projector"].append(
                f"{where}: the heatmap {p['panel']} of '{p['title']}' is "
                f"{p['width']}×{p['height']} px, under {HEATMAP_PX}"
            )
    found["projector"] += [f"{where}: {f}" for f in page.evaluate(FIGURE_PROBLEMS_JS)]


@pytest.fixture(scope="module")
def walk(app_server, app_browser) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Every page of :data:`~hessviz.app.registry.ALL_PAGES` visited once (:func:`_visit`) on the
    session's app server (``tests/conftest.py``): the problems found, by kind (``cut``, ``present``,
    ``projector``), and each page's count of heatmap panels in its first chart in presentation mode."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    found: dict[str, list[str]] = {"cut": [], "present": [], "projector": []}
    measured: dict[str, int] = {}
    ctx = app_browser.new_context(viewport=VIEWPORTS["projector"])
    page = ctx.new_page()
    try:
        for spec in ALL_PAGES:
            _visit(page, app_server.base, spec, found, measured)
    finally:
        ctx.close()
    print("heatmap panels of each first chart:", measured)
    return found, measured


def test_nothing_is_cut_or_overlapping(walk):
    found, _ = walk
    assert not found["cut"], "\n".join(found["cut"])


def test_presentation_mode_puts_the_first_chart_above_the_fold(walk):
    found, _ = walk
    assert not found["present"], "\n".join(found["present"])


def test_every_first_chart_is_on_a_projectors_screen_and_legible_in_presentation_mode(walk):
    found, measured = walk
    assert not found["projector"], "\n".join(found["projector"])
    heatmaps = ("hessian_map", "real_model", "verify")
    assert all(measured.get(p) for p in heatmaps), f"heatmaps found: {measured}"
