"""``hessviz lesson``: a lesson link as one self-contained page (issue 32).

Small views keep it quick: the pages are made once per module. The browser part opens each page
from ``file://`` with the network off (an offline context, and every request that is not a file
aborted), moves each baked control and checks that the chart's data changed; screenshots at
1280×720 and 390×844 go to ``assets/screenshots/``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hessviz.app import lesson_page
from hessviz.plots import modebar
from tests.streamlit_server import ARGS, CHROMIUM, require_chromium

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "assets" / "screenshots"
SMALL = "L=4&d=4&dk=2&dff=8"
LESSONS = {
    "scaling": f"/scaling?norm=attention&{SMALL}&sc_seeds=1&sc_axis=L&hide=sc_axis,sc_blk",
    "collapse": "http://localhost:8501/layernorm_collapse?norm=post&L=4&d=6&dk=3&dff=8&lnc_seeds=1&lnc_decades=2",
    # a visitor's text in the data: a hidden page key and a key no control reads (issue 43)
    "hostile": f"/scaling?norm=attention&{SMALL}&sc_seeds=1&sc_axis=L"
    "&hide=sc_axis,sc_blk,x_</script><!--<script>&zz=<!--<script>alert(1)</script>&amp;\u2028'\"",
}


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("lessons")
    made = {}
    for name, url in LESSONS.items():
        made[name] = out / f"{name}.html"
        lesson_page.write(url, made[name])
    return made


def _raw_data(text: str) -> str:
    marker = '<script id="lesson-data" type="application/json">'
    start = text.index(marker) + len(marker)
    return text[start : text.index("</script>", start)]


def _data(path: Path) -> dict:
    return json.loads(_raw_data(path.read_text()))


def test_a_lesson_page_is_self_contained_and_bakes_the_open_controls(pages):
    text = pages["scaling"].read_text()
    assert "<script src=" not in text and "<link " not in text, "nothing is loaded from elsewhere"
    size = pages["scaling"].stat().st_size
    assert size <= lesson_page.AIM_BYTES, f"{size / 2**20:.2f} MiB"
    data = _data(pages["scaling"])
    keys = [c["key"] for c in data["controls"]]
    assert keys == ["norm"], "sc_axis and sc_blk are hidden by the link: not baked"
    assert len(data["views"]) == 4  # attention alone (the link's), Post-LN, Pre-LN, Peri-LN
    assert data["views"]["3"]["describe"].startswith("Peri-LN block")
    assert "This lesson page covers sequence length L from 2 to 64" in text
    first = data["views"]["0"]
    assert first["describe"].startswith("Self-attention alone") and len(first["figures"]) == 2
    assert data["views"]["1"]["figures"][1] == data["views"]["2"]["figures"][1], (
        "the side-by-side chart of Post-LN and Pre-LN is one figure, kept once"
    )
    assert len(data["figures"]) < 2 * len(data["views"])
    assert data["views"]["1"]["describe"].startswith("Post-LN"), "the placement control changes the block"
    collapse = _data(pages["collapse"])
    assert [c["key"] for c in collapse["controls"]] == ["eps"] and collapse["controls"][0]["slider"]


def test_a_lesson_page_draws_what_the_page_draws(pages):
    """The figures are the page's own (:mod:`hessviz.app.views`), numbers rounded to 5 digits."""
    from hessviz import app as hva
    from hessviz.app import views

    view = hva.View.from_values({"norm": "attention", "L": 4, "d": 4, "dk": 2, "dff": 8})
    r = views.scaling(view, "L", "W_Q,W_Q", 1)
    data = _data(pages["scaling"])
    page = data["figures"][data["views"]["0"]["figures"][0]]
    assert page["data"][0]["y"] == lesson_page.compact(list(r.figure.data[0].y))


def test_a_lesson_page_trims_its_mode_bar_like_the_app(pages):
    """No "Share chart…" (plotly.js 3 uploads the figure to Plotly Cloud unless told not to), no logo,
    the app's short bar; and no bar at all on a touch or narrow screen (issue 44 item 5)."""
    text = pages["scaling"].read_text()
    config = _data(pages["scaling"])["config"]
    assert config == modebar.config("hessviz-scaling")
    assert config["showSendToCloud"] is False and config["displaylogo"] is False
    assert "sendChartToCloud" in config["modeBarButtonsToRemove"]
    assert "L.config" in text, "the script draws with the page's config"
    assert modebar.TOUCH_CSS.strip() in text.split("</style>", 1)[0], "the touch rule is in the page's style"


