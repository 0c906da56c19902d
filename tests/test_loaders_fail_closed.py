"""Loaders that fail closed: every malformed checkpoint file, made here and tiny, gets one
:class:`~hessviz.errors.CheckpointError` naming the file and what is wrong, and a shard index never
reaches a file outside its folder.

* ``config.json``: nesting too deep for Python's ``json`` (a raw ``RecursionError`` before), too large,
  not standard JSON, values of the wrong type, sizes no tensor backs;
* ``model.safetensors.index.json``: a ``weight_map`` of the wrong shape (raw ``AttributeError`` /
  ``TypeError`` before), shard names that leave the folder (``../outside.safetensors`` was loaded,
  ``/etc/passwd`` opened), refused before any shard is opened;
* ``tokenizer.json``: too large, too deep, not UTF-8;
* GGUF headers written byte by byte: bad version, counts, lengths and types (``gguf.GGUFReader`` loops
  forever on a count that runs past the end), and metadata of the wrong type.

Each bad file is a one-field change of a good one that loads (the first test of each group).
"""

from __future__ import annotations

import builtins
import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import hessviz as hv
from hessviz import pretrained as pt
from hessviz.errors import CheckpointError
from hessviz.pretrained import checkpoint, tokens
from hessviz.pretrained.bounded import shown

D, H, KV, FF, V, LAYERS = 8, 2, 1, 12, 16, 1
LLAMA = {
    "model_type": "llama",
    "hidden_size": D,
    "num_attention_heads": H,
    "num_key_value_heads": KV,
    "intermediate_size": FF,
    "num_hidden_layers": LAYERS,
    "vocab_size": V,
    "max_position_embeddings": 32,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}


def llama_tensors() -> dict[str, torch.Tensor]:
    """A one-layer Llama's tensors (``nn.Linear`` layout), seeded."""
    g = torch.Generator().manual_seed(0)
    dk = D // H
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    p = "model.layers.0."
    shapes |= {
        p + "input_layernorm.weight": (D,),
        p + "post_attention_layernorm.weight": (D,),
        p + "self_attn.q_proj.weight": (H * dk, D),
        p + "self_attn.k_proj.weight": (KV * dk, D),
        p + "self_attn.v_proj.weight": (KV * dk, D),
        p + "self_attn.o_proj.weight": (D, H * dk),
        p + "mlp.gate_proj.weight": (FF, D),
        p + "mlp.up_proj.weight": (FF, D),
        p + "mlp.down_proj.weight": (D, FF),
    }
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def folder_with(path: Path, config: dict | bytes | None = None, **change: object) -> Path:
    """A Llama checkpoint folder: ``config`` (default :data:`LLAMA` with ``change``; bytes as written)
    and one ``model.safetensors``."""
    path.mkdir()
    text = config if isinstance(config, bytes) else json.dumps({**(config or LLAMA), **change}).encode()
    (path / "config.json").write_bytes(text)
    save_file(llama_tensors(), str(path / "model.safetensors"))
    return path


def refused(source, match: str) -> str:
    """The one-line :class:`CheckpointError` that opening ``source`` raises, checked against ``match``."""
    with pytest.raises(CheckpointError, match=match) as info:
        pt.model_info(source)
    message = str(info.value)
    assert "\n" not in message and len(message) < 600, message
    return message


# ------------------------------------------------------------------------------------------ config.json


def test_the_good_folder_loads(tmp_path):
    cfg, params = hv.load_layer(folder_with(tmp_path / "good"), 0, dtype=torch.float32)
    assert (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff) == (D, H, KV, FF)
    assert torch.equal(params["W_Q"], llama_tensors()["model.layers.0.self_attn.q_proj.weight"].T)


@pytest.mark.parametrize(
    "text, match",
    [
        (
            b'{"model_type": "llama", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "nests 100001 levels deep",
        ),
        (b"[" * 65 + b"]" * 65, "nests 65 levels deep"),
        (b'{"model_type": "llama", "rms_norm_eps": NaN}', r"not valid JSON \(NaN is not a JSON number"),
        (b'{"model_type": "llama", "rope_theta": 1e999}', "overflows to infinity"),
        (b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b'{"model_type": "\xff\xfe\xfa"}', "not valid JSON"),
        (b'{"model_type": "llama", ', "not valid JSON"),
        (b'["model_type", "llama"]', "must hold a JSON object, got list"),
    ],
    ids=["deep", "65-levels", "nan", "inf", "5000-digits", "not-utf8", "cut", "a-list"],
)
def test_a_config_that_is_no_bounded_json_object_is_refused(tmp_path, text, match):
    message = refused(folder_with(tmp_path / "bad", text), match)
    assert "config.json" in message


