"""The real LLMs' stored per-tensor tables (hessviz/data/claims/<model>/table.json and gradients.json,
written by hessviz.experiments.llm_table, read never recomputed here: each is most of an hour of two
cores): complete where they say, consistent with their gradients, and drawn by the app's pages within
the hosted profile's memory limit without computing anything."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hessviz.app import stored_tables
from hessviz.experiments import llm_table

LAYER_WEIGHTS = {
    "smollm2-135m": ("ln1_gamma", "W_Q", "W_K", "W_V", "W_O", "ln2_gamma", "W_G", "W_1", "W_2"),
    "gemma3-270m": (
        "ln1_gamma",
        "W_Q",
        "q_norm_gamma",
        "W_K",
        "k_norm_gamma",
        "W_V",
        "W_O",
        "ln1_out_gamma",
        "ln2_gamma",
        "W_G",
        "W_1",
        "W_2",
        "ln2_out_gamma",
    ),
}
"""Each model's weights of one layer (its family's names, in θ order)."""
SHAPES = {
    "smollm2-135m": (30, {"W_Q": 9, "W_K": 3, "W_V": 3, "W_O": 9}),
    "gemma3-270m": (18, {"W_Q": 4, "W_K": 1, "W_V": 1, "W_O": 4}),
}
"""Each model's layers and heads of each headed weight (grouped-query attention: fewer key/value heads)."""


def _layer(name: str) -> int:
    return int(name.split(".", 1)[0][1:])


@pytest.mark.parametrize("model", SHAPES)
def test_a_stored_table_is_complete_where_it_says_and_agrees_with_its_gradients(model):
    table = stored_tables.load(model)
    grads = table["grad"]
    layers, heads = SHAPES[model]
    weights = LAYER_WEIGHTS[model]
    assert (table["model"], table["text"], table["tokens"], table["tol"]) == (
        model,
        llm_table.TEXT,
        llm_table.TOKENS,
        llm_table.TOL,
    )
    assert len(grads) == layers * (len(weights) + sum(heads.values()))  # every weight and head
    rows = table["rows"]
    for i in table["weight_layers"]:
        assert {n.split(".", 1)[1] for n in rows if "[" not in n and _layer(n) == i} == set(weights)
    for i in table["head_layers"]:
        assert len([n for n in rows if "[" in n and _layer(n) == i]) == sum(heads.values())
    assert len(rows) == len(weights) * len(table["weight_layers"]) + sum(heads.values()) * len(
        table["head_layers"]
    )
    for n, r in rows.items():
        assert math.isfinite(r["top"]) and r["matvecs"] >= 1
        assert math.isclose(r["grad"], grads[n], rel_tol=1e-4), n
    for i in range(layers):  # the heads' norms make up the weight's
        for w, count in heads.items():
            parts = math.sqrt(sum(grads[f"l{i}.{w}[{h}]"] ** 2 for h in range(count)))
            assert math.isclose(parts, grads[f"l{i}.{w}"], rel_tol=1e-4)


@pytest.mark.parametrize("model", SHAPES)
def test_the_pages_draw_a_stored_table_within_the_hosted_limit(model, monkeypatch, tmp_path):
    """Whole model, Heterogeneity and the Optimization page's protocol view, on the hosted profile with
    800 MiB: the stored table and claims are drawn, nothing is computed or cached; a stored file that
    cannot be read is one line, not a traceback."""
    pytest.importorskip("streamlit")
    from hessviz.app import cache, profiles
    from hessviz.pretrained.checkpoint import available_models
    from tests.test_app_pages import run_page, titles

    if model not in available_models():
        pytest.skip(f"{model} is not installed (the README's set-up installs it)")
    hosted = {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}
    monkeypatch.setattr(cache, "LIMITS", profiles.limits_from_env(hosted, baseline_bytes=400 << 20))
    cache.clear()
    layers, heads = SHAPES[model]

    at = run_page("pages/whole_model.py", wm_model=model)
    assert not at.warning and not at.error, [m.value for m in [*at.warning, *at.error]]
    assert "Precomputed, not live" in at.info[0].value and f"of {layers} layers" in at.info[0].value
    got = titles(at)
    assert any(t.startswith(f"{model}: top eigenvalue per weight") for t in got), got
    assert any(t.startswith(f"{model}: top eigenvalue per head of W_Q") for t in got), got

    at = run_page("pages/heterogeneity.py", het_model=model)
    assert not at.error and not at.warning, [m.value for m in [*at.error, *at.warning]]
    got = titles(at)
    assert any(t.startswith(f"{model}, layer") for t in got), got
    assert any(t.startswith(f"{model}: Wang et al.'s sharpness per block type under") for t in got), got

    at = run_page("pages/optimization.py", opt_view="protocol", opt_model=model)
    assert not at.error and any("Gini of the 22 gradient norms" in t for t in titles(at))
    assert (
        at.metric[0].value
        == f"{stored_tables.claims(model)[stored_tables.gini_id(model)]['measured'][f'gini_{model}']:.3f}"
    )
    assert not list(cache.STORE.items())

    monkeypatch.setitem(stored_tables.MODELS, model, tmp_path)
    (tmp_path / "table.json").write_text("{not json")
    at = run_page("pages/heterogeneity.py", het_model=model)
    assert len(at.error) == 1 and "cannot be read" in at.error[0].value