def test_the_app_draws_its_charts_with_the_same_config():
    pytest.importorskip("streamlit")
    from tests.test_app_pages import run_page

    at = run_page("pages/layernorm_collapse.py", lnc_seeds="1", lnc_decades="2")
    configs = [json.loads(c.proto.config) for c in at.get("plotly_chart")]
    assert configs and all(
        {k: v for k, v in c.items() if k != "toImageButtonOptions"} == modebar.config() for c in configs
    ), configs


def test_a_lesson_pages_file_name_carries_its_view():
    """One name per view whatever the link's order, another for any other setting; only safe
    characters; never longer than NAME_CHARS (issue 44 item 6)."""
    name = lesson_page.file_name
    assert name("/spectrum?norm=post&d=16") == "hessviz-spectrum-d-16-norm-post.html"
    assert name("http://h:8501/spectrum?d=16&norm=post&present=1") == name("/spectrum?norm=post&d=16")
    views = [
        "/spectrum?norm=post&d=16",
        "/spectrum?norm=pre&d=16",
        "/spectrum?norm=post&d=16&hide=loss",
        "/scaling?norm=post&d=16",
        "/scaling?sc_blk=W_Q,W_K",
        "/scaling?sc_blk=W_K,W_Q",
    ]
    assert len({name(v) for v in views}) == len(views)
    hostile = name("/scaling?x_a=</script><!--\"'&zz=../../etc/passwd\u2028%00" + "&k_y=" + "v" * 300)
    assert re.fullmatch(r"hessviz-scaling-[A-Za-z0-9._-]+\.html", hostile), hostile
    assert len(hostile) == lesson_page.NAME_CHARS and "/" not in hostile
    long, longer = name("/scaling?k_y=" + "v" * 300), name("/scaling?k_y=" + "v" * 301)
    assert long != longer and len(long) == len(longer) == lesson_page.NAME_CHARS, "a cut name ends in a hash"


def test_a_hostile_lesson_url_is_escaped_for_the_script_element(pages):
    """``<!--<script`` in a lesson link blanked the page: its data sat in a ``<script>`` element with
    only ``</`` escaped. Now no ``<``, ``>`` or ``&`` of the data is written as itself, the page has
    no element the data opened, and the data reads back exactly (the browser test opens the page)."""
    text = pages["hostile"].read_text()
    raw = _raw_data(text)
    assert not {"<", ">", "&", "\u2028"} & set(raw), "the data is escaped for its <script> element"
    assert "\\u003c!--\\u003cscript" in raw
    assert json.loads(raw)["url"] == LESSONS["hostile"]
    plain = pages["scaling"].read_text()
    assert [text.count(t) for t in ("<script", "</script", "<!--")] == [
        plain.count(t) for t in ("<script", "</script", "<!--")
    ]


def test_script_json_reads_back_what_it_was_given():
    data = {"a<b": ["</script>", "<!--<script>", "&amp;", "\u2028\u2029", "é ✓", 1.5, None], "k": {"x": ">"}}
    text = lesson_page.script_json(data)
    assert json.loads(text) == data and not {"<", ">", "&", "\u2028", "\u2029"} & set(text)