def test_brackets_inside_strings_do_not_count_as_depth(tmp_path):
    folder = folder_with(
        tmp_path / "ok", name_or_path='x"[[[' + "[" * 200 + "\\" + '"{{', note=[[[["deep"]]]]
    )
    assert pt.model_info(folder).d_model == D


def test_a_config_larger_than_its_cap_is_refused_before_parsing(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "CONFIG_BYTES", 1024)
    folder = folder_with(tmp_path / "big", json.dumps(LLAMA).encode() + b" " * 2048)
    refused(folder, "config.json is larger than")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"hidden_size": "8"}, "hidden_size must be an integer >= 1, got '8'"),
        ({"num_hidden_layers": 1.0}, "num_hidden_layers must be an integer"),
        ({"rms_norm_eps": [1e-5]}, r"rms_norm_eps must be a finite number >= 0, got \[1e-05\]"),
        ({"rms_norm_eps": 10**400}, "rms_norm_eps must be a finite number"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
        ({"attention_bias": 1}, "attention_bias must be true or false"),
        ({"hidden_act": ["silu"]}, r"hidden_act = \['silu'\] is not supported"),
        ({"rope_scaling": ["linear"]}, "rope_scaling must be one object"),
        ({"layer_types": 3}, "layer_types must be a list, got 3"),
        ({"model_type": ["llama"]}, r"model_type \['llama'\] is not supported"),
        ({"model_type": list(range(100_000))}, "model_type a list of 100000 items is not supported"),
    ],
)
def test_a_value_of_the_wrong_type_is_named(tmp_path, change, match):
    refused(folder_with(tmp_path / "typed", **change), "config.json: " + match)


@pytest.mark.parametrize(
    "change, match",
    [
        (
            {"hidden_size": 2**40},
            "the hidden size 1099511627776 is larger than every dimension .*largest is 16",
        ),
        ({"intermediate_size": 10**9}, "the feed-forward width 1000000000 is larger"),
        ({"vocab_size": 10**12}, "the vocabulary size 1000000000000 is larger"),
        ({"head_dim": 2**30}, "the heads × head width 2147483648 is larger"),
        ({"num_hidden_layers": 10**12}, "num_hidden_layers = 1000000000000, but the weights hold only 11"),
        ({"max_position_embeddings": 2**40}, "max_position_embeddings = 1099511627776 is beyond"),
    ],
)
def test_a_size_no_tensor_backs_is_refused_on_opening(tmp_path, change, match):
    """Before, these opened: ``model_info`` said "10¹² layers" and the app looped over them."""
    refused(folder_with(tmp_path / "huge", **change), "config.json: " + match)


def test_a_config_that_makes_no_block_is_a_checkpoint_error(tmp_path):
    """GPT-2 with one feature and ε = 0: LayerNorm of one feature divides by zero (``BlockConfig``'s
    ``ConfigError``, now named as the file's fault)."""
    path = tmp_path / "one_feature"
    path.mkdir()
    config = {"model_type": "gpt2", "n_embd": 1, "n_head": 1, "n_layer": 1, "n_positions": 4}
    (path / "config.json").write_text(json.dumps(config | {"vocab_size": 4, "layer_norm_epsilon": 0}))
    save_file({"wte.weight": torch.zeros(4, 1)}, str(path / "model.safetensors"))
    refused(path, "config.json describes no block hessviz computes: d_model must be >= 2")


# ------------------------------------------------------------------------- model.safetensors.index.json


