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
from hessviz.experiments import llm_table as st
from hessviz.experiments import smollm2 as sm


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


def test_the_stored_claims_are_those_of_the_stored_table(stored):
    table, _ = stored
    records = {r["id"]: r for r in json.loads((st.stored(sm.MODEL) / "claims.json").read_text())}
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


def test_the_gini_claim_reports_beside_the_committed_models():
    """``reproduce --smollm2`` writes its Gini claim beside the committed ``gini_protocol`` Gini of each
    of that claim's models (a float each: the committed record also holds bands, differences and a
    Peri-LN variant, which once broke the report's formatting) and reproduces the stored numbers."""
    from hessviz.experiments.gini_protocol import MODELS

    committed = sm.committed_gini()
    assert list(committed) == list(MODELS) and all(isinstance(v, float) for v in committed.values())
    m = sm.measure_gini()
    note, figures = sm.report_gini(m, sm.judge_gini(m.numbers))
    assert all(f"{name} {committed[name]:.3f}" in note for name in MODELS) and figures
    stored = {r["id"]: r for r in json.loads((st.stored(sm.MODEL) / "claims.json").read_text())}
    want = stored["gini_smollm2"]["measured"]
    assert set(m.numbers) == set(want)
    for k, v in m.numbers.items():
        assert np.asarray(v) == pytest.approx(np.asarray(want[k]), rel=1e-12), k
