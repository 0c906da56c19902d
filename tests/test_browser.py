"""The whole app driven once in headless Chromium (Playwright, sync API).

Starts ``streamlit run app.py`` on a free port, waits for ``/_stcore/health``, opens every
page listed in the navigation, checks that each draws its Plotly charts and shows no
exception, that a shared URL restores the sidebar, and that moving a slider re-renders.
Saves a screenshot per page to ``assets/screenshots/<page>.png`` and the measured times
to ``assets/screenshots/timings.json``.

Needs Chromium at ``/usr/bin/chromium`` (or ``HESSVIZ_CHROMIUM``): without it the tests
skip, or fail when the environment variable ``CI`` is set.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from hessviz.app.registry import EXPLORE
from tests.streamlit_server import ROOT

pytestmark = pytest.mark.browser

SHOTS = ROOT / "assets" / "screenshots"
VIEWPORT = {"width": 1600, "height": 1000}
TIMINGS: dict[str, float] = {}
EXPLORE_TITLES = {p.title for p in EXPLORE}
"""Every Explore page draws charts (read from the registry, so a new page is held to it too)."""

STREAMLIT_NAV = '[data-testid="stSidebarNav"]'
"""Streamlit's own page list (from the files in ``pages/``); hessviz draws its navigation itself."""
WATCH_NAV = (
    "window.streamlitNavSeen = 0; new MutationObserver(() => {"
    f" if (document.querySelector('{STREAMLIT_NAV}')) window.streamlitNavSeen++; }})"
    ".observe(document, {subtree: true, childList: true});"
)
"""Counts the DOM changes after which Streamlit's page list is on the page, from the first paint on."""
OWN_NAV = '[data-testid="stSidebar"] a[data-testid="stPageLink-NavLink"]'

IDLE = (
    "() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
    " return a && a.getAttribute('data-test-script-state') === 'notRunning'; }"
)


@pytest.fixture(scope="module")
def server(app_server):
    """The session's app server (``tests/conftest.py``): its address."""
    return app_server.base


@pytest.fixture(scope="module")
def browser(app_browser):
    return app_browser


def _settle(page, timeout: float = 120_000) -> None:
    """Wait until the script run has finished (the 'running' status widget is gone)."""
    page.wait_for_selector("h1", timeout=timeout)
    page.wait_for_function(IDLE, timeout=timeout)


def _open(browser, url: str):
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    page.goto(url)
    return ctx, page


def _screenshot(page, path: Path) -> None:
    """The whole page: Streamlit scrolls inside its main container, so grow the viewport to fit it."""
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]')?.scrollHeight || 1000")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": int(min(max(height, 600), 6000))})
    page.wait_for_timeout(800)
    page.screenshot(path=str(path), timeout=120_000)  # a tall page of charts paints slowly on 2 busy cores
    page.set_viewport_size(VIEWPORT)


def _figure_titles(page) -> str:
    """Every figure's title as one line each (a wrapped title's lines joined by spaces)."""
    return page.evaluate(
        "[...document.querySelectorAll('.gtitle')].map(e => {"
        " const lines = [...e.querySelectorAll('tspan.line')].map(t => t.textContent);"
        " return lines.length ? lines.join(' ') : e.textContent; }).join('\\n')"
    )


def _exceptions(page) -> list[str]:
    return [e.inner_text()[:2000] for e in page.query_selector_all('[data-testid="stException"]')]


