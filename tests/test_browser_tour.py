"""The classroom in a real browser (issue 16): tour stops, shared links across pages, Back and
Forward, lesson links (``hide=``, ``present=1``), values the app does not offer, and the projector
(1280×720) and phone (390×844) layouts. Screenshots go to ``assets/screenshots/``.
"""

from __future__ import annotations

import re

import pytest

from hessviz.app.tour import TOUR
from tests.test_browser import SHOTS, _exceptions, _settle, browser, server  # noqa: F401 (fixtures)
from tests.test_layout_browser import SIDEWAYS_JS, above_the_fold

pytestmark = pytest.mark.browser

PROJECTOR = {"width": 1280, "height": 720}
PHONE = {"width": 390, "height": 844}


def _visit(browser, url: str, viewport=PROJECTOR):  # noqa: F811
    ctx = browser.new_context(viewport=viewport)
    page = ctx.new_page()
    page.goto(url)
    _settle(page)
    return ctx, page


def _sidebar_open(page) -> bool:
    """Whether the sidebar is on screen (collapsed, Streamlit moves it off to the left)."""
    box = page.locator('[data-testid="stSidebar"]').bounding_box()
    return box is not None and box["width"] > 50 and box["x"] + box["width"] > 50


def _caption(page) -> str:
    """The page header's line: the block in words."""
    return page.locator('[data-testid="stMain"] [data-testid="stCaptionContainer"]').first.inner_text()


def _wait_caption(page, text: str) -> None:
    page.wait_for_function(
        "t => [...document.querySelectorAll('[data-testid=stMain] [data-testid=stCaptionContainer]')]"
        ".some(e => e.innerText.includes(t))",
        arg=text,
        timeout=60_000,
    )


TOOLBARS_SHOWN = (
    "() => [...document.querySelectorAll('.modebar-container')]"
    ".filter(e => getComputedStyle(e).display !== 'none').length"
)
"""How many charts show plotly's mode bar (none on a touch screen: it would sit over the titles)."""

EXPECTED = {
    "attention": "Self-attention alone",
    "pre": "Pre-LN block",
    "post": "Post-LN block",
    "peri": "Peri-LN block",
}


@pytest.mark.parametrize("index", range(len(TOUR)), ids=[s.page + str(i + 1) for i, s in enumerate(TOUR)])
def test_every_tour_stop_opens_the_view_it_names(server, browser, index):  # noqa: F811
    stop = TOUR[index]
    ctx, page = _visit(browser, f"{server}/learn?tour={index + 1}")
    frame = page.locator("iframe").first.get_attribute("src")
    assert stop.link() in frame and "hide=sidebar" in frame and "present=1" in frame
    # the story quotes its live view: every number it sets in bold is one the view shows
    assert above_the_fold(page, f"stop {index + 1}'s live view", PROJECTOR["height"]) == []
    quoted = page.locator("p", has_text="What to notice.").first.locator("strong").all_inner_texts()
    numbers = [q for q in quoted if re.fullmatch(r"[−-]?[\d,]+(\.\d+)?", q)]
    assert numbers, quoted
    shown = page.frame_locator("iframe").first.locator("[data-testid=stMain]").inner_text().replace("−", "-")
    for number in numbers:
        assert number.replace("−", "-") in shown, (number, shown[:3000])
    page.set_viewport_size(PHONE)  # on a phone the live view comes first too
    assert above_the_fold(page, f"stop {index + 1}'s live view at 390x844", PHONE["height"]) == []
    if index in (0, 2):
        page.screenshot(path=str(SHOTS / f"tour_stop{index + 1}_390x844.png"))
        page.set_viewport_size(PROJECTOR)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(SHOTS / f"tour_stop{index + 1}_1280x720.png"))
    phone = browser.new_context(viewport=PHONE, has_touch=True, is_mobile=True)  # the stop's link on a phone
    alone = phone.new_page()
    alone.goto(f"{server}/{stop.link()}")
    _settle(alone)
    assert above_the_fold(alone, f"{stop.link()} at 390x844", PHONE["height"]) == []
    assert alone.evaluate(SIDEWAYS_JS) <= 1
    alone.set_viewport_size({"width": 1024, "height": 768})  # a touch tablet: wide, no hover
    alone.wait_for_timeout(500)
    assert alone.evaluate(TOOLBARS_SHOWN) == 0
    phone.close()
    page.get_by_role("link", name="Open the full page: ").click()
    page.wait_for_url(f"**/{stop.page}*", timeout=30_000, wait_until="commit")
    _settle(page)
    _wait_caption(page, EXPECTED[stop.params["norm"]])
    for key, value in stop.params.items():
        default = (
            key == "norm"
            and value == "post"
            or key == "sc_axis"
            and value == "xnorm"
            or key == "sc_blk"
            and value == "W_Q,W_Q"
        )
        if not default:  # the URL keeps what differs from the defaults
            assert f"{key}={value}" in page.url.replace("%2C", ","), (key, page.url)
    if "xnorm" in stop.params:
        assert f"‖X‖₂ = {stop.params['xnorm']}" in _caption(page)
    assert _exceptions(page) == []
    ctx.close()