def sharded(path: Path, weight_map: object) -> Path:
    """A folder with :data:`LLAMA`'s config, two shards of its tensors and an index of ``weight_map``
    (``None``: the true map)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(LLAMA))
    tensors = llama_tensors()
    names = sorted(tensors)
    true_map = {}
    for i, part in enumerate((names[:5], names[5:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(path / shard))
        true_map |= dict.fromkeys(part, shard)
    index = {"metadata": {}, "weight_map": true_map if weight_map is None else weight_map}
    (path / checkpoint.SAFETENSORS_INDEX).write_text(json.dumps(index))
    return path


class Opened:
    """Every path handed to ``open`` or to ``safetensors.safe_open`` while it records."""

    def __init__(self, monkeypatch):
        self.paths: list[Path] = []
        real_open, real_safe = builtins.open, checkpoint.safe_open

        def recording_open(file, *args, **kwargs):
            if isinstance(file, (str, Path)):
                self.paths.append(Path(file).resolve())
            return real_open(file, *args, **kwargs)

        def recording_safe_open(file, *args, **kwargs):
            self.paths.append(Path(file).resolve())
            return real_safe(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", recording_open)
        monkeypatch.setattr(checkpoint, "safe_open", recording_safe_open)

    def outside(self, folder: Path) -> list[Path]:
        return [p for p in self.paths if not p.is_relative_to(folder.resolve())]


def test_a_good_index_loads_its_shards_and_the_recorder_sees_them(tmp_path, monkeypatch):
    folder = sharded(tmp_path / "good", None)
    opened = Opened(monkeypatch)
    cfg, params = hv.load_layer(folder, 0, dtype=torch.float32)
    assert torch.equal(params["W_2"], llama_tensors()["model.layers.0.mlp.down_proj.weight"].T)
    assert folder.resolve() / "model-00002-of-00002.safetensors" in opened.paths
    assert opened.outside(folder) == []


@pytest.mark.parametrize(
    "weight_map, match",
    [
        ([1, 2], r"weight_map is a non-empty object .*got weight_map = \[1, 2\]"),
        ("model.safetensors", "got weight_map = 'model.safetensors'"),
        (None, "got weight_map = None"),
        ({}, r"got weight_map = \{\}"),
        ({"a": 3}, r"weight_map\['a'\] must be a shard file name, got 3"),
        ({"a": ["x.safetensors"]}, r"weight_map\['a'\] must be a shard file name, got \['x.safetensors'\]"),
    ],
)
def test_a_weight_map_of_the_wrong_shape_is_named(tmp_path, weight_map, match):
    folder = sharded(tmp_path / "bad", {"placeholder": "x"})
    index = folder / checkpoint.SAFETENSORS_INDEX
    index.write_text(json.dumps({"weight_map": weight_map} if weight_map is not None else {"other": 1}))
    refused(folder, "model.safetensors.index.json.*" + match)
    index.write_text('["weight_map"]')
    refused(folder, "got a JSON list")
    index.write_text('{"weight_map": ' + "{" * 1000)
    refused(folder, "model.safetensors.index.json nests 1001 levels deep")


@pytest.mark.parametrize(
    "name",
    [
        "../outside.safetensors",
        "{outside}",
        "/etc/passwd",
        "sub/../../outside.safetensors",
        "sub/model.safetensors",
        "..\\outside.safetensors",
        "model.bin",
        "config.json",
    ],
)
def test_a_shard_outside_the_folder_is_refused_before_anything_is_opened(tmp_path, monkeypatch, name):
    """The outside file is a real safetensors file of the right tensors (it loaded before); the
    folder's own shard is there too, so only the name decides."""
    outside = tmp_path / "outside.safetensors"
    save_file(llama_tensors(), str(outside))
    folder = sharded(tmp_path / "ckpt", None)
    (folder / "sub").mkdir()
    name = name.format(outside=outside)
    index = json.loads((folder / checkpoint.SAFETENSORS_INDEX).read_text())
    index["weight_map"]["model.embed_tokens.weight"] = name
    (folder / checkpoint.SAFETENSORS_INDEX).write_text(json.dumps(index))
    opened = Opened(monkeypatch)
    message = refused(folder, "a shard must be a \\*.safetensors file in the folder itself")
    assert shown(name) in message
    assert opened.outside(folder) == []
    assert not [p for p in opened.paths if p.suffix == ".safetensors"]  # no shard either
    assert opened.paths == [(folder / checkpoint.SAFETENSORS_INDEX).resolve()]


def test_a_shard_that_is_a_symlink_still_loads(tmp_path):
    """The Hugging Face cache keeps each file of a snapshot as a symlink into ``blobs/``: the folder's
    own link is followed, as a linked ``model.safetensors`` is."""
    folder = sharded(tmp_path / "snapshot", None)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    shard = folder / "model-00001-of-00002.safetensors"
    shard.rename(blobs / "abc123")
    shard.symlink_to(blobs / "abc123")
    assert pt.model_info(folder).d_model == D


def test_missing_shards_are_listed_briefly(tmp_path):
    folder = sharded(tmp_path / "missing", {f"t{i}": f"gone-{i}.safetensors" for i in range(1000)})
    message = refused(folder, "lists 1000 shard\\(s\\) that are not in the folder: gone-0.safetensors")
    assert message.endswith("…")


# ---------------------------------------------------------------------------------------- tokenizer.json


