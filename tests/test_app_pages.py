"""Every page of the app under ``streamlit.testing.v1.AppTest``, routed through ``app.py``.

For each page: it renders without an exception, and changing a control changes what is
drawn (asserted on the figure's JSON, a caption or a metric). Small blocks keep it quick.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "app.py")
SMALL = {"L": "4", "d": "8", "dk": "4", "dff": "8"}


def run_page(script: str, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page(script)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def figures(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def titles(at: AppTest) -> list[str]:
    out = []
    for f in figures(at):
        t = f.get("layout", {}).get("title", {})
        out.append(t.get("text", "") if isinstance(t, dict) else str(t))
    return out


def caption(at: AppTest) -> str:
    return at.main.get("caption")[0].value


def test_hessian_map_renders_and_reacts():
    at = run_page("app_pages/hessian_map.py", **SMALL)
    assert caption(at).startswith("Post-LN block, L = 4, d = 8")
    assert len(at.get("plotly_chart")) == 2
    before = titles(at)
    assert any("full Hessian" in t for t in before)
    at.segmented_control(key="term").set_value("functional").run()
    assert not at.exception
    assert any("functional Hessian" in t for t in titles(at))
    at.slider(key="dk").set_value(2).run()  # P changes: the map is recomputed
    P = sum(int(s) for s in [8 * 2, 8 * 2, 8 * 8, 8 * 8, 8 * 8])
    assert any(f"P = {P:,}" in t for t in titles(at))
    at.selectbox(key="blk").set_value("W_Q,W_K").run()  # zoom into one block
    assert len(at.get("plotly_chart")) == 3
    assert any("W_Q × W_K" in t for t in titles(at))


def test_hessian_map_refuses_too_large():
    at = run_page("app_pages/hessian_map.py", d="64", dff="256")
    assert not at.get("plotly_chart")
    assert "P = " in at.warning[0].value and "Lower d" in at.warning[0].value


def test_invalid_block_shows_message():
    at = run_page("app_pages/hessian_map.py", d="1")  # LayerNorm with d = 1 and eps = 0
    assert not at.get("plotly_chart")
    assert "d_model must be >= 2" in at.error[0].value


def test_spectrum_renders_and_reacts():
    at = run_page("app_pages/spectrum.py", **SMALL)
    assert len(at.get("plotly_chart")) == 3
    metrics = {m.label: m.value for m in at.metric}
    assert "negative mass" in metrics
    assert at.success or at.info  # the message the data supports
    before = [m.value for m in at.metric]
    at.segmented_control(key="norm").set_value("attention").run()
    assert not at.exception
    assert caption(at).startswith("Self-attention alone")
    assert [m.value for m in at.metric] != before
    bars = figures(at)[2]
    assert all("W_1" not in x for trace in bars["data"] for x in trace["x"])  # no FFN blocks any more


def test_spectrum_terms_drawn_come_from_the_url():
    at = run_page("app_pages/spectrum.py", spec_terms=["outer"], **SMALL)
    sorted_plot = figures(at)[0]
    assert [trace["name"] for trace in sorted_plot["data"]] == ["outer"]
    assert "spec_terms=outer" in at.sidebar.code[0].value                 # and in the link to this view


def test_scaling_renders_and_reacts():
    at = run_page("app_pages/scaling.py", norm="attention", sc_seeds="2", **SMALL)
    figs = figures(at)
    assert len(figs) == 2
    assert figs[0]["layout"]["xaxis"]["title"]["text"] == "input size ‖X‖₂"
    table = at.dataframe[0].value
    outer = table[table["term"] == "outer"]
    assert outer["theory"].iloc[0] == "6"
    assert abs(outer["fitted slope"].iloc[0] - 6.0) < 0.5
    at.segmented_control(key="sc_axis").set_value("L").run()
    assert not at.exception
    assert figures(at)[0]["layout"]["xaxis"]["title"]["text"] == "sequence length L"


def test_verify_renders_and_reacts():
    at = run_page("app_pages/verify.py", **SMALL)
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["worst relative error"]) < 1e-10
    assert at.success
    ticks = figures(at)[0]["data"][0]["x"]
    assert len(ticks) == 5
    at.segmented_control(key="norm").set_value("attention").run()
    assert not at.exception
    assert len(figures(at)[0]["data"][0]["x"]) == 3


def test_learn_renders_and_reacts():
    at = run_page("app_pages/learn.py", **SMALL)
    assert len(at.latex) >= 4
    assert len(at.get("page_link")) == 5  # the classroom tour
    queries = [pl.proto.query_string for pl in at.get("page_link")]
    assert "norm=attention" in queries[0] and "sc_axis=xnorm" in queries[0]
    bars = figures(at)[0]
    assert len(bars["data"][0]["x"]) == 5
    at.segmented_control(key="norm").set_value("attention").run()
    assert not at.exception
    assert len(figures(at)[0]["data"][0]["x"]) == 3