def _arrive(page, title: str, caption: str) -> None:
    """Wait for a history step to land: the page's own title, its caption, and the run's end.

    A caption alone is not enough: Back from the Spectrum page at L = 6 to the shared link shows
    the same caption before the new page has run, and a step taken then races Streamlit's frontend,
    which pushes the still-arriving page's URL (``maybeUpdatePageUrl``) and drops the Forward
    history."""
    page.wait_for_function(
        "t => [...document.querySelectorAll('[data-testid=stMain] h1')].some(h => h.innerText.includes(t))",
        arg=title,
        timeout=60_000,
    )
    _wait_caption(page, caption)
    _settle(page)


def test_a_shared_link_keeps_its_settings_across_pages_and_back(server, browser):  # noqa: F811
    ctx, page = _visit(browser, f"{server}/?norm=pre&L=6")
    assert _caption(page).startswith("Pre-LN block, L = 6")
    page.locator('[data-testid="stSidebar"]').get_by_role("link", name="Spectrum").click()
    page.wait_for_url("**/spectrum?**", timeout=30_000, wait_until="commit")
    _arrive(page, "Spectrum", "Pre-LN block, L = 6")
    assert "norm=pre" in page.url and "L=6" in page.url
    slider = page.locator('[data-testid="stSidebar"]').get_by_role("slider", name="Sequence length L")
    slider.focus()
    slider.press("ArrowRight")  # a control moved on this page: L = 7
    _arrive(page, "Spectrum", "Pre-LN block, L = 7")
    link = page.locator('[data-testid="stSidebar"] [data-testid="stCode"]').first.inner_text()
    assert "/spectrum?" in link and "L=7" in link and "norm=pre" in link, link
    other, seen = _visit(browser, link.strip())  # the link to this view opens this view
    _wait_caption(seen, "Pre-LN block, L = 7")
    other.close()
    page.go_back()  # Back: the view before, L = 6 on the Spectrum page
    _arrive(page, "Spectrum", "Pre-LN block, L = 6")
    assert "/spectrum" in page.url
    page.go_back()  # and the shared link itself
    _arrive(page, "Hessian map", "Pre-LN block, L = 6")
    assert "/spectrum" not in page.url
    page.go_forward()  # the Spectrum page at L = 6
    _arrive(page, "Spectrum", "Pre-LN block, L = 6")
    page.go_forward()
    _arrive(page, "Spectrum", "Pre-LN block, L = 7")
    assert _exceptions(page) == []
    ctx.close()


def test_a_preset_opens_a_llama_style_block_and_back_returns(server, browser):  # noqa: F811
    ctx, page = _visit(browser, f"{server}/?L=6&d=8&dk=4&dff=8")
    page.locator('[data-testid="stSidebar"]').get_by_role("button", name="Llama-style").click()
    _arrive(page, "Hessian map", "4 heads over 2 key/value heads")
    words = _caption(page)
    assert "L = 6" in words and "SiLU gated" in words and "RMSNorm" in words and "RoPE" in words, words
    for key in ("kv=2", "ntype=rmsnorm", "mlp=gated", "rope=true", "L=6"):
        assert key in page.url, (key, page.url)
    page.wait_for_selector(".js-plotly-plot", timeout=120_000)
    assert page.get_by_text("W_K[0], W_V[0] by query heads 0, 1").count() == 1
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "llama_style_1280x720.png"))
    assert _exceptions(page) == []
    page.go_back()  # the preset was one step of the history
    _arrive(page, "Hessian map", "Post-LN block, L = 6")
    ctx.close()