@pytest.mark.parametrize(
    "url, says",
    [
        ("/bogus?norm=pre", "the app has no page /bogus"),
        ("/hessian_map", "is not offered as a lesson page"),
        ("/scaling?sc_seeds=99", "sc_seeds=99 is out of range 1 … 8: used sc_seeds = 8."),
        ("/layernorm_collapse?lnc_view=wat", "lnc_view=wat is not one of layernorm, block"),
    ],
)
def test_a_url_the_app_does_not_offer_gets_the_apps_line(url, says):
    with pytest.raises(lesson_page.LessonError) as err:
        lesson_page.settle(url)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_command_refuses_in_one_line_and_leaves_no_file(tmp_path):
    out = tmp_path / "lesson.html"
    proc = subprocess.run(
        [sys.executable, "-m", "hessviz", "lesson", "/scaling?norm=wat", "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "norm=wat is not one of post, pre, none, attention, parallel" in lines[0]
    assert list(tmp_path.iterdir()) == [], "no partial file"


def test_a_grid_over_the_size_limit_names_the_control_to_fix(tmp_path):
    from plotly.offline import get_plotlyjs

    limit = len(get_plotlyjs()) + 40_000 + 1_000  # room for plotly.js and less than one view
    with pytest.raises(lesson_page.LessonError, match=r"^sc_blk: this lesson page would be .*fix sc_blk"):
        lesson_page.write(
            f"/scaling?norm=attention&{SMALL}&sc_seeds=1&sc_axis=L&hide=sc_axis,norm",
            tmp_path / "big.html",
            limit=limit,
        )
    assert list(tmp_path.iterdir()) == []


MODEBAR_SHOWN = (
    "() => [...document.querySelectorAll('.modebar-container')]"
    ".filter(e => getComputedStyle(e).display !== 'none').length"
)
"""How many charts draw a mode bar (a phone's touch screen: none)."""

CHART_DATA = (
    "() => JSON.stringify([...document.querySelectorAll('.chart')].map(c => c.data.map(t => [t.x, t.y])))"
)


@pytest.mark.browser
def test_a_lesson_page_works_offline_in_chromium(pages):
    require_chromium()
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    blocked = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for size, (w, h) in {"desktop": (1280, 720), "phone": (390, 844)}.items():
            context = browser.new_context(viewport={"width": w, "height": h}, is_mobile=size == "phone")
            context.set_offline(True)
            context.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if route.request.url.startswith("file:")
                    else (blocked.append(route.request.url), route.abort())[1]
                ),
            )
            for name, path in pages.items():
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.goto(path.as_uri())
                page.wait_for_function("() => window.lessonRedraws >= 1", timeout=30_000)
                assert page.evaluate("document.documentElement.scrollWidth") <= w, f"{name} scrolls sideways"
                top = page.evaluate("document.getElementById('chart0').getBoundingClientRect().top")
                assert top < h, f"{name} at {size}: the first chart starts at {top:.0f} px, below the fold"
                if name != "hostile":  # drawn like the scaling page: no picture of its own
                    page.screenshot(path=str(SHOTS / f"lesson_{name}_{size}.png"))
                page.locator("#chart0").hover()
                bars = page.evaluate(MODEBAR_SHOWN)
                assert (bars == 0) if size == "phone" else (bars >= 1), f"{name} at {size}: {bars} mode bars"
                assert page.locator('[data-title^="Share chart"]').count() == 0, "no upload to Plotly Cloud"
                for i, control in enumerate(_data(path)["controls"]):
                    before = page.evaluate(CHART_DATA)
                    drawn = page.evaluate("window.lessonRedraws")
                    if control["slider"]:
                        page.locator(f"#c{i}").fill(str(len(control["texts"]) - 1))
                    else:
                        page.locator(f'fieldset[data-control="{i}"] label').nth(1).click()
                    page.wait_for_function(f"() => window.lessonRedraws > {drawn}", timeout=10_000)
                    moved = page.evaluate(CHART_DATA)
                    assert moved != before, f"{name}: moving {control['key']} changed nothing"
                assert not errors, errors
                page.close()
            context.close()
        browser.close()
    assert not blocked, f"the page asked the network for {blocked}"


def test_sweep_points_computed_ahead_are_the_ones_the_page_reads():
    """``hessviz lesson --workers``: the points computed on other workers are stored under the keys the
    page's sweep reads, with the same values, so drawing computes none again."""
    import concurrent.futures as cf

    from hessviz import app as hva
    from hessviz.app import cache, views
    from hessviz.laws import sweeps

    view = hva.View.from_values({"norm": "pre", "L": 3, "d": 4, "dk": 2, "dff": 4, "seed": 7})
    points = views.scaling_points(view, "L", "W_K,W_K", 1)
    with cf.ThreadPoolExecutor(2) as pool:
        assert cache.prime_sweep_points(points, pool) == len({cache._sweep_key(*p) for p in points})
    stored = len(cache.STORE)
    r = views.scaling(view, "L", "W_K,W_K", 1)
    assert len(cache.STORE) == stored + 1, "only the view (its fits and figures) is new"
    c, _ = sweeps.config_at(view.cfg, "L", sweeps.DEFAULT_GRIDS["L"][2])
    again = sweeps.point(c, view.input_norm, 7, ("W_K", "W_K"))
    assert [r.main.values[k][0, 2] for k in sorted(again)] == [again[k] for k in sorted(again)]
