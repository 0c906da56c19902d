"""``MODEL.md`` part 4, "More sources": model objects in memory and GGUF files.

* ``transformers`` model objects (tiny random GPT-2, Llama, Qwen2, BERT; nothing written to disk)
  against double-backward products through the object itself;
* ``torch.nn.TransformerEncoderLayer`` against double backward through the module (float64, 1e-12);
* GGUF files written here with ``gguf.GGUFWriter``: a good one loads (Q/K rows turned back from
  llama.cpp's order), and every bad one is one ``CheckpointError`` naming what is wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import hessviz as hv
from hessviz.errors import CheckpointError, InputError
from tests.test_pretrained import randomise

transformers = pytest.importorskip("transformers")

D, HEADS, FF, VOCAB, POSITIONS = 12, 3, 20, 30, 16
TIGHT, LOOSE = 1e-10, 1e-6
IDS = torch.tensor([[3, 17, 5, 29, 11, 2], [7, 1, 22, 9, 14, 4]])


def tiny(cls: str, seed: int, **extra) -> torch.nn.Module:
    """A tiny random ``transformers`` model in float64, in eval mode."""
    if cls.startswith("GPT2"):
        config = transformers.GPT2Config(
            vocab_size=VOCAB,
            n_embd=D,
            n_layer=2,
            n_head=HEADS,
            n_inner=FF,
            n_positions=POSITIONS,
            activation_function="gelu_new",
            **extra,
        )
    elif cls.startswith("Bert"):
        config = transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            intermediate_size=FF,
            max_position_embeddings=POSITIONS,
            **extra,
        )
    else:
        family = "Qwen2" if cls.startswith("Qwen2") else "Llama"
        config = getattr(transformers, f"{family}Config")(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=FF,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            num_key_value_heads=HEADS,
            max_position_embeddings=POSITIONS,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            **extra,
        )
    config._attn_implementation = "eager"  # double backward on CPU
    model = getattr(transformers, cls)(config)
    randomise(model, seed=seed)
    return model.to(torch.float64).eval()


def hvp_through(
    obj: torch.nn.Module, model: hv.Model, names: tuple[str, ...], offsets: dict, loss_of, v: torch.Tensor
) -> torch.Tensor:
    """``H v`` by double backward of ``loss_of(obj)`` in the object's parameters that hold ``names``
    (whole matrices and γ: the family's table says which tensor and whether it is transposed)."""
    params = dict(obj.named_parameters())
    where = {}
    for n in names:
        layer, local = n.split(".", 1)
        src = model.family.layer_sources(int(layer[1:]))[local]
        where[n] = (src.key, (lambda T: T.T) if src.transpose else (lambda T: T))
    keys = sorted({k for k, _ in where.values()})
    tangents = {k: torch.zeros_like(params[k]) for k in keys}
    for n in names:
        key, view = where[n]
        view(tangents[key]).copy_(v[offsets[n]].reshape(view(tangents[key]).shape))
    with sdpa_kernel(SDPBackend.MATH):
        grads = torch.autograd.grad(loss_of(obj), [params[k] for k in keys], create_graph=True)
        dot = sum((g * tangents[k]).sum() for g, k in zip(grads, keys))
        out = dict(zip(keys, torch.autograd.grad(dot, [params[k] for k in keys])))
    return torch.cat([where[n][1](out[where[n][0]]).reshape(-1) for n in names])


def check(obj, ids, objective, wrt, loss_of, tol):
    model = hv.load_model(obj)
    res = hv.model_hessian(
        model, ids, objective=objective(model) if callable(objective) else objective, wrt=wrt
    )
    with torch.no_grad():
        assert abs(float(res.value) - float(loss_of(obj))) <= tol * abs(float(res.value))
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(res.size, generator=gen, dtype=torch.float64)
    ref = hvp_through(obj, model, res.names, res.cfg.offsets(res.names), loss_of, v)
    assert float((res.matvec(v) - ref).norm() / ref.norm()) <= tol
    return model


def next_token(obj, ids):
    logits = obj(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def test_llama_object_next_token_matches_double_backward_through_it():
    obj = tiny("LlamaForCausalLM", 1)
    ids = IDS[:1]
    check(obj, ids, "next_token", ("l0.W_Q", "l1.W_G", "l0.ln2_gamma"), lambda m: next_token(m, ids), LOOSE)


def test_gpt2_classifier_object_gives_its_score_head():
    obj = tiny("GPT2ForSequenceClassification", 2, num_labels=3, pad_token_id=0)
    labels = torch.tensor([2, 0])
    check(
        obj,
        IDS,
        lambda m: m.classifier(labels),
        ("l1.W_2", "l1.ln2_gamma"),
        lambda m: torch.nn.functional.cross_entropy(m(input_ids=IDS).logits, labels),
        TIGHT,
    )


def test_qwen2_classifier_object_matches_double_backward_through_it():
    obj = tiny("Qwen2ForSequenceClassification", 3, num_labels=2, pad_token_id=0)
    labels = torch.tensor([1, 0])
    model = check(
        obj,
        IDS,
        lambda m: m.classifier(labels),
        ("l0.W_K", "l1.W_1"),
        lambda m: torch.nn.functional.cross_entropy(m(input_ids=IDS).logits, labels),
        LOOSE,
    )
    with pytest.raises(InputError, match="LM head"):  # untied, no lm_head: refused
        hv.model_hessian(model, IDS, "next_token")


def test_bert_classifier_object_layers_match_and_its_pooler_is_named():
    obj = tiny("BertForSequenceClassification", 4, num_labels=2)
    gen = torch.Generator().manual_seed(3)
    head = hv.Classifier(
        torch.randn(D, 2, generator=gen, dtype=torch.float64),
        torch.zeros(2, dtype=torch.float64),
        [1, 0],
        "cls",
    )
    model = check(
        obj,
        IDS,
        head,
        ("l1.W_1", "l0.ln1_gamma"),
        lambda m: torch.nn.functional.cross_entropy(
            m.bert(input_ids=IDS).last_hidden_state[:, 0] @ head.W + head.b, head.labels
        ),
        TIGHT,
    )
    with pytest.raises(CheckpointError, match="pooler"):
        model.classifier([0, 1])


def test_an_object_is_read_where_it_is_and_copied_at_each_load():
    obj = tiny("LlamaModel", 5)
    _, before = hv.load_layer(obj, 1)
    with torch.no_grad():
        obj.layers[1].mlp.up_proj.weight.add_(1.0)
    _, after = hv.load_layer(obj, 1)
    assert torch.equal(after["W_1"], before["W_1"] + 1.0)  # seen by a new load only
    assert torch.equal(after["W_1"], obj.layers[1].mlp.up_proj.weight.detach().T)


def test_bad_objects_get_one_clear_error():
    obj = tiny("LlamaForCausalLM", 6, attention_dropout=0.1)
    with pytest.raises(CheckpointError, match=r"training mode .*model.eval\(\)"):
        hv.load_model(obj.train())
    hv.load_model(obj.eval())  # eval(): fine
    with pytest.raises(CheckpointError, match="source must be"):
        hv.load_model(torch.nn.Linear(2, 2))
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(obj.config)
    with pytest.raises(CheckpointError, match="meta device"):
        hv.load_model(meta.eval())
    odd = tiny("LlamaForCausalLM", 7, rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(CheckpointError, match="rope_type 'linear'"):
        hv.load_model(odd)
    with pytest.raises(CheckpointError, match="no tokenizer"):
        hv.layer_inputs(obj, "a text", 0)


# ------------------------------------------------------------------ torch.nn.TransformerEncoderLayer


@pytest.mark.parametrize("norm_first, activation, bias", [(False, "relu", True), (True, "gelu", False)])
def test_encoder_layer_matches_double_backward_through_the_module(norm_first, activation, bias):
    torch.manual_seed(0)
    L, d = 5, 8
    layer = torch.nn.TransformerEncoderLayer(
        d,
        2,
        dim_feedforward=12,
        dropout=0.1,
        activation=activation,
        layer_norm_eps=1e-5,
        batch_first=True,
        norm_first=norm_first,
        bias=bias,
        dtype=torch.float64,
    )
    with pytest.raises(CheckpointError, match="dropout"):
        hv.load_layer(layer, 0, seq_len=L)
    layer.eval()
    for p in layer.parameters():  # γ, β away from 1, 0
        torch.nn.init.normal_(p, std=0.4)
    cfg, params = hv.load_layer(layer, 0, seq_len=L)
    assert cfg.norm == ("pre" if norm_first else "post") and cfg.activation == activation
    X = torch.randn(L, d, dtype=torch.float64)
    Y = torch.randn(L, d, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(hv.forward(cfg, params, X), layer(X[None])[0], atol=1e-12, rtol=0)
    res = hv.hessian(cfg, params, X, Y)
    names = [n for n in cfg.param_names if n in ("W_Q", "W_1", "ln2_gamma")]
    leaves = {
        "W_Q": layer.self_attn.in_proj_weight,
        "W_1": layer.linear1.weight,
        "ln2_gamma": layer.norm2.weight,
    }
    views = {"W_Q": lambda T: T[:d].T, "W_1": lambda T: T.T, "ln2_gamma": lambda T: T}
    offsets = cfg.offsets(cfg.param_names)
    v = torch.randn(cfg.num_params, dtype=torch.float64)
    for n in cfg.param_names:
        if n not in names:
            v[offsets[n]] = 0.0
    with sdpa_kernel(SDPBackend.MATH):
        loss = ((layer(X[None])[0] - Y) ** 2).sum() / (L * d)
        value = float(loss.detach())
        assert abs(value - float(hv.loss(cfg, params, X, Y))) <= 1e-12 * value
        grads = torch.autograd.grad(loss, [leaves[n] for n in names], create_graph=True)
        dot = sum((views[n](g) * v[offsets[n]].reshape(params[n].shape)).sum() for n, g in zip(names, grads))
        hvp = torch.autograd.grad(dot, [leaves[n] for n in names])
    ref = torch.cat([views[n](h).reshape(-1) for n, h in zip(names, hvp)])
    ours = torch.cat([(res.full @ v)[offsets[n]] for n in names])
    assert float((ours - ref).norm() / ref.norm()) <= 1e-12


def test_encoder_layer_is_for_load_layer_only():
    layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=12, dropout=0.0)
    with pytest.raises(CheckpointError, match="seq_len"):
        hv.load_layer(layer, 0)
    with pytest.raises(CheckpointError, match="only hv.load_layer"):
        hv.load_model(layer)


# ------------------------------------------------------------------ GGUF files written here

gguf = pytest.importorskip("gguf")
ARCH_D, ARCH_H, ARCH_KV, ARCH_FF, ARCH_V = 8, 2, 1, 12, 16


def write_gguf(path, *, arch="llama", extra=None, tensor_type=None):
    """A tiny two-layer ``arch`` GGUF file of random F32 weights; returns ``name -> array`` as written."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(32)
    w.add_embedding_length(ARCH_D)
    w.add_feed_forward_length(ARCH_FF)
    w.add_head_count(ARCH_H)
    w.add_head_count_kv(ARCH_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    for key, value in (extra or {}).items():
        w.add_float32(key, value) if isinstance(value, float) else w.add_string(key, value)
    dk = ARCH_D // ARCH_H
    shapes = {"token_embd.weight": (ARCH_V, ARCH_D), "output_norm.weight": (ARCH_D,)}
    for i in range(2):
        b = f"blk.{i}."
        shapes |= {
            b + "attn_norm.weight": (ARCH_D,),
            b + "ffn_norm.weight": (ARCH_D,),
            b + "attn_q.weight": (ARCH_D, ARCH_D),
            b + "attn_k.weight": (ARCH_KV * dk, ARCH_D),
            b + "attn_v.weight": (ARCH_KV * dk, ARCH_D),
            b + "attn_output.weight": (ARCH_D, ARCH_D),
            b + "ffn_gate.weight": (ARCH_FF, ARCH_D),
            b + "ffn_up.weight": (ARCH_FF, ARCH_D),
            b + "ffn_down.weight": (ARCH_D, ARCH_FF),
        }
    arrays = {}
    for name, shape in shapes.items():
        arrays[name] = rng.standard_normal(shape).astype(np.float32)
        if tensor_type is not None and name == "blk.1.ffn_up.weight":
            raw = np.zeros((ARCH_FF, 66), dtype=np.uint8)  # one 256-wide IQ2_XXS block a row
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=tensor_type)
        else:
            w.add_tensor(name, arrays[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


def test_a_gguf_file_loads_with_qk_rows_turned_back(tmp_path):
    arrays = write_gguf(tmp_path / "tiny.gguf")
    cfg, params = hv.load_layer(tmp_path / "tiny.gguf", 1, dtype=torch.float32)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.norm_type, cfg.rope) == (ARCH_H, ARCH_KV, "rmsnorm", True)
    dk = ARCH_D // ARCH_H

    def unpermute(a, heads):  # llama.cpp -> HF row order
        return a.reshape(heads, dk // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)

    assert np.array_equal(params["W_Q"].numpy(), unpermute(arrays["blk.1.attn_q.weight"], ARCH_H).T)
    assert np.array_equal(params["W_K"].numpy(), unpermute(arrays["blk.1.attn_k.weight"], ARCH_KV).T)
    assert np.array_equal(params["W_V"].numpy(), arrays["blk.1.attn_v.weight"].T)
    model = hv.load_model(tmp_path / "tiny.gguf")
    assert np.array_equal(model.head.embedding.numpy(), arrays["token_embd.weight"])  # tied: no output
    assert hv.pretrained.model_info(tmp_path / "tiny.gguf").n_layers == 2


@pytest.mark.parametrize(
    "case, match",
    [
        ("truncated", "truncated"),
        ("not gguf", "not a GGUF file"),
        ("arch", "general.architecture = 'gemma'"),
        ("type", "type IQ2_XXS"),
        ("sliding", "llama.attention.sliding_window"),
        ("rope", "llama.rope.scaling.type = 'yarn'"),
    ],
)
def test_every_bad_gguf_is_one_error_naming_it(tmp_path, case, match):
    path = tmp_path / f"{case.replace(' ', '_')}.gguf"
    if case == "not gguf":
        path.write_bytes(b"PK\x03\x04 not a model at all")
    elif case == "arch":
        write_gguf(path, arch="gemma")
    elif case == "type":
        write_gguf(path, tensor_type=gguf.GGMLQuantizationType.IQ2_XXS)
    elif case == "sliding":
        write_gguf(path, extra={"llama.attention.sliding_window": 4.0})
    elif case == "rope":
        write_gguf(path, extra={"llama.rope.scaling.type": "yarn"})
    else:
        write_gguf(path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=match) as info:
        hv.load_model(path)
    assert "\n" not in str(info.value)
    if case == "truncated":
        with pytest.raises(CheckpointError, match="header cannot be read|truncated"):
            path.write_bytes(path.read_bytes()[:40])
            hv.pretrained.model_info(path)
