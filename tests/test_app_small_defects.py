"""The smaller defects a teacher's walk through the app found (issue 44, item 7), each checked
on the page it was seen on (:class:`streamlit.testing.v1.AppTest`) or on the figure that draws it."""

from __future__ import annotations

import numpy as np
import pytest

from hessviz import plots
from hessviz.app.state import View
from tests.test_app_pages import SMALL, figures, run_page
from tests.test_tour_truth import array


def _table(at, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header line starts with ``header``, cell by cell."""
    text = next(m.value for m in at.markdown if m.value.startswith(header))
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]


def test_the_slope_table_says_none_where_no_theory_gives_an_exponent():
    """Post-LN's outer slope (4.00) stood alone under 'slope (theory)', as if 4 were a theory."""
    at = run_page("pages/scaling.py", norm="post", sc_seeds="1", **SMALL)
    rows = {r[0]: r for r in _table(at, "| term | fitted slope | theory |")}
    assert set(rows) == {"outer", "functional", "full"}
    assert all(r[2] == "none" for r in rows.values()), rows
    at = run_page("pages/scaling.py", norm="attention", sc_seeds="1", **SMALL)
    rows = {r[0]: r for r in _table(at, "| term | fitted slope | theory |")}
    assert rows["outer"][2] == "6" and abs(float(rows["outer"][1].replace("−", "-")) - 6) < 0.5


def test_bounds_use_one_ratio_convention_and_draw_the_line_at_one():
    """The table divided bound by exact (below 1: violated) and the chart exact by bound, with no
    line at 1: both are bound / exact now, and the chart draws the 1."""
    at = run_page("pages/bounds.py", bd_cases="10", **SMALL)
    columns = list(at.dataframe[0].value.columns)
    ratios = [c for c in columns if "/" in c]
    assert ratios and all(c.endswith(" / exact") for c in ratios), columns
    ratio = next(f for f in figures(at) if "bound / exact" in f["layout"]["yaxis"]["title"]["text"])
    line = [t for t in ratio["data"] if t.get("mode") == "lines"]
    assert len(line) == 1 and np.all(array(line[0]["y"]) == 1.0) and "violated" in line[0]["name"]
    xs = np.concatenate([array(t["x"]) for t in ratio["data"] if t.get("mode") == "markers"])
    assert array(line[0]["x"]).min() <= xs.min() and array(line[0]["x"]).max() >= xs.max()
    for t in ratio["data"]:  # every corrected bound holds: its points lie on or above the line
        if t.get("mode") == "markers" and t["name"] == "corrected":
            assert np.all(array(t["y"]) >= 1 - 1e-9)


def test_the_layernorm_formula_draws_its_mean_without_a_thin_accent():
    """z̄'s bar was one device pixel at 100 % zoom and vanished: the mean is written out."""
    for page in ("pages/learn.py", "pages/layernorm_collapse.py"):
        at = run_page(page, **SMALL)
        bodies = [e.value for e in at.get("latex")]
        ln = [b for b in bodies if r"\mathrm{LN}(z)" in b]
        assert ln, page
        assert all(r"\bar" not in b and r"\operatorname{mean}(z)" in b for b in ln), ln


def test_every_weight_of_the_default_block_is_named_on_the_hessian_map():
    """On the default block W_K (128 of 1,536 rows, between W_Q and W_V) had no label: its name did
    not fit beside theirs on a phone, so it was named in the hover only. It is drawn under the map."""
    at = run_page("pages/hessian_map.py")
    heat = figures(at)[0]
    named = list(heat["layout"]["xaxis"]["ticktext"]) + [
        a["text"] for a in heat["layout"].get("annotations", []) if a.get("name") == "block label"
    ]
    for w in View.from_values({}).cfg.param_names:
        assert plots.style.pretty(w) in named, (w, named)


def test_a_lesson_page_never_calls_the_swept_setting_fixed(tmp_path):
    """A lesson over a sweep in L that hides L said 'Fixed by this lesson: L = 4, d = 4'."""
    from hessviz.app import lesson_page

    out = tmp_path / "l.html"
    lesson_page.write(
        "/scaling?norm=attention&L=4&d=4&dk=2&dff=8&sc_seeds=1&sc_axis=L&hide=L,d,sc_axis,sc_blk", out
    )
    text = out.read_text()
    line = next(seg for seg in text.split("<") if "Fixed by this lesson" in seg)
    assert "Fixed by this lesson: d = 4." in line, line  # the hidden d is fixed, the swept L is not


def test_the_layer_slider_keeps_its_layer_when_the_model_changes():
    """A model with another number of layers is a new slider to Streamlit, which started it at 0,
    while the fresh link of the same view opens layer 3: both open the layer the slider held."""
    at = run_page("pages/real_model.py")
    assert at.slider(key="rm_layer").value == 3
    at.selectbox(key="rm_model").set_value("smollm2-135m").run()
    assert not at.exception
    moved = at.slider(key="rm_layer")
    assert moved.max == 29 and moved.value == 3
    fresh = run_page("pages/real_model.py", **{k: at.query_params[k] for k in at.query_params})
    assert fresh.slider(key="rm_layer").value == moved.value


def test_the_apps_error_lines_start_with_a_capital(monkeypatch):
    """The app's one-line errors repeat the library's words, which start in lower case ('… is too
    large for this server. the weights of smollm2-135m needs …'): drawn, they start a sentence."""
    import hessviz as hv
    from hessviz.app import cache, state

    def refuse(*args, **kwargs):
        raise hv.SizeError("the block norms need about 9 GiB", needed_bytes=9 * 2**30, limit_bytes=2**30)

    monkeypatch.setattr(cache, "block_norms", refuse)
    at = run_page("pages/learn.py", **SMALL)
    (line,) = [e.value for e in at.error]
    assert line.endswith("** The block norms need about 9 GiB\\."), line  # a sentence, its full stop escaped
    assert state.sentence("d_model must be >= 2") == "d_model must be >= 2."  # a name keeps its case


def test_the_claims_header_does_not_read_as_the_claims_configuration():
    """The sidebar's block was described under the Claims title, and its controls changed only that
    line: it read as the configuration of the stored claims, which it is not."""
    at = run_page("pages/claims.py", **SMALL)
    view = View.from_values({**View.from_values({}).values, **{k: int(v) for k, v in SMALL.items()}})
    header = [c.value for c in at.main.get("caption")][0]
    assert "not on the sidebar's block" in header and view.describe() not in header
    before = at.dataframe[0].value.to_dict()
    at.slider(key="d").set_value(6).run()
    assert not at.exception and [c.value for c in at.main.get("caption")][0] == header
    assert at.dataframe[0].value.to_dict() == before


def test_a_trace_within_its_error_of_zero_is_not_drawn_as_a_positive_bar_on_a_log_axis():
    """Hutch++ gave a block 0.021 ± 0.173, drawn as a positive bar on a log axis."""
    names = ["W_Q", "W_K", "W_V"]
    fig = plots.block_spectrum_bars(
        names, np.ones(3), np.array([0.021, 5.0, 3.0]), trace_errors=[0.173, 0.1, 0]
    )
    bars = fig.data[1]
    assert fig.layout.yaxis2.type != "log"  # the error bar crosses 0 where one can see it
    assert list(bars.marker.pattern.shape) == ["/", "", ""]
    assert "not significant" in bars.customdata[0] and "not significant" not in bars.customdata[1]
    sure = plots.block_spectrum_bars(names, np.ones(3), np.array([1.0, 5.0, 3.0]), trace_errors=[0.1, 0.1, 0])
    assert sure.layout.yaxis2.type == "log" and list(sure.data[1].marker.pattern.shape) == ["", "", ""]


def test_a_bar_panel_on_a_log_axis_has_a_tick_above_its_tallest_bar():
    """The Real model's eigenvalue panel (λ_max up to 4e-3) had no tick above 10⁻³."""
    top = np.array([1e-9, 3e-7, 2e-5, 4e-3, 1e-4, 2e-3])
    fig = plots.block_spectrum_bars(["W_Q", "W_K", "W_V", "W_O", "W_1", "W_2"], top, np.ones(6))
    ticks, (lo, hi) = fig.layout.yaxis.tickvals, fig.layout.yaxis.range
    assert fig.layout.yaxis.type == "log" and max(ticks) >= top.max()
    assert lo <= np.log10(top.min()) and hi >= np.log10(max(ticks))  # the tick is inside the axis


def test_a_tour_step_asks_for_the_live_view_on_screen():
    """On a phone Back / Next sit under the live view; after a step the page stayed where the button
    was. A step (and only a step) adds the script that scrolls the live view up under the header."""
    at = run_page("pages/learn.py", **SMALL)
    assert not [h for h in at.get("html") if "scrollIntoView" in h.proto.body]
    at.button(key="tour_next").click().run()
    scripts = [h.proto.body for h in at.get("html") if "scrollIntoView" in h.proto.body]
    assert len(scripts) == 1 and ".st-key-hv_live" in scripts[0] and "max-width: 640px" in scripts[0]
    at.run()  # a rerun that is not a step leaves the scroll alone
    assert not [h for h in at.get("html") if "scrollIntoView" in h.proto.body]


@pytest.mark.slow
@pytest.mark.browser
def test_next_on_a_phone_brings_the_live_view_on_screen():
    """In Chromium at 390 × 844: scroll to Next, tap it; the new stop's live view is on screen."""
    from tests.streamlit_server import chromium, require_chromium, running_server
    from tests.test_browser import _settle

    require_chromium()
    with running_server("streamlit_tour_phone.log") as srv, chromium() as browser:
        ctx = browser.new_context(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
        page = ctx.new_page()
        page.goto(f"{srv.base}/learn")
        _settle(page)
        nxt = page.locator(".st-key-tour_next button")
        nxt.scroll_into_view_if_needed()
        nxt.click()
        page.wait_for_selector("text=2. Pre-LN flattens it", timeout=60_000)
        _settle(page)
        page.wait_for_timeout(500)
        box = page.locator(".st-key-hv_live").bounding_box()
        assert box is not None and 0 <= box["y"] < 844 / 2, box
        ctx.close()
