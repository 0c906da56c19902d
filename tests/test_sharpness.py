"""Wang et al.'s block sharpness (hessviz.experiments.sharpness) on a tiny random tied Llama, against
``transformers``' own float64 model and autograd.

* the GNB estimator, enumerated over every draw of labels, has the exact expectation
  ``tr(G_T) / m_T``, ``G`` the Gauss–Newton matrix of the logits (``Σ_t Σ_v p_tv ‖∇_T ℓ_{t,v}‖² / N``),
  for every block type, Emb over both copies of the tied matrix;
* the per-type quadratic forms of the whole-model operator, with identity probes, sum to the trace of
  the full Hessian's diagonal block, computed by double backward through ``transformers``;
* the protocol's run writes both metrics.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

import hessviz as hv
from hessviz.experiments import sharpness as sh

transformers = pytest.importorskip("transformers")

VOCAB, D, FF, LAYERS, HEADS = 6, 8, 12, 2, 2
REL = 1e-6
"""transformers computes Llama's RMSNorm in float32 even in a float64 model (docs/MODEL.md), so the
reference agrees to about 1e-8 here, not to float64 round-off (tests/test_whole_hessian.py: the same)."""
IDS = torch.tensor([[3, 1], [5, 2]])  # B = 2 sequences, one predicted token each: 6² label draws
HF = {
    "QK": ("self_attn.q_proj", "self_attn.k_proj"),
    "VO": ("self_attn.v_proj", "self_attn.o_proj"),
    "FFN": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "Norm": ("input_layernorm", "post_attention_layernorm"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=FF,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=1,
        max_position_embeddings=8,
        tie_word_embeddings=True,
        attn_implementation="eager",  # double backward (the trace test) has no flash-attention rule
    )
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn_like(p) + (1.0 if p.dim() == 1 else 0.0))
    root = tmp_path_factory.mktemp("sharpness") / "tiny"
    model.save_pretrained(root)
    return root, model.double().eval()


def _params(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    out = {t: [] for t in ("Emb", *HF)}
    out["Emb"].append(model.model.embed_tokens.weight)
    for layer in model.model.layers:
        for t, mods in HF.items():
            for m in mods:
                out[t].append(layer.get_submodule(m).weight)
    return out


def _token_losses(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp (N, V), p (N, V))`` of the predicting positions (float64)."""
    logits = model(IDS).logits[:, :-1].reshape(-1, VOCAB)
    logp = torch.log_softmax(logits, -1)
    return logp, logp.exp()


def test_gnb_expectation_is_the_gauss_newton_trace(tiny) -> None:
    root, ref = tiny
    model = hv.load_model(root, dtype=torch.float64)
    params = _params(ref)
    logp, p = _token_losses(ref)
    N = logp.shape[0]
    exact = {}
    for t, ps in params.items():  # tr(G_T) = Σ_t Σ_v p_tv ‖∇_T ℓ_{t,v}‖² / N
        total = 0.0
        for i in range(N):
            for v in range(VOCAB):
                gs = torch.autograd.grad(-logp[i, v], ps, retain_graph=True)
                total += float(p[i, v].detach()) * sum(float(g.pow(2).sum()) for g in gs)
        exact[t] = total / N / sum(q.numel() for q in ps)
    expected = dict.fromkeys([*exact, "Emb_out"], 0.0)
    s = sh.embedding_scale(model, IDS)
    for y0, y1 in itertools.product(range(VOCAB), repeat=2):
        draw = sh.gnb_draw(model, IDS, sh.SampledNextToken(0, labels={0: [y0], 1: [y1]}), s)
        weight = float(p[0, y0] * p[1, y1])
        for t in expected:
            expected[t] += weight * draw[t]
    for t in exact:
        assert expected[t] == pytest.approx(exact[t], rel=REL), t
    V, d = model.head.embedding.shape  # the unembedding copy alone: its closed-form trace
    out = sh.unembedding_trace(*sh.head_states(model, IDS)) / (V * d)
    assert expected["Emb_out"] == pytest.approx(out, rel=REL)


def test_sampled_labels_follow_the_seed(tiny) -> None:
    model = hv.load_model(tiny[0], dtype=torch.float64)
    a = sh.gnb_draw(model, IDS, sh.SampledNextToken(3))
    b = sh.gnb_draw(model, IDS, sh.SampledNextToken(3))
    assert a == b and set(a) == {"Emb", "Emb_out", "QK", "FFN", "VO", "Norm"}


def test_type_traces_against_double_backward(tiny) -> None:
    root, ref = tiny
    model = hv.load_model(root, dtype=torch.float64)
    names = tuple(n for n in model.names if sh.block_type(n) is not None)
    res = hv.model_hessian(model, IDS, "next_token", wrt=names)
    sizes = {t: sum(res.param_size(n) for n in ns) for t, ns in sh.types_of(names).items()}
    eye = {t: torch.eye(m, dtype=torch.float64) for t, m in sizes.items()}
    q = sh.type_quadratic_forms(res, "full", eye, columns=64)
    loss = ref(IDS, labels=IDS).loss
    params = _params(ref)
    for t in ("QK", "Norm"):
        ps = params[t]
        grads = torch.autograd.grad(loss, ps, create_graph=True)
        trace = 0.0
        for g, prm in zip(grads, ps):
            flat = g.reshape(-1)
            for i in range(flat.numel()):
                trace += float(torch.autograd.grad(flat[i], prm, retain_graph=True)[0].reshape(-1)[i])
        assert float(q[t].sum()) == pytest.approx(trace, rel=REL, abs=1e-12), t


def test_run_writes_both_metrics(tiny, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    st = sh.run(tiny[0], out, 2, 2, draws=2, probes=2, log=lambda s: None, ids=IDS, dtype=torch.float64)
    got = json.loads(out.read_text())
    assert got["gnb"].keys() == {"Emb", "Emb_out", "QK", "FFN", "VO", "Norm"}
    assert all(len(v) == 2 for v in got["gnb"].values())
    assert got["exact"]["full"].keys() == got["exact"]["outer"].keys() == {"QK", "FFN", "VO", "Norm"}
    assert got["exact"]["emb_out_top"] > 0 and st["exact"]["emb_out_trace_over_size"] > 0


def test_the_claim_reads_the_run_and_judges_each_metric(tiny, tmp_path: Path, monkeypatch) -> None:
    from hessviz.experiments import llm

    folder = tmp_path / "tiny"
    sh.run(tiny[0], folder / "sharpness.json", 2, 2, 2, 2, log=lambda s: None, ids=IDS, dtype=torch.float64)
    monkeypatch.setattr(llm, "stored", lambda model: folder)
    result = llm.sharpness_claim("tiny").run()
    m = result.measured
    assert result.id == "sharpness_metrics_tiny"
    for metric in ("gnb", "outer", "full"):
        S = {t: m[f"S_{t}_{metric}"] for t in sh.ORDER}
        assert m[f"relations_holding_{metric}"] == sum(llm.relations(S))
    assert result.holds == llm.sharpness_claim("tiny").judge(m).holds
    assert "pending" in result.note  # no per-tensor table stored for it: the top-eigenvalue metric waits
