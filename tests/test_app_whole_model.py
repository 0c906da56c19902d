"""The Whole model page (``pages/whole_model.py``) under ``streamlit.testing.v1.AppTest``, its
precomputed default tables (``hessviz/data/whole_tables.json``) and the pieces of
:mod:`hessviz.app.whole_model`.

The default view of every model is drawn from the file (no computation); a live table runs on a
short text with fewer tensors; bad texts get one message and the box keeps what was typed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("streamlit")

import hessviz as hv  # noqa: E402
from hessviz import pretrained  # noqa: E402
from hessviz.app import whole_model as wm  # noqa: E402
from hessviz.errors import InputError  # noqa: E402
from hessviz.whole.table import tensor_table  # noqa: E402
from tests.test_app_pages import drawn, figures, run_page, titles  # noqa: E402

PAGE = "pages/whole_model.py"


def shown(at) -> str:
    return drawn(" ".join(m.value for m in [*at.warning, *at.info, *at.error]))


@pytest.fixture
def hosted(monkeypatch):
    """The hosted profile's limits (4 s per view, 800 MiB), an empty store."""
    from hessviz.app import cache, profiles

    lim = profiles.limits_from_env(
        {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=400 << 20
    )
    monkeypatch.setattr(cache, "LIMITS", lim)
    cache.clear()
    return cache


def computed(cache) -> list:
    return [k for k, _ in cache.STORE.items() if k[0] == "whole"]


# ----------------------------------------------------------------------------- the precomputed file


def test_the_precomputed_file_holds_every_default_table():
    data = json.loads(wm.FILE.read_text())
    made = data["made"]
    assert (made["text"], made["samples"], made["exact"], made["seed"]) == (
        wm.DEFAULT_TEXT,
        wm.SAMPLES,
        wm.EXACT,
        wm.SEED,
    )
    assert set(made["models"]) == set(wm.MODELS)
    for m in wm.MODELS:
        stack = wm.stack_config(pretrained.model_info(m))
        for part in wm.parts(m):
            entry = wm.lookup(m, wm.DEFAULT_TEXT, part)
            assert entry is not None, (m, part)
            assert entry["names"] == list(wm.tensors(stack, part))
            assert all(np.isfinite(entry[k]).all() for k in ("top", "trace", "grad_norm"))
    assert wm.lookup(wm.MODELS[0], "another text", wm.WEIGHTS) is None


@pytest.mark.parametrize("model", ["pydoc-preln", "pydoc-postln"])
def test_a_precomputed_row_equals_a_fresh_computation(model):
    """Rows of the file against a fresh table of a few of its tensors (the rows are independent: each
    block's draws are seeded by itself), an exact one and a Lanczos one."""
    entry = wm.lookup(model, wm.DEFAULT_TEXT, wm.WEIGHTS)
    picked = ("l3.ln2_gamma", "l0.W_V")
    mdl = hv.load_model(model)
    objective, used, _ = wm.objective_of(mdl, pretrained.token_ids(model, wm.DEFAULT_TEXT))
    res = hv.model_hessian(mdl, torch.tensor(used), objective=objective, wrt=picked)
    fresh = tensor_table(res, trace_samples=wm.SAMPLES, exact_limit=wm.EXACT, seed=wm.SEED)
    assert float(res.value) == pytest.approx(entry["value"], rel=1e-12)
    for r in fresh.rows:
        i = entry["names"].index(r.name)
        assert r.top == pytest.approx(entry["top"][i], rel=1e-6)
        assert r.grad_norm == pytest.approx(entry["grad_norm"][i], rel=1e-10)
        assert r.exact == entry["exact"][i]
        if r.exact:
            assert r.trace == pytest.approx(entry["trace"][i], rel=1e-10)


# ----------------------------------------------------------------------------- the page


def test_the_default_view_is_drawn_from_the_file_on_the_hosted_profile(hosted):
    at = run_page(PAGE)
    assert not at.warning and not at.error, shown(at)
    assert len(at.get("plotly_chart")) == 2
    assert "next-token" in at.info[0].value
    assert any("pydoc-llama: top eigenvalue per weight" in t for t in titles(at))
    weights = figures(at)[0]
    assert [tr["name"] for tr in weights["data"]] == [f"layer {i}" for i in range(4)]
    assert not computed(hosted)  # nothing computed: read from the file
    before = figures(at)[0]["data"][0]["y"]
    at.segmented_control(key="wm_stat").set_value("gradient norm").run()
    at.selectbox(key="wm_w").set_value("W_V").run()
    assert not at.exception and not at.warning
    assert figures(at)[0]["data"][0]["y"] != before
    assert any("gradient norm per head of W_V" in t for t in titles(at))
    assert at.query_params["wm_stat"] == "gradient norm" and at.query_params["wm_w"] == "W_V"
    assert not computed(hosted)


def test_the_url_round_trips(hosted):
    """A view opened from its address draws what the controls drew."""
    at = run_page(PAGE, wm_model="pydoc-postln")
    at.segmented_control(key="wm_stat").set_value("trace").run()
    at.selectbox(key="wm_w").set_value("W_O").run()
    query = {k: at.query_params[k] for k in ("wm_model", "wm_stat", "wm_w")}
    assert query == {"wm_model": "pydoc-postln", "wm_stat": "trace", "wm_w": "W_O"}
    again = run_page(PAGE, **query)
    assert figures(again) == figures(at) and titles(again) == titles(at)
    assert "classification head on the last hidden state" in again.info[0].value


LONG = (
    "Return a new list containing all items from the iterable in ascending order. A custom key function "
    "can be supplied to customize the sort order, and the reverse flag can be set."
)


def test_the_hosted_profile_draws_a_short_typed_text_live(hosted):
    """A student's short text is computed on the hosted profile (issue 44: every typed text was refused,
    its estimate 5× the measured CPU)."""
    at = run_page(PAGE, wm_text="def add(a, b):\n    return a + b")
    assert not at.warning and not at.error, [w.value for w in at.warning]
    assert len(at.get("plotly_chart")) == 2 and len(computed(hosted)) == 2


def test_a_text_over_the_hosted_budget_draws_the_per_head_table_and_advice_that_works(hosted):
    stack = wm.stack_config(pretrained.model_info("pydoc-llama"))
    n = len(pretrained.token_ids("pydoc-llama", LONG))
    assert wm.table_cost(stack, wm.tensors(stack, wm.WEIGHTS), n).seconds > hosted.LIMITS.max_seconds
    at = run_page(PAGE, wm_text=LONG)
    assert "Too much for this server" in at.warning[0].value and "shorter text" in at.warning[0].value
    assert at.text_area(key="wm_text").value == LONG
    assert len(at.get("plotly_chart")) == 1 and "Objective:" in at.info[0].value  # every head of W_Q
    at.text_area(key="wm_text").set_value(LONG.split(". ")[0] + ".").run()  # the advice: a shorter text
    assert not at.warning and len(at.get("plotly_chart")) == 2


@pytest.mark.parametrize(
    "text, message",
    [
        ("word " * 59, "177 tokens long, more than the model's 64 positions"),
        ("x", "is 1 token long**; pydoc-llama reads 2 to 64"),
    ],
    ids=["too-many-tokens", "one-token"],
)
def test_a_bad_text_gets_one_message_and_stays(text, message):
    at = run_page(PAGE, wm_text=text)
    assert not at.get("plotly_chart") and len(at.error) == 1
    assert message in drawn(at.error[0].value)
    assert at.text_area(key="wm_text").value == text


def test_an_emptied_text_box_draws_the_default_text(hosted):
    at = run_page(PAGE)
    at.text_area(key="wm_text").set_value("  ").run()
    assert not at.exception
    assert "Text: the box is empty, so the default text is drawn." in shown(at)
    assert len(at.get("plotly_chart")) == 2 and not computed(hosted)


def test_a_live_table_is_computed_with_progress_and_cached(monkeypatch):
    """The local profile computes a text's tables (here two layers' worth of tensors, to stay quick)
    through the store, then draws them again from it."""
    from hessviz.app import cache

    cache.clear()
    monkeypatch.setattr(wm, "SAMPLES", 3)
    real = wm.tensors
    monkeypatch.setattr(
        wm,
        "tensors",
        lambda cfg, part: tuple(
            n for n in real(cfg, part) if n.startswith("l3.") and ("W_" not in n or "W_V" in n or "W_Q" in n)
        ),
    )
    at = run_page(PAGE, wm_model="pydoc-llama", wm_text="x = 1")
    assert not at.error and not at.warning, shown(at)
    assert len(computed(cache)) == 2
    assert "Estimated work" in " ".join(c.value for c in at.caption)
    names = figures(at)[0]["data"][0]["x"]
    assert len(names) == 4 and "layer 3" == figures(at)[0]["data"][0]["name"]
    again = run_page(PAGE, wm_model="pydoc-llama", wm_text="x = 1")
    assert figures(again) == figures(at) and len(computed(cache)) == 2


# ----------------------------------------------------------------------------- the pieces


def test_a_table_stops_when_its_progress_raises():
    """The page's progress raises when the visitor leaves or moves a control: the table stops there."""
    res = hv.model_hessian(
        hv.load_model("pydoc-llama"),
        torch.tensor([5, 9, 23]),
        wrt=("l0.ln1_gamma", "l1.ln1_gamma", "l2.ln1_gamma"),
    )
    seen = []

    class Left(Exception):
        pass

    def progress(done, total, message):
        seen.append((done, total))
        if done == 1:
            raise Left

    with pytest.raises(Left):
        tensor_table(res, progress=progress)
    assert seen[-1] == (1, 3) and all(t == 3 for _, t in seen)


def test_the_classifier_of_the_bert_model_is_its_tied_unembedding():
    model = hv.load_model("pydoc-postln")
    ids = pretrained.token_ids("pydoc-postln", "import sys")
    head, used, words = wm.objective_of(model, ids)
    assert isinstance(head, hv.Classifier) and head.pooling == "last" and used == ids[:-1]
    assert head.W.shape == (128, 1024) and int(head.labels[0]) == ids[-1]
    with pytest.raises(InputError, match="at least 2 tokens"):
        wm.objective_of(model, ids[:1])


def test_by_layer_puts_one_group_per_layer():
    cats, groups = wm.by_layer(["l0.W_Q", "l0.W_K", "l1.W_Q"], [1.0, 2.0, 3.0])
    assert cats == ["W_Q", "W_K"] and list(groups) == ["layer 0", "layer 1"]
    assert groups["layer 0"].tolist() == [1.0, 2.0] and groups["layer 1"][0] == 3.0
    assert np.isnan(groups["layer 1"][1])


def test_the_cost_estimate_grows_with_the_text_and_counts_every_product():
    """The estimate is calibrated on the measured CPU (``benchmarks/REAL_LLM.md``: it was 9-35× over,
    issue 44); it grows with the text and with the tensors, and bounds the products as memory is sized."""
    stack = wm.stack_config(pretrained.model_info("pydoc-llama"))
    every = wm.tensors(stack, wm.WEIGHTS)
    c = wm.table_cost(stack, every, 22)
    assert c.seconds < 120.0 and c.products > 1000
    assert wm.table_cost(stack, every, 6).seconds < c.seconds
    assert wm.table_cost(stack, wm.tensors(stack, "W_Q"), 22).seconds < c.seconds