def test_first_chart_and_every_page(server, browser):
    # The module's first visit is a cold server's first visitor, by a link with an address to a page
    # other than the first: from the first paint on, the sidebar holds hessviz's navigation only, never
    # Streamlit's raw list of the files in pages/ (.streamlit/config.toml: showSidebarNavigation =
    # false), and the page is drawn through app.py (hessviz.app.controls._through_app), not alone.
    ctx = browser.new_context(viewport=VIEWPORT)
    ctx.add_init_script(WATCH_NAV)
    page = ctx.new_page()
    page.goto(server + "/spectrum?L=4")
    page.wait_for_selector('[data-testid="stSidebar"]', timeout=120_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "cold_first_visit.png"))  # the sidebar as it first shows
    page.wait_for_selector(".js-plotly-plot", timeout=120_000)
    _settle(page)
    assert page.evaluate("window.streamlitNavSeen") == 0, "the first visitor saw Streamlit's raw page list"
    assert len(page.query_selector_all(OWN_NAV)) >= 9, page.inner_text('[data-testid="stSidebar"]')[:500]
    assert page.locator("h1").first.inner_text().strip() == "Spectrum" and _exceptions(page) == []
    assert page.get_by_text("Post-LN block, L = 4,", exact=False).count() >= 1  # its address is read
    ctx.close()
    # warm the server once at the first page (imports, first computation), then time a cold browser context
    ctx, page = _open(browser, server + "/")
    page.wait_for_selector(".js-plotly-plot", timeout=120_000)
    _settle(page)
    ctx.close()
    ctx, page = _open(browser, server + "/")
    t0 = time.perf_counter()
    page.wait_for_selector(".js-plotly-plot", timeout=60_000)
    TIMINGS["first_chart_cold_browser_s"] = round(time.perf_counter() - t0, 2)
    _settle(page)
    links = page.query_selector_all(OWN_NAV)
    pages = [(link.inner_text().split("\n")[-1].strip(), link.get_attribute("href")) for link in links]
    assert len(pages) >= 9, f"navigation lists {len(pages)} pages: {pages}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    failures = []
    for title, href in pages:
        url = href if href.startswith("http") else server + "/" + href.lstrip("/")
        t0 = time.perf_counter()
        page.goto(url)
        _settle(page)
        mine = title in EXPLORE_TITLES  # the explore pages all draw charts; a claims page may be tables
        try:
            wanted = ".js-plotly-plot" if mine else ".js-plotly-plot, [data-testid=stDataFrame]"
            page.wait_for_selector(wanted, state="attached", timeout=30_000)
        except Exception:  # noqa: BLE001 - reported below as "0 charts"
            pass
        TIMINGS[f"page_{title}_s"] = round(time.perf_counter() - t0, 2)
        n_charts = len(page.query_selector_all(".js-plotly-plot"))
        n_tables = len(page.query_selector_all('[data-testid="stDataFrame"]'))
        print(f"{title}: {TIMINGS[f'page_{title}_s']} s, {n_charts} charts", flush=True)
        exc = _exceptions(page)
        name = url.rstrip("/").split("/")[-1].split("?")[0]
        name = "hessian_map" if name.startswith("127.0.0.1") or not name else name
        _screenshot(page, SHOTS / f"{name}.png")
        if exc or n_charts == 0 and (mine or n_tables == 0):
            failures.append(f"{title} ({url}): {n_charts} charts, {n_tables} tables, exceptions: {exc}")
    ctx.close()
    assert not failures, "\n".join(failures)


def test_shared_url_restores_state(server, browser):
    ctx, page = _open(browser, server + "/?norm=pre&L=6")
    _settle(page)
    page.wait_for_selector(".js-plotly-plot", timeout=60_000)
    sidebar = page.locator('[data-testid="stSidebar"]')
    assert sidebar.get_by_role("radio", name="pre", exact=True).get_attribute("aria-checked") == "true"
    assert sidebar.get_by_role("slider", name="Sequence length L").input_value() == "6"
    caption = page.get_by_text("Pre-LN block, L = 6", exact=False)
    assert caption.count() >= 1
    link = sidebar.locator('[data-testid="stCode"]').first.inner_text()
    assert "norm=pre" in link and "L=6" in link, link
    assert _exceptions(page) == []
    ctx.close()


REAL_LAYER = "heads=2&wo=true&bias=true&affine=true&L=4&d=8&dk=4&dff=8"
MATRIX_FREE = "L=8&d=32&dk=8&dff=64&heads=4&wo=true&bias=true&affine=true"  # P = 8,544 > the dense limit
STACK = "layers=3&norm=pre&L=4&d=8&dk=4&dff=8"