def word_tokenizer() -> bytes:
    """A word-level ``tokenizer.json`` of the vocabulary ``t0 … t15``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str().encode()


@pytest.mark.parametrize(
    "text, match",
    [
        (b"[" * 100_000 + b"]" * 100_000, "is not a readable tokenizer.json"),
        (b'{"model": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001, "recursion limit exceeded"),
        (b"\xff\xfe{}", "is not a readable tokenizer.json"),
        (None, "is larger than 0 MiB"),
    ],
    ids=["deep-list", "deep-object", "not-utf8", "too-large"],
)
def test_a_bad_tokenizer_is_one_error(tmp_path, monkeypatch, text, match):
    folder = folder_with(tmp_path / "tok")
    (folder / "tokenizer.json").write_bytes(word_tokenizer())
    assert pt.token_ids(folder, "t3 t5 t7") == [3, 5, 7]
    if text is None:
        monkeypatch.setattr(tokens, "TOKENIZER_BYTES", 1024)
        text = word_tokenizer() + b" " * 2048
    (folder / "tokenizer.json").write_bytes(text)
    with pytest.raises(CheckpointError, match=match) as info:
        pt.token_ids(folder, "t3 t5 t7")
    assert "tokenizer.json" in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------ GGUF headers


def gguf_string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def gguf_file(path: Path, *, version=3, n_tensors=None, n_keys=None, keys=(), tensors=()) -> Path:
    """A GGUF file from raw parts: ``keys`` are encoded ``(name, type id, value bytes)``, ``tensors``
    ``(name, dims, type id, offset)``; the counts default to the parts' lengths."""
    out = b"GGUF" + struct.pack(
        "<IQQ",
        version,
        len(tensors) if n_tensors is None else n_tensors,
        len(keys) if n_keys is None else n_keys,
    )
    for name, kind, value in keys:
        out += gguf_string(name) + struct.pack("<I", kind) + value
    for name, dims, kind, offset in tensors:
        out += gguf_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset)
    path.write_bytes(out)
    return path


ARCH = ("general.architecture", 8, gguf_string("llama"))


@pytest.mark.parametrize(
    "parts, match",
    [
        ({"version": 7}, "version 7 is not read"),
        ({"n_keys": 2**63}, "9223372036854775808 metadata keys"),
        ({"n_tensors": 2**40}, "1099511627776 tensors"),
        ({"n_keys": 5000}, "past the end of the file"),
        (
            {"keys": [("x" * 10, 8, struct.pack("<Q", 2**62))]},
            "key 'xxxxxxxxxx' needs 4611686018427387904 bytes",
        ),
        (
            {"keys": [ARCH, ("a", 9, struct.pack("<IQ", 0, 2**62))]},
            "4611686018427387904 items, more than the 1048576",
        ),
        ({"keys": [ARCH, ("a", 9, struct.pack("<IQ", 0, 1000))]}, r"key 'a' \(1000 items\) needs 1000 bytes"),
        (
            {"keys": [("a", 9, struct.pack("<IQ", 8, 3) + gguf_string("ok") + struct.pack("<Q", 2**40))]},
            "item 1 of key 'a' needs 1099511627776 bytes",
        ),
        ({"keys": [("a", 9, struct.pack("<IQ", 9, 1))]}, "key 'a' is an array of arrays"),
        ({"keys": [("a", 99, b"")]}, "key 'a' has unknown type id 99"),
        ({"keys": [("a", 9, struct.pack("<IQ", 42, 1))]}, "key 'a' has items of unknown type id 42"),
        ({"keys": [(b"k" * 70_000, 4, b"\0" * 4)]}, "70000 bytes long, more than the 65535"),
        (
            {"keys": [("general.alignment", 4, struct.pack("<I", 3))]},
            "general.alignment = 3 is not a power of two",
        ),
        ({"tensors": [("w", (4, 4, 4, 4, 4), 0, 0)]}, "tensor 'w' has 5 dimensions"),
        ({"tensors": [("w", (4,), 999, 0)]}, "tensor 'w' has unknown type id 999"),
        ({"tensors": [("w", (2**62, 2**62), 0, 0)]}, "tensor 'w' ends at byte .* the GGUF file is truncated"),
        ({"tensors": [("w", (4,), 0, 2**63)]}, "tensor 'w' ends at byte"),
        ({"keys": [ARCH, ARCH]}, "key 'general.architecture' appears twice"),
        ({"keys": [(b"\xffk", 4, b"\0" * 4)]}, "the name of key 0 is not UTF-8 text"),
        ({"keys": [("general.alignment", 8, gguf_string("32"))]}, "general.alignment = '32' is not a power"),
        ({"keys": [ARCH, ("general.name", 8, gguf_string(b"\xc3("))]}, "key 'general.name' is not UTF-8"),
        ({"tensors": [("w", (4,), 0, 0), ("w", (4,), 0, 0)]}, "tensor 'w' appears twice"),
    ],
)
def test_a_bad_gguf_header_is_one_error(tmp_path, parts, match):
    """Each file is a few bytes that claim far more; ``gguf.GGUFReader`` alone would loop over the
    claimed counts (forever, where a count runs past the end) before any error."""
    pytest.importorskip("gguf")
    path = gguf_file(tmp_path / "bad.gguf", **parts)
    message = refused(path, "GGUF header: .*" + match)
    assert str(path) in message


