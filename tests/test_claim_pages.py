"""AppTest for the four claim pages: each renders without exception, and a control changes the output."""

import pathlib

from streamlit.testing.v1 import AppTest

from hessviz.app.registry import PAGES
from hessviz.experiments import CLAIM_IDS

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(page: str, **query) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=240)  # routed as the app runs it
    at.switch_page(str(PAGES / f"{page}.py"))
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _metrics(at: AppTest) -> dict:
    return {m.label: m.value for m in at.metric}


def test_optimization_page_gradients_and_partition():
    at = _run("optimization", L="4", d="6", dk="3", dff="8")
    assert len(at.get("plotly_chart")) == 2
    before = _metrics(at)["Gini G"]
    at.segmented_control(key="opt_part").set_value("matrix").run()
    assert not at.exception
    assert _metrics(at)["Gini G"] != before


def test_optimization_page_training_view():
    at = _run("optimization", L="4", d="6", dk="3", dff="8", opt_view="training", opt_steps="10")
    charts = at.get("plotly_chart")
    assert len(charts) == 2
    captions = [c.value for c in at.caption if "final" in c.value]
    at.selectbox(key="opt_lr_sgd").set_value("0.3").run()
    assert not at.exception
    assert [c.value for c in at.caption if "final" in c.value] != captions


def test_optimization_page_protocol_view():
    """The committed protocol runs: fine-tuning curves per model beside the random-block ones."""
    at = _run("optimization", opt_view="protocol")
    assert len(at.get("plotly_chart")) == 2
    before = _metrics(at)
    assert set(before) >= {"Gini of the 22 gradient norms", "log(final SGD / best sign-based)"}
    at.segmented_control(key="opt_model").set_value("pydoc-preln").run()
    assert not at.exception
    assert _metrics(at) != before


def test_layernorm_collapse_page_views():
    at = _run("layernorm_collapse", L="4", d="6", dk="3", dff="8")
    m = _metrics(at)
    assert m["slope ‖J‖ (σ ≤ 1e-2)"] == "−1.00" and m["slope of H bound"] == "−5.00"  # a true minus
    at.segmented_control(key="lnc_view").set_value("block").run()
    assert not at.exception
    assert "slope ‖H_QQ‖ (σ ≤ 1e-2)" in _metrics(at)
    # each (seed, σ) point is cached on its own: another seed, or more decades (the σ grids nest),
    # computes only the points it adds (a change used to recompute the whole sweep: 66-100 s)
    from hessviz.app import cache

    def points() -> int:
        return sum(key[0] == "ln_block_point" for key, _ in cache.STORE.items())

    at.slider(key="lnc_decades").set_value(2).run()
    at.slider(key="lnc_seeds").set_value(1).run()
    cache.clear()
    at.run()
    assert points() == 7  # 2 decades: 7 σ, one seed
    at.slider(key="lnc_seeds").set_value(2).run()  # one more seed: 7 more points
    assert not at.exception and points() == 14
    at.slider(key="lnc_decades").set_value(3).run()  # one more decade: 3 more σ per seed
    assert not at.exception and points() == 20


def test_bounds_page_views():
    at = _run("bounds", L="4", d="4", dk="2", bd_cases="10")
    assert at.dataframe, "the per-block table"
    table = at.dataframe[0].value
    assert list(table["block"])[-1] == "whole (M)"
    at.segmented_control(key="bd_view").set_value("layernorm").run()
    assert not at.exception
    assert "σ_min read as" in at.dataframe[0].value.columns


def test_claims_page_table_and_filter():
    at = _run("claims")
    full = at.dataframe[0].value
    assert len(full) == len(CLAIM_IDS)
    at.segmented_control(key="cl_show").set_value("partly").run()
    assert not at.exception
    assert len(at.dataframe[0].value) < len(CLAIM_IDS)
    at.selectbox(key="cl_id").set_value("bounds").run()
    assert any("bounds" in s.value for s in at.subheader)