def test_a_lesson_link_hides_its_controls_and_presents(server, browser):  # noqa: F811
    ctx, page = _visit(browser, f"{server}/scaling?norm=attention&hide=norm,L,sc_axis")
    sidebar = page.locator('[data-testid="stSidebar"]')
    assert sidebar.get_by_text("LayerNorm placement", exact=True).count() == 0
    assert sidebar.get_by_role("slider", name="Sequence length L").count() == 0
    fixed = sidebar.get_by_text("Fixed by this lesson link").inner_text()
    assert "L = 8" in fixed and "norm = attention" in fixed
    assert _caption(page).startswith("Self-attention alone, L = 8")
    assert page.get_by_text("Sweep over: xnorm (fixed by this lesson link)").count() == 1
    sidebar.get_by_role("link", name="Spectrum").click()  # the lesson rides along
    page.wait_for_url("**/spectrum?**", timeout=30_000, wait_until="commit")
    _settle(page)
    assert "hide=" in page.url and sidebar.get_by_text("LayerNorm placement", exact=True).count() == 0
    ctx.close()

    ctx, page = _visit(browser, f"{server}/scaling?norm=attention&present=1")
    page.wait_for_selector(".js-plotly-plot", timeout=60_000)
    page.wait_for_timeout(1000)
    box = page.locator(".js-plotly-plot").first.bounding_box()
    assert box["y"] + box["height"] <= PROJECTOR["height"], box  # the first chart above the fold
    assert not _sidebar_open(page)
    assert page.get_by_text("What this page shows").count() == 1  # the explanation is folded
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "lesson_present_1280x720.png"))
    ctx.close()

    ctx, page = _visit(browser, f"{server}/spectrum?hide=sidebar")
    assert not page.locator('[data-testid="stSidebar"]').is_visible()
    assert (
        page.locator('[data-testid="stExpandSidebarButton"]').count() == 0
        or not page.locator('[data-testid="stExpandSidebarButton"]').is_visible()
    )
    ctx.close()


def test_values_the_app_does_not_offer_get_one_line(server, browser):  # noqa: F811
    ctx, page = _visit(browser, f"{server}/spectrum?wo=1&seed=-5&heads=2&L=abc")
    note = page.locator('[data-testid="stAlert"]').first.inner_text()
    assert "wo=1 read as wo = true" in note and "seed=-5 is out of range" in note and "L=abc" in note
    assert _caption(page).endswith("seed 0") and "2 heads, W_O" in _caption(page)
    seed = page.locator('[data-testid="stSidebar"] input[aria-label="Seed (0 … 9999)"]')
    seed.fill("abc")
    seed.press("Enter")
    page.wait_for_function("() => document.body.innerText.includes('is not an integer in 0')", timeout=30_000)
    page.wait_for_function(
        "() => document.querySelector('[data-testid=stSidebar] input[aria-label^=Seed]').value === '0'",
        timeout=30_000,
    )  # put back: the box agrees with the header
    seed.fill("12")
    seed.press("Enter")
    _wait_caption(page, "seed 12")
    ctx.close()

    ctx, page = _visit(browser, f"{server}/?L=4&d=8&dk=4&dff=8")  # heads 1 -> 2 turns W_O on
    sidebar = page.locator('[data-testid="stSidebar"]')
    slider = sidebar.get_by_role("slider", name=re.compile("Attention heads"))  # not "Key/value heads"
    slider.focus()
    slider.press("ArrowRight")
    _wait_caption(page, "2 heads, W_O")
    assert page.get_by_text("turned W_O on").count() >= 1
    assert _exceptions(page) == []
    ctx.close()


