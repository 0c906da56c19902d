"""The app's *Modern block* group: presets, the biases' pills, grouped heads, and a Llama-style view
on the pages (AppTest, routed through ``app.py``; the browser walk is in ``tests/test_browser_tour.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from hessviz.app import presets, state
from hessviz.app.state import View

pytest.importorskip("streamlit")
from tests.test_app_pages import SMALL, array, caption, drawn, figures, run_page  # noqa: E402

LLAMA_URL = {
    "norm": "pre",
    "ntype": "rmsnorm",
    "affine": "true",
    "mlp": "gated",
    "act": "silu",
    "rope": "true",
    "heads": "2",
    "kv": "1",
    "wo": "true",
    "causal": "true",
}


@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_every_preset_is_a_valid_block_in_words(name):
    view = View.from_values(presets.apply(name, state.DEFAULTS))
    cfg = view.cfg
    assert cfg.norm in ("pre", "parallel") and cfg.rope and cfg.causal and cfg.n_heads == 4
    words = view.describe()
    assert {
        "Llama-style": "over 2 key/value heads",
        "Qwen2-style": "biases Q,K,V",
        "Qwen3-style": "QK-norm",
        "Pythia-style": "Parallel block",
    }[name] in words
    assert presets.matching(presets.apply(name, state.DEFAULTS)) == name


def test_a_preset_keeps_the_sizes_input_and_seed():
    here = {**state.DEFAULTS, "L": 5, "d": 32, "xnorm": 10.0, "seed": 7, "loss": "ce"}
    after = presets.apply("Llama-style", here)
    assert {k: after[k] for k in ("L", "d", "xnorm", "seed", "loss")} == {
        "L": 5,
        "d": 32,
        "xnorm": 10.0,
        "seed": 7,
        "loss": "ce",
    }


def test_bias_tuples_travel_in_the_url_as_one_value():
    assert state.format_value("bias", ("Q", "K", "V")) == "Q,K,V"
    assert state.settle_shared("bias", ["Q,K,V"]) == (("Q", "K", "V"), None)
    value, note = state.settle_shared("bias", ["Q,X"])
    assert value is False and "bias=Q,X" in note
    assert state.query_string({**state.DEFAULTS, "bias": ("Q", "V")}) == "bias=Q%2CV"


def test_reconcile_fits_key_value_heads_and_biases_to_the_block():
    values, notes = state.reconcile({**state.DEFAULTS, "heads": 6, "kv": 4, "wo": True})
    assert values["kv"] == 3 and "does not divide" in notes[0]
    values, notes = state.reconcile({**state.DEFAULTS, "bias": ("Q", "O", "G"), "wo": False})
    assert values["bias"] == ("Q",) and "b_O, b_G" in notes[0]
    values, _ = state.reconcile({**state.DEFAULTS, "bias": ("O",), "wo": False})
    assert values["bias"] is False
    View.from_values(values)  # a valid block


def test_every_combination_of_the_controls_is_settled_into_a_block():
    """The audit: any values the sidebar offers (a random 4,000 of them, each control at its
    ends, a middle value or its default), once reconciled, describe a valid block; each value
    reconcile changes comes with one line in the controls' words (no library field names)."""
    import random

    rng = random.Random(0)

    def offered(s):
        if s.choices:
            return list(s.choices)
        if s.members or s.kind is bool:
            return [False, True]
        if s.grid is not None:
            return list(s.grid)
        lo, hi = s.app_range
        return [lo, lo + 1, (lo + hi) // 2 | 1, hi] + ([None] if s.optional else [])

    for _ in range(4000):
        values = {
            k: rng.choice(offered(s)) if rng.random() < 0.5 else s.default
            for k, s in state.APP_SETTINGS.items()
        }
        settled, notes = state.reconcile(values)
        View.from_values(settled)
        assert len(notes) == sum(settled[k] != values[k] for k in values if k != "bias") + (
            settled["bias"] != values["bias"]
        )
        assert not any(word in n for n in notes for word in ("n_heads", "n_kv_heads", "d_model", "ln_eps"))


def test_a_control_the_block_does_not_use_keeps_its_value():
    view = View.from_values({"norm": "attention", "mlp": "gated", "affine": True, "ntype": "rmsnorm"})
    assert view.cfg.mlp == "plain" and not view.cfg.ln_affine and view.cfg.norm_type == "layernorm"


def test_hessian_map_of_a_llama_style_block_names_its_gate_and_grouped_heads():
    at = run_page("pages/hessian_map.py", blk="W_G,W_1", **SMALL, **LLAMA_URL)
    assert "2 heads over 1 key/value heads" in caption(at) and "SiLU gated" in caption(at)
    ticks = figures(at)[0]["layout"]["xaxis"]["ticktext"]
    assert "W<sub>G</sub>" in ticks and "W<sub>K</sub>[0]" in ticks and "W<sub>K</sub>[1]" not in ticks
    assert any("W_K[0], W_V[0] by query heads 0, 1" in c.value for c in at.main.get("caption"))
    view = View.from_values({**{k: state.parse_value(k, v) for k, v in {**SMALL, **LLAMA_URL}.items()}})
    import hessviz as hv

    want = hv.hessian(view.cfg, *view.inputs).block("W_G", "W_1", "full").numpy()
    got = array(figures(at)[2]["data"][0]["customdata"])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_a_preset_button_sets_the_controls_and_the_address():
    at = run_page("pages/spectrum.py", spec_method="dense", **SMALL)
    at.button(key="_hv_preset_2").click().run()  # Qwen3-style
    assert not at.exception, [e.value for e in at.exception]
    assert "QK-norm" in caption(at) and "4 heads over 2 key/value heads" in caption(at)
    assert at.query_params["qknorm"] == "true" and at.query_params["kv"] == "2"
    assert at.query_params["L"] == "4"  # the sizes stay
    assert at.button(key="_hv_preset_2").disabled  # the view is in it
    at.pills(key="bias").set_value(["Q", "K", "V"]).run()
    assert "biases Q,K,V" in caption(at) and at.query_params["bias"] == "Q,K,V"


def test_the_real_model_page_draws_pydoc_llama_under_its_own_next_token_loss():
    at = run_page("pages/real_model.py", rm_model="pydoc-llama", rm_loss="next token", rm_layer="1")
    assert "next-token loss" in at.info[0].value and "final norm and its LM head" in at.info[0].value
    words = drawn(" ".join(c.value for c in at.main.get("caption")))
    assert "Llama (Pre-RMSNorm)" in words and "2 key/value" in words and "layer 3 is drawn" in words
    assert len(at.get("plotly_chart")) >= 3
