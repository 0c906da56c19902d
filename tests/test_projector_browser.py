"""Charts a projector can show (issue 44 item 4), measured in headless Chromium at 1280×720.

One server; each page is opened once as it is, and once in presentation mode by following the link
its header offers:

* **as it is**: the first chart's top half is on the first screen, or the header's one line
  (:data:`hessviz.app.controls.PRESENT_HINT`) is, and its link is this very view with ``present=1``;
  on a phone's 390×844, where the chart comes first, the line is not shown;
* **with present=1**: the whole first chart is on the first screen, each panel of it that draws a
  heatmap is at least :data:`HEATMAP_PX` pixels on its shorter side, and no text of the page's
  figures is cut or overlaps another (:data:`tests.figure_layout.FIGURE_PROBLEMS_JS`: tick labels
  included). On the Learn page the first chart is the live tour view's, in its frame.

Screenshots of both modes at 1280×720 and of the page at 390×844 go to ``.pytest_cache/projector/``.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from hessviz.app.registry import ALL_PAGES
from tests.figure_layout import FIGURE_PROBLEMS_JS
from tests.streamlit_server import ROOT, chromium, require_chromium, running_server
from tests.test_layout_browser import IDLE, VIEWPORTS, first_chart

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HEATMAP_PX = 300
"""The shortest side of a heatmap's plot area that a class reads from the back of the room."""
FOLD = VIEWPORTS["projector"]["height"]
SHOTS = ROOT / ".pytest_cache" / "projector"

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


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("h1", timeout=180_000)
    page.wait_for_function(IDLE, timeout=180_000)
    page.wait_for_timeout(800)  # a rerun that the first run asked for
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


@pytest.fixture(scope="module")
def base():
    require_chromium()
    with running_server("streamlit_projector_test.log") as srv:
        yield srv.base


def test_every_first_chart_is_on_a_projectors_screen_and_legible_in_presentation_mode(base):
    SHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    measured: dict[str, int] = {}  # page -> heatmap panels of its first chart
    with chromium() as browser:
        ctx = browser.new_context(viewport=VIEWPORTS["projector"])
        page = ctx.new_page()
        try:
            for spec in ALL_PAGES:
                name = spec.url_path or "home"
                where = f"{spec.title} at 1280x720"
                _open(page, f"{base}/{'' if spec.default else spec.url_path}")
                page.screenshot(path=str(SHOTS / f"{name}.png"))
                box = first_chart(page)
                hint, link = _hint(page)
                if hint is None or link is None:
                    problems.append(f"{where}: no line about presentation mode in the header")
                    continue
                if (
                    box is not None
                    and box["y"] + box["height"] / 2 > FOLD
                    and hint["y"] + hint["height"] > FOLD
                ):
                    problems.append(
                        f"{where}: the chart starts at {box['y']:.0f} px and the line at {hint['y']:.0f}"
                    )
                want = {**_query(page.url), "present": ["1"]}
                if _query(link) != want or urlsplit(link).path != urlsplit(page.url).path:
                    problems.append(f"{where}: the line links {link}, not this view with present=1 ({want})")
                page.set_viewport_size(VIEWPORTS["phone"])
                page.wait_for_timeout(800)
                page.screenshot(path=str(SHOTS / f"{name}_phone.png"))
                if _hint(page)[0] is not None:
                    problems.append(f"{spec.title} at 390x844: the line about presentation mode is shown")
                page.set_viewport_size(VIEWPORTS["projector"])

                where = f"{spec.title} with present=1 at 1280x720"
                _open(page, link)
                page.screenshot(path=str(SHOTS / f"{name}_present.png"))
                if _hint(page)[0] is not None:
                    problems.append(f"{where}: still offers presentation mode")
                box = first_chart(page)
                if box is not None and box["y"] + box["height"] > FOLD + 1:
                    problems.append(
                        f"{where}: the first chart spans {box['y']:.0f}–{box['y'] + box['height']:.0f} px, "
                        f"past the fold at {FOLD}"
                    )
                panels = _heatmaps(page)
                measured[name] = len(panels)
                for p in panels:
                    if min(p["width"], p["height"]) < HEATMAP_PX:
                        problems.append(
                            f"{where}: the heatmap {p['panel']} of '{p['title']}' is "
                            f"{p['width']}×{p['height']} px, under {HEATMAP_PX}"
                        )
                problems += [f"{where}: {f}" for f in page.evaluate(FIGURE_PROBLEMS_JS)]
        finally:
            ctx.close()
    assert not problems, "\n".join(problems)
    print("heatmap panels of each first chart:", measured)
    assert all(measured.get(p) for p in ("hessian_map", "real_model", "verify")), (
        f"heatmaps found: {measured}"
    )