@pytest.mark.parametrize("viewport,name", [(PROJECTOR, "projector_1280x720"), (PHONE, "phone_390x844")])
def test_projector_and_phone_layouts(server, browser, viewport, name):  # noqa: F811
    ctx, page = _visit(browser, f"{server}/?norm=pre", viewport)
    page.wait_for_selector(".js-plotly-plot", timeout=60_000)
    page.wait_for_timeout(1000)
    assert _sidebar_open(page) == (viewport is PROJECTOR)  # a phone starts collapsed
    title = page.locator("h1").first.bounding_box()
    assert title["y"] >= 0 and title["y"] + title["height"] <= viewport["height"] / 4
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))
    assert _exceptions(page) == []
    ctx.close()


def test_the_first_click_on_presentation_mode_after_a_hide_choice_counts(server, browser):  # noqa: F811
    """Choosing a control to hide, then one click on "Presentation mode": the lesson link has both
    (the toggle used to sit under the multiselect, which moved it between mouse-down and mouse-up)."""
    ctx, page = _visit(browser, f"{server}/spectrum")
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Make a lesson link").click()
    _settle(page)  # the run that opening the expander started has ended: a choice is not lost to it
    choose = sidebar.locator('[data-testid="stMultiSelect"] input').last
    choose.scroll_into_view_if_needed()
    choose.click()
    page.keyboard.type("sidebar (every")  # one option left, whichever the list had highlighted
    page.locator('[role="option"]', has_text="sidebar (every").first.wait_for(timeout=30_000)
    page.keyboard.press("Enter")  # the sidebar; the list stays open
    shows = (
        "t => [...document.querySelectorAll('[data-testid=stSidebar] [data-testid=stCode]')]"
        ".some(e => e.innerText.includes(t))"
    )
    page.wait_for_function(shows, arg="hide=sidebar", timeout=30_000)
    _settle(page)
    sidebar.get_by_text("Presentation mode", exact=True).click()  # one click
    page.wait_for_function(shows, arg="hide=sidebar&present=1", timeout=30_000)
    ctx.close()


def _term_shown(page) -> str:
    """The Hessian map's Term control as drawn: the option pressed."""
    group = page.locator('[data-testid="stMain"] [data-testid="stButtonGroup"]').first
    return group.locator('button[aria-checked="true"], button[kind$="Active"]').first.inner_text().strip()


def test_back_and_forward_return_to_views_the_visitor_saw(server, browser):  # noqa: F811
    """Issue 33: ``/?L=6&term=outer`` → Spectrum → Hessian map, then Back, gave ``/spectrum?L=6&term=outer``
    (the Spectrum page carrying the map's key: the map's run wrote its query while the browser was
    still on the Spectrum entry). Each Back and Forward must land on an address the visitor saw, and
    the controls must show it."""
    ctx, page = _visit(browser, f"{server}/?L=6&term=outer")
    assert _term_shown(page) == "outer"
    seen = [page.url]
    for title, path in (("Spectrum", "spectrum"), ("Hessian map", "")):
        page.locator('[data-testid="stSidebar"]').get_by_role("link", name=title).click()
        page.wait_for_url(f"**/{path}?**", timeout=30_000, wait_until="commit")
        _arrive(page, title, "Post-LN block, L = 6")
        page.wait_for_timeout(500)  # a late write would show in the address now
        seen.append(page.url)
    assert "/spectrum?" in seen[1] and "term=" not in seen[1], seen
    assert "term=outer" in seen[2] and "/spectrum" not in seen[2] and _term_shown(page) == "outer", seen
    page.go_back()
    _arrive(page, "Spectrum", "Post-LN block, L = 6")
    assert page.url == seen[1]
    page.go_back()
    _arrive(page, "Hessian map", "Post-LN block, L = 6")
    assert page.url == seen[0] and _term_shown(page) == "outer"
    page.go_forward()
    _arrive(page, "Spectrum", "Post-LN block, L = 6")
    assert page.url == seen[1]
    page.go_back()
    _arrive(page, "Hessian map", "Post-LN block, L = 6")
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_role("link", name="Real model").click()  # via Real model
    page.wait_for_url("**/real_model?**", timeout=30_000, wait_until="commit")
    _arrive(page, "Real model", "")
    page.go_back()
    _arrive(page, "Hessian map", "Post-LN block, L = 6")
    assert page.url == seen[0] and _term_shown(page) == "outer"
    assert _exceptions(page) == []
    ctx.close()