def test_a_stored_part_is_nan_where_the_run_did_not_reach():
    """A run cut short by its budget: the bars it did not reach are NaN, every gradient norm is there."""
    from hessviz.block.config import BlockConfig

    cfg = BlockConfig(seq_len=3, d_model=4, d_k=2, n_heads=2, out_proj=True, n_layers=2)
    stored = {
        "rows": {"l1.W_Q": {"top": 2.0, "grad": 1.0, "matvecs": 3, "seconds": 0.5}},
        "grad": {n: 1.0 for n in cfg.param_names},
        "weight_layers": [1],
        "head_layers": [],
    }
    part = stored_tables.part(stored, cfg, stored_tables.WEIGHTS)
    assert part["reached"] == 1 and part["matvecs"] == 3
    top = np.array(part["top"])
    assert (
        top[part["names"].index("l1.W_Q")] == 2.0
        and np.isnan(np.delete(top, part["names"].index("l1.W_Q"))).all()
    )
    assert np.isfinite(part["grad_norm"]).all()


def test_reading_a_stored_llm_for_its_pages_fits_the_hosted_memory(tmp_path):
    """What the three pages read of a real LLM (its configuration, its stored table and claims) leaves
    a fresh process with the app's stack under 600 MiB at its peak, inside the hosted profile's 800 MiB:
    the GGUF file's 262,144-piece vocabulary is not parsed for it (it took the peak to 1,001 MiB). The
    peak is the process's own ``VmHWM``: ``ru_maxrss`` would start from the forking test process's."""
    import subprocess
    import sys

    from hessviz.pretrained.checkpoint import available_models

    models = [m for m in SHAPES if m in available_models()]
    if not models:
        pytest.skip("no bundled LLM is installed (the README's set-up installs them)")
    code = (
        "import hessviz, streamlit, plotly\n"
        "from hessviz import pretrained\n"
        "from hessviz.app import stored_tables\n"
        f"for m in {models!r}:\n"
        "    pretrained.model_info(m); stored_tables.load(m); stored_tables.claims(m)\n"
        "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) // 1024)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) < 600, out.stdout


def test_a_layers_rows_are_its_tensors_one_at_a_time():
    """``llm_table`` computes a layer's rows in lockstep (:func:`llm_table.layer_rows`): each tensor's
    top eigenvalue and products are those of its tensor alone (``tensor_table`` of one tensor, the
    way the stored files were first made), heads as weights; its seconds add up to the layer's."""
    import torch

    import hessviz as hv
    from hessviz.whole.table import tensor_table

    model = hv.load_model("pydoc-llama", dtype=torch.float32)
    res = hv.model_hessian(model, torch.tensor([1, 5, 9, 2, 7, 3]), "next_token")
    for names in ([n for n in res.names if n.startswith("l1.")], list(model.cfg.head_names("l1.W_Q"))):
        got = llm_table.layer_rows(res, names)
        assert list(got) == names
        for n in names:
            alone = tensor_table(
                res, tensors=[n], trace_samples=0, exact_limit=0, tol=llm_table.TOL, bound="value"
            )
            assert got[n]["top"] == pytest.approx(alone.rows[0].top, rel=1e-5)
            assert got[n]["matvecs"] == alone.matvecs and got[n]["size"] == alone.rows[0].size
            assert got[n]["grad"] == pytest.approx(alone.rows[0].grad_norm, rel=1e-6)
        assert all(r["seconds"] >= 0 for r in got.values())
