"""The Gemma family (``MODEL.md`` part 5) against ``transformers``' own ``Gemma3ForCausalLM`` and
``Gemma2ForCausalLM``: tiny random models, saved as folders (``save_pretrained``: safetensors) and read as
model objects, in float64 with ``transformers``' float32 round-trips taken out (``tests/gemma_reference.py``).

For both: every layer's input and output and the next-token loss (Gemma 2's final logits soft-capped), on a
text longer than the sliding window (window 3, 9 tokens: the window is exact where it cuts); whole-model
products ``H v`` against double backward; one layer's dense Hessian against the reference's, row by row;
each layer's own window and rotary base; the ``1 + w`` norms and the ``√d`` embeddings; and the
``CheckpointError`` of what is not computed.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import hessviz as hv
from hessviz import pretrained as pt
from hessviz.errors import CheckpointError
from hessviz.losses import NextToken
from tests import gemma_reference as ref
from tests.test_pretrained import randomise

transformers = pytest.importorskip("transformers")

VOCAB, D, HEADS, KV, DK, FF, LAYERS, WINDOW = 48, 16, 4, 2, 8, 24, 3, 3
IDS = torch.tensor([2, 17, 5, 29, 11, 40, 38, 7, 21])
ROUND_OFF = 1e-12
KINDS = ["sliding_attention", "full_attention", "sliding_attention"]


def _config(family: str):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=FF,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        head_dim=DK,
        max_position_embeddings=32,
        rms_norm_eps=1e-6,
        sliding_window=WINDOW,
        layer_types=KINDS,
        query_pre_attn_scalar=6,
        tie_word_embeddings=True,
    )
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            **common,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
            },
        )
    return transformers.Gemma2Config(
        **common,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0},
        attn_logit_softcapping=2.0,  # small caps, so both act on the random model's scores and logits
        final_logit_softcapping=1.5,
    )


CLASSES = {"gemma3": "Gemma3ForCausalLM", "gemma2": "Gemma2ForCausalLM"}


@pytest.fixture(scope="module", params=list(CLASSES))
def folder(request, tmp_path_factory):
    """``(family, folder)``: a random model of the family saved with ``save_pretrained``."""
    torch.manual_seed(0)
    model = getattr(transformers, CLASSES[request.param])(_config(request.param))
    randomise(model, seed=1)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, path


def _reference(family: str, path, monkeypatch):
    model = getattr(transformers, CLASSES[family]).from_pretrained(
        path, dtype=torch.float64, attn_implementation="eager"
    )
    return ref.exact(model, monkeypatch)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_layers_and_loss_match_transformers(folder, monkeypatch):
    """Each layer's config (window and rotary base per kind), every hidden state through a window shorter
    than the text, and the next-token loss, from the folder and from the model object alike."""
    family, path = folder
    model = _reference(family, path, monkeypatch)
    for source in (path, model):
        cfgs = [pt.load_layer(source, i)[0] for i in range(LAYERS)]
        assert [c.window for c in cfgs] == [WINDOW, None, WINDOW]
        thetas = (10.0, 1000.0, 10.0) if family == "gemma3" else (100.0,) * 3
        assert tuple(c.rope_theta for c in cfgs) == thetas
        assert {(c.norm, c.norm_type, c.mlp, c.activation, c.attn_scale) for c in cfgs} == {
            ("peri", "rmsnorm", "gated", "gelu_tanh", 6**-0.5)
        }
        assert {c.softcap for c in cfgs} == ({None} if family == "gemma3" else {2.0})
        assert cfgs[0].qk_norm == (family == "gemma3")
    with torch.no_grad():
        out = model(input_ids=IDS[None], output_hidden_states=True)
    states = pt.hidden_states(path, IDS)
    for i in range(LAYERS):  # transformers' last hidden state is after the final norm
        assert _rel(states[i], out.hidden_states[i][0]) <= ROUND_OFF, i
    hv_model = hv.load_model(path)
    assert hv_model.cfg.layer_values("window") == (WINDOW, None, WINDOW)
    loss = NextToken(states[-1], IDS, hv_model.head)
    expected = torch.nn.functional.cross_entropy(out.logits[0, :-1], IDS[1:])
    assert abs(float(loss.value) - float(expected)) <= ROUND_OFF * float(expected)
    assert hv_model.head.softcap == (None if family == "gemma3" else 1.5)
    res = hv.model_hessian(hv.load_model(model), IDS, wrt=("l0.W_V",))
    assert abs(float(res.value) - float(expected)) <= ROUND_OFF * float(expected)


def test_norms_scale_by_one_plus_w_and_embeddings_by_sqrt_d(folder, monkeypatch):
    family, path = folder
    model = _reference(family, path, monkeypatch)
    state = model.state_dict()
    _, params = pt.load_layer(path, 1)
    for name in ("ln1_gamma", "ln1_out_gamma", "ln2_gamma", "ln2_out_gamma"):
        assert torch.equal(params[name], 1 + state[f"model.layers.1.{ref.HF_KEYS[name]}"])
    assert torch.equal(params["W_O"], state["model.layers.1.self_attn.o_proj.weight"].T)
    X0 = pt.hidden_states(path, IDS, upto=0)[0]
    assert torch.equal(
        X0, state["model.embed_tokens.weight"][IDS] * torch.tensor(D**0.5, dtype=torch.float64)
    )
    head = hv.load_model(path).head
    assert torch.equal(head.gamma, 1 + state["model.norm.weight"])


def test_whole_model_products_match_double_backward(folder, monkeypatch):
    """``H v`` of the next-token loss (through Gemma 2's final cap) in weights of every kind of layer:
    heads, the four norms, QK-norm, the gate, against double backward through ``transformers``."""
    family, path = folder
    model = _reference(family, path, monkeypatch)
    wrt = [
        "l0.W_Q[1]",
        "l0.ln1_out_gamma",
        "l1.W_K",
        "l1.ln2_gamma",
        "l2.W_G",
        "l2.ln2_out_gamma",
        "l2.W_O[3]",
    ]
    if family == "gemma3":
        wrt += ["l1.q_norm_gamma", "l2.k_norm_gamma"]
    res = hv.model_hessian(hv.load_model(path), IDS, wrt=tuple(wrt))
    v = torch.randn(res.size, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = res.matvec(v)
    offsets = res.cfg.offsets(res.names)
    for j in range(v.shape[1]):
        expected = ref.products(model, IDS, res.names, DK, v[:, j], offsets)
        assert _rel(got[:, j], expected) <= 1e-10, j


def test_one_layers_dense_hessian_matches_the_reference(folder, monkeypatch):
    """Layer 1's dense Hessian (a head of each projection, its norms, part of the feed-forward) of the
    whole model's next-token loss: every row against double backward through ``transformers``."""
    family, path = folder
    model = _reference(family, path, monkeypatch)
    wrt = ("l1.ln1_gamma", "l1.W_Q[2]", "l1.W_V", "l1.ln1_out_gamma", "l1.W_2", "l1.ln2_out_gamma")
    res = hv.model_hessian(hv.load_model(path), IDS, wrt=wrt)
    H = res.operator("full").dense()
    offsets = res.cfg.offsets(res.names)
    eye = torch.eye(res.size, dtype=torch.float64)
    rows = torch.stack([ref.products(model, IDS, res.names, DK, eye[:, k], offsets) for k in range(res.size)])
    assert _rel(H, rows) <= 1e-10
    assert _rel(H, H.T) <= 1e-13


def test_text_within_the_window_equals_full_attention(folder):
    """The window cuts only texts longer than it: on ``WINDOW`` tokens a local layer is the global one."""
    _, path = folder
    cfg, params, X = pt.layer_for_text(path, IDS[:WINDOW], 0)
    assert cfg.window == WINDOW
    Z = hv.forward(cfg, params, X)
    assert torch.allclose(Z, hv.forward(dataclasses.replace(cfg, window=None), params, X), rtol=0, atol=1e-13)
    cfg, params, X = pt.layer_for_text(path, IDS, 0)
    far = hv.forward(dataclasses.replace(cfg, window=None), params, X)
    assert not torch.allclose(hv.forward(cfg, params, X), far)


def _edited(path, tmp_path, **changes):
    out = tmp_path / "edited"
    out.mkdir()
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (out / "config.json").write_text(json.dumps(config))
    (out / "model.safetensors").symlink_to(path / "model.safetensors")
    return out


@pytest.mark.parametrize(
    "changes, match",
    [
        (
            {"rope_parameters": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}},
            "rope_type 'linear'",
        ),
        ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer_types"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
        ({"sliding_window": "512"}, "sliding_window"),
    ],
)
def test_what_is_not_computed_is_refused_by_name(folder, tmp_path, changes, match):
    family, path = folder
    if family == "gemma2" and "rope_type" in str(changes):
        changes = {"rope_parameters": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e4}}
    with pytest.raises(CheckpointError, match=match):
        pt.load_layer(_edited(path, tmp_path, **changes), 0)


def test_gemma3_with_soft_capping_is_refused(folder, tmp_path):
    family, path = folder
    if family != "gemma3":
        pytest.skip("Gemma 2 computes its soft-capping")
    with pytest.raises(CheckpointError, match="final_logit_softcapping = 30"):
        pt.load_layer(_edited(path, tmp_path, final_logit_softcapping=30.0), 0)