@pytest.mark.parametrize(
    "path,query,text,charts,shot",
    [
        ("/", REAL_LAYER + "&blk=W_Q[1],W_K[1]", "2 heads, W_O", 3, "real_layer_map"),
        ("/spectrum", MATRIX_FREE, "Matrix-free spectrum", 2, "spectrum_matrix_free"),
        ("/depth", STACK + "&dp_seeds=1", "How block-diagonal", 3, "depth_stack"),
    ],
    ids=["real_layer_map", "matrix_free_spectrum", "depth_stack"],
)
def test_real_layer_and_matrix_free_views(server, browser, path, query, text, charts, shot):
    ctx, page = _open(browser, f"{server}{path}?{query}")
    t0 = time.perf_counter()
    _settle(page)
    page.wait_for_function(
        f"() => document.querySelectorAll('.js-plotly-plot').length >= {charts}", timeout=120_000
    )
    TIMINGS[f"view_{shot}_s"] = round(time.perf_counter() - t0, 2)
    assert page.get_by_text(text, exact=False).count() >= 1
    assert _exceptions(page) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    _screenshot(page, SHOTS / f"{shot}.png")
    ctx.close()


def test_real_model_page_from_a_shared_link(server, browser):
    """The Real model page opened from a link (the trained Post-LN model, layer 2, head 1, a text):
    the controls come back from the URL, the four figures are drawn, the loss is named, and the
    sidebar's link carries the page's state."""
    text = "def add(a, b):\n    return a + b"
    query = "rm_model=pydoc-postln&rm_layer=2&rm_head=1&rm_w=W_V&rm_rows=1&rm_text=" + quote(text)
    ctx, page = _open(browser, f"{server}/real_model?{query}")
    t0 = time.perf_counter()
    page.wait_for_selector(".js-plotly-plot", timeout=120_000)
    TIMINGS["real_model_first_chart_s"] = round(time.perf_counter() - t0, 2)
    _settle(page)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 4", timeout=120_000)
    TIMINGS["real_model_page_s"] = round(time.perf_counter() - t0, 2)
    assert page.get_by_text("Attention of head 1 in layer 2", exact=False).count() >= 1
    assert "Hessian of W_V[1]" in _figure_titles(page), _figure_titles(page)
    assert page.get_by_text("Loss drawn:", exact=False).count() >= 1
    assert page.locator("textarea").first.input_value() == text
    link = page.locator('[data-testid="stSidebar"]').locator('[data-testid="stCode"]').first.inner_text()
    assert "rm_model=pydoc-postln" in link and "rm_head=1" in link, link
    assert _exceptions(page) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    _screenshot(page, SHOTS / "real_model_link.png")
    ctx.close()


def _after(page, action, timeout: float = 120_000) -> None:
    """Do ``action`` (a control change), then wait for the rerun it starts to finish."""
    action()
    page.wait_for_timeout(400)  # the script run starts a moment after the widget's message
    page.wait_for_function(IDLE, timeout=timeout)


def _alerts(page) -> str:
    return " ".join(e.inner_text() for e in page.query_selector_all('[data-testid="stAlert"]'))