TOKENS = ["a", "b", "ab"] + [f"t{i}" for i in range(3, V)]


def write_llama_gguf(path: Path, **override: object) -> None:
    """A one-layer Llama GGUF file with a byte-level BPE vocabulary (``a``, ``b``, the merge ``ab``)
    through ``gguf.GGUFWriter``; ``override`` sets a key to a value of another type (a string, a list)."""
    gg = pytest.importorskip("gguf")
    w = gg.GGUFWriter(str(path), "llama")
    values = {
        "llama.block_count": 1,
        "llama.context_length": 32,
        "llama.embedding_length": D,
        "llama.feed_forward_length": FF,
        "llama.attention.head_count": H,
        "llama.attention.head_count_kv": KV,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.freq_base": 10000.0,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.merges": ["a b"],
    } | override
    for key, value in values.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    short = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "model.layers.0.": "blk.0.",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for key, t in llama_tensors().items():
        for long, name in short.items():
            key = key.replace(long, name)
        w.add_tensor(key, t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize(
    "override, match",
    [
        ({"llama.block_count": "1"}, "GGUF key llama.block_count must be one integer .*got '1'"),
        ({"llama.feed_forward_length": [FF]}, r"llama.feed_forward_length must be one integer .*got \[12\]"),
        ({"llama.rope.freq_base": "ten thousand"}, "llama.rope.freq_base must be one number"),
        ({"llama.attention.layer_norm_rms_epsilon": "1e-5"}, "layer_norm_rms_epsilon must be one number"),
        ({"general.architecture": "l" * 500}, "general.architecture = 'llllllll.*… is not supported"),
    ],
)
def test_gguf_metadata_of_the_wrong_type_is_named(tmp_path, override, match):
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path)
    info = pt.model_info(path)
    assert (info.n_layers, info.d_model, info.vocab_size) == (1, D, V)
    bad = tmp_path / "bad.gguf"
    write_llama_gguf(bad, **override)
    refused(bad, match)


@pytest.mark.parametrize(
    "override, match",
    [
        (
            {"tokenizer.ggml.tokens": [1, 2]},
            r"tokenizer.ggml.tokens must be an array of strings, got \[1, 2\]",
        ),
        ({"tokenizer.ggml.merges": ["a b c"]}, "merges item 0 is 'a b c', not two tokens"),
        ({"tokenizer.ggml.merges": ["x y"]}, "make no BPE tokenizer .*Token `x` out of vocabulary"),
        ({"tokenizer.ggml.token_type": ["1"]}, "tokenizer.ggml.token_type must be an array of integers"),
        (
            {"tokenizer.ggml.tokens": [b"\xff"] + TOKENS[1:]},
            "item 0 of key 'tokenizer.ggml.tokens' is not UTF-8 text",
        ),
        ({"tokenizer.ggml.pre": ["llama3"]}, None),  # not a name it knows: GPT-2's split, as before
    ],
)
def test_a_gguf_vocabulary_of_the_wrong_type_is_named(tmp_path, override, match):
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path)
    assert pt.token_ids(path, "ab a") == [2, 0]
    bad = tmp_path / "bad.gguf"
    write_llama_gguf(bad, **override)
    assert pt.model_info(bad).vocab_size == V  # the vocabulary is read only for a text
    if match is None:
        assert pt.token_ids(bad, "ab a") == [2, 0]
        return
    with pytest.raises(CheckpointError, match=match) as info:
        pt.token_ids(bad, "ab a")
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------------- app


@pytest.mark.slow  # the page draws its default model first (~9 s)
def test_the_app_shows_a_deep_config_as_one_line(tmp_path):
    """The Real model page's folder box (local profile) with a config nested 100,000 deep: the
    library's one line in the page's error box, no traceback."""
    pytest.importorskip("streamlit")
    from tests.test_app_pages import run_page

    folder = folder_with(tmp_path / "deep", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    at = run_page("pages/real_model.py", rm_model="pydoc-postln", rm_text="def f(x):", rm_rows="1")
    at.selectbox(key="rm_model").set_value("a local folder…").run()
    at.text_input(key="rm_folder").set_value(str(folder)).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("nests 100001 levels deep" in e.value for e in at.error), [e.value for e in at.error]