def test_real_model_page_odd_inputs(server, browser):
    """The controls a student moves on the Real model page, in the order that used to raise: the text
    box emptied (it raised on st.query_params and vanished), blanks, a text longer than the model's
    positions, the model's own loss and then a switch to a model without that loss (it raised on
    rm_loss), then a head and a weight. Each gets a view or one line, never a traceback."""
    query = "rm_model=pydoc-postln&rm_text=" + quote("def f(x):")  # emptied: the precomputed default
    ctx = browser.new_context(viewport={"width": 1280, "height": 720})
    page = ctx.new_page()
    page.goto(f"{server}/real_model?{query}")
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 4", timeout=120_000)
    _settle(page)
    box = page.locator("textarea").first
    for typed in ("", "   \n  "):
        _after(page, lambda typed=typed: (box.fill(typed), box.press("Control+Enter")))
        assert _exceptions(page) == [], repr(typed)
        assert "Text: the box is empty, so the default text is drawn." in _alerts(page), repr(typed)
        assert page.locator("textarea").count() >= 1 and box.input_value().startswith("The old lighthouse")
        assert len(page.query_selector_all(".js-plotly-plot")) == 4
    _after(page, lambda: (box.fill("word " * 80), box.press("Control+Enter")))  # 400 characters, 81 tokens
    assert _exceptions(page) == []
    assert "positions" in _alerts(page) and page.locator("textarea").count() >= 1
    _after(page, lambda: (box.fill("x = 1"), box.press("Control+Enter")))
    _after(page, lambda: page.get_by_role("radio", name="sentence similarity").click())
    assert "1 − cos(m, e)" in _alerts(page)
    _after(
        page,
        lambda: (
            page.locator('[data-testid="stSelectbox"]').first.click(),
            page.get_by_role("option", name="pydoc-preln").click(),
        ),
    )
    assert _exceptions(page) == []
    assert "Loss: sentence similarity is not offered here: used synthetic" in _alerts(page)  # by its label
    _after(page, lambda: page.get_by_role("radio", name="next token").click())
    _after(page, lambda: page.get_by_role("radio", name="W_O").click())
    head = page.get_by_role("slider", name="Head")
    _after(page, lambda: (head.focus(), head.press("End")))
    assert _exceptions(page) == []
    assert "Hessian of W_O[3]" in _figure_titles(page), _figure_titles(page)
    assert "next-token loss" in _alerts(page)
    assert len(page.query_selector_all(".js-plotly-plot")) == 4
    SHOTS.mkdir(parents=True, exist_ok=True)
    _screenshot(page, SHOTS / "real_model_odd_inputs.png")
    ctx.close()
    ctx = browser.new_context(viewport={"width": 390, "height": 844})  # a phone: the precomputed view
    page = ctx.new_page()
    page.goto(f"{server}/real_model?rm_model=pydoc-preln")
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 4", timeout=120_000)
    _settle(page)
    assert _exceptions(page) == [] and "Precomputed" in page.inner_text("body")
    collapse = page.locator('[data-testid="stSidebarCollapseButton"] button')
    if collapse.count() and collapse.first.is_visible():  # a phone opens with the sidebar over it
        collapse.first.click()
        page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "real_model_phone.png"))
    ctx.close()


def test_slider_rerenders(server, browser):
    ctx, page = _open(browser, server + "/")
    page.wait_for_selector(".js-plotly-plot", timeout=60_000)
    _settle(page)
    title = "() => [...document.querySelectorAll('.gtitle')].some(e => e.textContent.includes('P = {}'))"
    page.wait_for_function(title.format("1,536"), timeout=30_000)
    slider = page.locator('[data-testid="stSidebar"]').get_by_role("slider", name="Key width d_k")
    if slider.count() == 0:  # older accessible names: the third slider is d_k
        slider = page.locator('[data-testid="stSidebar"]').get_by_role("slider").nth(2)
    slider.focus()
    t0 = time.perf_counter()
    slider.press("ArrowRight")  # d_k 8 -> 9: P 1536 -> 1568, a fresh Hessian
    page.wait_for_function(title.format("1,568"), timeout=30_000)
    TIMINGS["rerender_new_view_s"] = round(time.perf_counter() - t0, 2)
    _settle(page)
    t0 = time.perf_counter()
    slider.press("ArrowLeft")  # back to the cached default view
    page.wait_for_function(title.format("1,536"), timeout=30_000)
    TIMINGS["rerender_cached_view_s"] = round(time.perf_counter() - t0, 2)
    _settle(page)
    assert "dk=9" not in page.url
    assert _exceptions(page) == []
    ctx.close()
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "timings.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")
    print("browser timings:", TIMINGS)
