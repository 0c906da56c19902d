"""A GGUF file (llama.cpp's format) as a checkpoint: its metadata as a Hugging Face config, its
tensors under Hugging Face names, dequantized lazily by the ``gguf`` package.

Opening a file memory-maps it and reads its header only, with hessviz's own bounded reader
(:mod:`hessviz.pretrained.gguf_header`: ``gguf.GGUFReader`` builds a few numpy views per vocabulary
item, ~700 MB and ~20 s for Gemma 3's 262,144 pieces, where this takes ~5 MB and ~0.05 s); each tensor's
data is the view of the mapped bytes that ``gguf.GGUFReader`` gives (:class:`GGUFTensor`). A tensor is
dequantized when it is read, and an embedding table only in the rows a text uses, so a 98 MB
file never sits in memory twice; the vocabulary is decoded only when a text is tokenised.

* **Architectures** ``llama``, ``qwen2``, ``qwen3`` (``general.architecture``), read by the families
  of the same name (:mod:`hessviz.pretrained.families`) from a config built out of the
  ``{arch}.*`` keys: ``embedding_length`` → ``hidden_size``, ``block_count``, ``feed_forward_length``,
  ``attention.head_count`` (``_kv``), ``attention.key_length`` → ``head_dim``,
  ``attention.layer_norm_rms_epsilon``, ``rope.freq_base`` → ``rope_theta``, ``context_length``; the
  embeddings are tied when the file has no ``output.weight``.
* **Tensor types** :data:`TYPES`, dequantized by ``gguf.quants.dequantize`` to float32 (the values
  ``transformers`` loads from the same file).
* **Rotary order.** llama.cpp's converter permutes the rows of a ``llama`` file's ``W_Q`` and ``W_K``
  per head from Hugging Face's half-split rotary order (features ``i`` and ``i + d_k/2`` paired) to
  interleaved pairs (``2i``, ``2i+1``); reading turns them back: rows ``(h, i, 2)`` → ``(h, 2, i)``.
  ``qwen2``/``qwen3`` files are stored unpermuted (llama.cpp rotates them NeoX-style).
* **Tokenizer.** A byte-level BPE (``tokenizer.ggml.model = "gpt2"``) is built with ``tokenizers``
  from ``tokenizer.ggml.tokens`` and ``merges`` as ``transformers`` builds it: GPT-2's byte-level
  pre-tokenizer (or the split pattern ``tokenizer.ggml.pre`` names), control tokens kept whole as
  special tokens. A SentencePiece vocabulary (``"llama"``) of a Gemma file is built as ``transformers``
  builds it (:mod:`hessviz.pretrained.gguf_spm`); of another architecture it is refused for texts: pass
  token ids. Either is built once per file state (an LRU cache).

Anything else (a truncated file, an unknown tensor type, another architecture, a key that changes
the math: rope scaling, a sliding window, experts, soft-capping, a partial rotary width, a size of the
wrong type) is a :class:`~hessviz.errors.CheckpointError` naming it; an error inside ``gguf`` never escapes
as is. The header is read within bounds (:mod:`hessviz.pretrained.gguf_header`), so a damaged or
hostile header is refused in bounded time and memory.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hessviz.errors import CheckpointError
from hessviz.pretrained.bounded import shown
from hessviz.pretrained.checkpoint import CACHE_SIZE, Checkpoint
from hessviz.pretrained.gguf_header import Header, TensorInfo, deferred_value, read_header
from hessviz.pretrained.gguf_spm import check_size, sentencepiece_tokenizer

MAGIC = b"GGUF"
ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
"""The tensor types read (``gguf.GGMLQuantizationType`` names)."""
PERMUTED = ("llama",)
"""Architectures whose ``W_Q``/``W_K`` rows llama.cpp stores in interleaved rotary order."""

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GEMMA_LAYER_NAMES = _LAYER_NAMES | {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
"""Gemma's four norms a layer: llama.cpp's ``ffn_norm`` is the norm *before* the feed-forward."""
LAYER_NAMES = {"gemma3": _GEMMA_LAYER_NAMES}
"""Architectures whose layer tensors map otherwise than :data:`_LAYER_NAMES`."""
SHIFTED_NORMS = ("gemma3",)
"""Architectures whose norm weights llama.cpp's converter stores as ``1 + w`` (Gemma's norms scale by
``1 + w``): reading subtracts 1 in float32, as ``transformers``' ``Gemma2TensorProcessor`` does, so a
checkpoint holds ``w`` whatever its source (the family adds 1 back: ``Source.shift``)."""
GEMMA3_PATTERN = 6
"""llama.cpp's sliding-window pattern for ``gemma3`` files, which do not store it: every 6th layer global."""
GEMMA3_LOCAL_BASE = 10000.0
"""llama.cpp's (and ``transformers``') rotary base of Gemma 3's local layers, which the files do not store."""

_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_REFUSED_TENSORS = {"rope_freqs.weight": "per-frequency rope scaling factors (Llama 3.1 style)"}
_REFUSED_KEYS = (
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scale_linear",
    "rope.freq_scale",
    "attention.sliding_window",
    "expert_count",
    "attention.logit_softcapping",
    "final_logit_softcapping",
    "attention.clamp_kqv",
    "rope.dimension_sections",
    "attention.q_lora_rank",
    "attention.kv_lora_rank",
)
_NEUTRAL = {
    "rope.scaling.type": ("none",),
    "rope.scaling.factor": (0.0, 1.0),
    "rope.freq_scale": (1.0,),
    "rope.scale_linear": (1.0,),
    "expert_count": (0,),
}
"""Refused keys' values that leave the math as computed."""

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
"""``tokenizer.ggml.pre`` -> the split pattern its merges were learned with (as ``transformers``);
any other value keeps GPT-2's byte-level split."""


def hf_name(name: str, arch: str = "llama") -> str | None:
    """The Hugging Face tensor name of a GGUF tensor (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``) in a file of architecture ``arch``, ``None`` for one
    hessviz does not map."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    table = LAYER_NAMES.get(arch, _LAYER_NAMES)
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in table:
        return f"model.layers.{parts[1]}.{table[parts[2]]}"
    return None


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def _gguf():
    try:
        import gguf
    except ImportError:
        raise CheckpointError(
            "reading a GGUF file needs the gguf package: pip install gguf (or pip install 'hessviz[models]')"
        ) from None
    return gguf


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file: what ``gguf.GGUFReader``'s ``ReaderTensor`` holds and hessviz reads.
    ``shape`` in GGUF order (fastest first); ``data`` a read-only view of the mapped file, the array
    ``ReaderTensor.data`` is (for ``gguf.quants.dequantize``): the values for ``F32``, ``F16`` (and
    ``F64``, ``I8`` … ``I64``) in the reversed shape, otherwise the raw bytes, one row per row."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray = field(repr=False)


_ITEMS = {
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
}
"""Tensor types whose data ``gguf`` views as values, not bytes."""


@dataclass(frozen=True)
class _Opened:
    """What :func:`_open_file` keeps per file state: the metadata, the tensor index (each tensor's
    data a view of the memory-mapped file), and the header with the places of the vocabulary arrays,
    read by :meth:`array` only when a text is tokenised (Gemma 3's 262,144 pieces are ~0.2 s and
    ~30 MB as Python strings). Pickled, it is its file state: unpickling maps the file again
    (:func:`_reopen`), never a copy of it."""

    state: tuple[str, int, int]
    buf: mmap.mmap = field(repr=False)
    header: Header = field(repr=False)
    metadata: dict
    tensors: dict = field(default_factory=dict)  # HF name -> GGUFTensor

    @property
    def path(self) -> str:
        return self.state[0]

    @property
    def size(self) -> int:
        return self.state[1]

    def __reduce__(self):
        return _reopen, (self.state,)

    def has(self, key: str) -> bool:
        """Whether the file holds the vocabulary array ``key``."""
        return key in self.header.deferred

    def array(self, key: str) -> object:
        """The value of the vocabulary key ``key`` (a list, if the file is well formed)."""
        return deferred_value(self.buf, self.size, self.path, self.header, key)


_VOCAB = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")
_DEFERRED = _VOCAB + ("tokenizer.ggml.scores",)


def _tensor(gguf, base: np.ndarray, info: TensorInfo, order: str, path: str) -> GGUFTensor:
    """The :class:`GGUFTensor` of ``info``: ``base`` the whole file as bytes; views as ``gguf`` does."""
    qtype = gguf.GGMLQuantizationType(info.kind)
    shape = tuple(reversed(info.dims))
    item = _ITEMS.get(qtype.name)
    if item is None:
        dtype, count = np.dtype(np.uint8), info.n_bytes
        try:
            shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
        except Exception as e:  # a row not a whole number of blocks
            raise CheckpointError(
                f"source {path!r}: GGUF header: tensor {info.name!r} ({qtype.name}) of shape "
                f"{shape} cannot be read ({e}); the file is truncated or damaged"
            ) from None
    else:
        dtype, count = np.dtype(item).newbyteorder(order), info.n_elements
    data = base[info.offset : info.offset + count * dtype.itemsize].view(dtype)
    return GGUFTensor(info.name, qtype, info.dims, data.reshape(shape))


@lru_cache(maxsize=CACHE_SIZE)
def _open_file(state: tuple[str, int, int]) -> _Opened:
    path, size = state[0], state[1]
    if not is_gguf(Path(path)):
        raise CheckpointError(
            f"source {path!r} is not a GGUF file (it does not start with the bytes "
            "'GGUF'); a source is a checkpoint folder, a .gguf file or a bundled name"
        )
    gguf = _gguf()
    quant_sizes = {int(k): v for k, v in gguf.GGML_QUANT_SIZES.items()}
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:  # ValueError: an empty file
        raise CheckpointError(
            f"source {path!r} cannot be read ({getattr(e, 'strerror', None) or e})"
        ) from None
    header = read_header(buf, size, path, quant_sizes, _DEFERRED)
    metadata = {name: value for name, value in header.metadata.items() if not name.startswith("GGUF.")}
    tensors = {}
    arch = metadata.get("general.architecture")
    base = np.frombuffer(buf, np.uint8)
    for info in header.tensors:
        t = _tensor(gguf, base, info, header.order, path)
        kind = t.tensor_type.name
        if t.name in _REFUSED_TENSORS:
            raise CheckpointError(
                f"source {path!r}: tensor {t.name!r} holds {_REFUSED_TENSORS[t.name]}, "
                "which hessviz does not compute (it computes the plain rotation)"
            )
        name = hf_name(t.name, arch if isinstance(arch, str) else "")
        if name is None:
            continue
        if kind not in TYPES:
            raise CheckpointError(
                f"source {path!r}: tensor {t.name!r} has type {kind}; hessviz dequantizes {', '.join(TYPES)}"
            )
        tensors[name] = t
    return _Opened(state, buf, header, metadata, tensors)


def _reopen(state: tuple[str, int, int]) -> _Opened:
    """A pickled :class:`_Opened` back: its file mapped again, refused if it changed since."""
    path = state[0]
    try:
        st = Path(path).stat()
    except OSError as e:
        raise CheckpointError(f"source {path!r} cannot be read ({e.strerror or e})") from None
    if (st.st_size, st.st_mtime_ns) != state[1:]:
        raise CheckpointError(f"source {path!r} changed since it was opened; open it again")
    return _open_file(state)


def _config(path: str, metadata: dict, tensors: dict) -> dict:
    """A Hugging Face ``config.json`` dict from the file's metadata; refuses what is not computed."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise CheckpointError(
            f"source {path!r}: GGUF key general.architecture = {shown(arch)} is not supported; "
            f"hessviz reads {', '.join(map(repr, ARCHITECTURES))} files"
        )
    for key in _REFUSED_KEYS:
        full = f"{arch}.{key}"
        if arch == "gemma3" and key == "attention.sliding_window":
            continue  # Gemma 3's local layers: computed (window per layer)
        if full in metadata and metadata[full] not in _NEUTRAL.get(key, ()):
            raise CheckpointError(
                f"source {path!r}: GGUF key {full} = {shown(metadata[full])} is not supported "
                "(it changes the layer's math; hessviz computes the layer without it)"
            )

    def get(key: str, default: object = None, kind: type = int) -> object:
        """``{arch}.{key}`` (or ``default``), one ``kind`` (an integer is a number too): a value the
        same for every layer, never a per-layer array, a string or a boolean."""
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise CheckpointError(
                f"source {path!r}: GGUF key {arch}.{key} is missing; a {arch} file needs it"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise CheckpointError(
                f"source {path!r}: GGUF key {arch}.{key} must be one "
                f"{'integer' if kind is int else 'number'} (the same for every layer), got {shown(value)}"
            )
        return value

    d, heads = get("embedding_length"), get("attention.head_count")
    kv = get("attention.head_count_kv", heads)
    d_k = get("attention.key_length", d // heads if heads else None)
    d_v = get("attention.value_length", d_k)
    if d_v != d_k:
        raise CheckpointError(
            f"source {path!r}: GGUF key {arch}.attention.value_length = {d_v} differs from "
            f"key_length = {d_k}; hessviz computes heads of one width"
        )
    rotary = get("rope.dimension_count", d_k)
    if rotary != d_k:
        raise CheckpointError(
            f"source {path!r}: GGUF key {arch}.rope.dimension_count = {rotary} is not the "
            f"head width {d_k}; hessviz reads GGUF files whose whole head rotates"
        )
    tokens = metadata.get(f"{arch}.vocab_size")
    embed = tensors.get("model.embed_tokens.weight")
    vocab = tokens if tokens is not None else (int(embed.shape[-1]) if embed is not None else None)
    config = {
        "model_type": arch,
        "hidden_size": d,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": d_k,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", kind=float),
        "rope_theta": float(get("rope.freq_base", 10000.0, kind=float)),
        "max_position_embeddings": get("context_length"),
        "vocab_size": vocab,
        "hidden_act": "silu",
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "attention_bias": "model.layers.0.self_attn.o_proj.bias" in tensors,
    }
    if arch == "qwen2":
        config["use_sliding_window"] = False
    if arch == "gemma3":
        config.update(_gemma3_config(config, get))
    return config


def _gemma3_config(config: dict, get) -> dict:
    """A Gemma 3 file's ``config.json`` keys beyond the Llama-like ones (``gemma3_text``): the sliding
    window and llama.cpp's pattern (:data:`GEMMA3_PATTERN`, or the file's
    ``attention.sliding_window_pattern`` where it has one), the local and global rotary bases, GeGLU with
    the tanh GELU, and ``query_pre_attn_scalar = key_length`` (llama.cpp's score scale ``1/√d_k`` for
    these files; ``transformers``' default 256 is the same number for every Gemma 3 but the 27B)."""
    every = get("attention.sliding_window_pattern", GEMMA3_PATTERN)
    n = config["num_hidden_layers"]
    return {
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": get("attention.sliding_window"),
        "layer_types": ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_BASE},
            "full_attention": {"rope_type": "default", "rope_theta": config.pop("rope_theta")},
        },
        "query_pre_attn_scalar": config["head_dim"],
    }


def _permute_rows(w: Tensor, heads: int) -> Tensor:
    """llama.cpp's rotary row order back to Hugging Face's: rows ``(h, i, 2)`` -> ``(h, 2, i)``."""
    dim = w.shape[0] // heads // 2
    return w.reshape(heads, dim, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


@dataclass(frozen=True)
class GGUFCheckpoint(Checkpoint):
    """A GGUF file opened as a :class:`Checkpoint`: ``config`` built from its metadata, ``tensors``
    ``HF name -> (file, shape)``; :meth:`read` and :meth:`read_rows` dequantize on demand.
    ``folder`` is the file's path."""

    label: str = ""
    opened: _Opened | None = field(default=None, repr=False)

    @classmethod
    def open_file(cls, path: Path, label: str | None = None) -> GGUFCheckpoint:
        st = path.stat()
        opened = _open_file((str(path), st.st_size, st.st_mtime_ns))
        config = _config(str(path), opened.metadata, opened.tensors)
        shapes = {name: (str(path), tuple(reversed(t.shape))) for name, t in opened.tensors.items()}
        return cls(path, config, shapes, label or path.name, opened)

    @property
    def name(self) -> str:
        return self.label

    def _dequantize(self, key: str, data: np.ndarray) -> Tensor:
        t = self.opened.tensors[key]
        try:
            values = _gguf().quants.dequantize(data, t.tensor_type)
        except Exception as e:
            raise CheckpointError(
                f"source {self.name!r}: tensor {t.name!r} ({t.tensor_type.name}) cannot be "
                f"dequantized ({type(e).__name__}: {e})"
            ) from None
        return torch.from_numpy(np.array(values, dtype=np.float32, copy=True))

    def _read_one(self, key: str) -> Tensor:
        t, shape = self.opened.tensors[key], self.shape(key)
        w = self._dequantize(key, t.data).reshape(shape)
        if (
            t.name.endswith("norm.weight")
            and self.opened.metadata.get("general.architecture") in SHIFTED_NORMS
        ):
            w -= 1  # float32, as transformers' Gemma2TensorProcessor: the file holds 1 + w
        if self.config["model_type"] in PERMUTED:
            if key.endswith(("q_proj.weight", "q_proj.bias")):
                w = _permute_rows(w, self.config["num_attention_heads"])
            elif key.endswith(("k_proj.weight", "k_proj.bias")):
                w = _permute_rows(w, self.config["num_key_value_heads"])
        return w

    def read(self, keys, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        for key in keys:
            self.shape(key)
        return {key: self._read_one(key) if dtype is None else self._read_one(key).to(dtype) for key in keys}

    def read_rows(self, key: str, rows: list[int], dtype: torch.dtype) -> Tensor:
        """Rows ``rows`` of a matrix, dequantizing only those (GGUF quantizes each row on its own)."""
        shape = self.shape(key)
        data = self.opened.tensors[key].data
        if data.shape[0] != shape[0]:
            return self.read([key], dtype)[key][torch.tensor(rows)]
        unique = sorted(set(rows))
        picked = self._dequantize(key, np.ascontiguousarray(data[unique])).reshape(len(unique), *shape[1:])
        where = {r: i for i, r in enumerate(unique)}
        return picked[torch.tensor([where[r] for r in rows])].to(dtype)

    def build_tokenizer(self):
        """The file's tokenizer (``tokenizers.Tokenizer``), without padding or truncation."""
        st = self.folder.stat()
        return _tokenizer((str(self.folder), st.st_size, st.st_mtime_ns))

    @property
    def has_tokenizer(self) -> bool:
        return self.opened.has("tokenizer.ggml.tokens")


def _field(opened: _Opened, key: str, path: str, item: type = str, default: list | None = None) -> list:
    """The vocabulary array ``key``, checked to be an array of ``item`` (``default`` when absent, or
    :class:`CheckpointError` when that is None)."""
    if not opened.has(key):
        if default is not None:
            return default
        raise CheckpointError(
            f"source {path!r}: GGUF key {key} is missing, so a text cannot be tokenised; "
            "pass token ids instead of a text"
        )
    values = opened.array(key)
    if not isinstance(values, list) or any(isinstance(v, bool) or not isinstance(v, item) for v in values):
        raise CheckpointError(
            f"source {path!r}: GGUF key {key} must be an array of "
            f"{'strings' if item is str else 'integers'}, got {shown(values)}"
        )
    return values


@lru_cache(maxsize=2)
def _tokenizer(state: tuple[str, int, int]):
    """The file's tokenizer, as ``transformers``' GGUF conversion builds it: a SentencePiece
    vocabulary (``"llama"``) by :func:`~hessviz.pretrained.gguf_spm.sentencepiece_tokenizer`, a
    byte-level BPE (``"gpt2"``) from its vocabulary and merges here (GPT-2's ``BPE`` model, byte-level
    pre-tokenizer and decoder, control tokens added as special tokens). Cached per file state: one
    build per model and process."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    path = state[0]
    opened = _open_file(state)
    kind = opened.metadata.get("tokenizer.ggml.model")
    if kind == "llama":
        return sentencepiece_tokenizer(
            path,
            opened.metadata,
            _field(opened, "tokenizer.ggml.tokens", path),
            _field(opened, "tokenizer.ggml.token_type", path, int, default=[]),
        )
    if kind != "gpt2":
        raise CheckpointError(
            f"source {path!r}: GGUF key tokenizer.ggml.model = {shown(kind)} is not supported "
            "for texts (hessviz builds byte-level BPE, 'gpt2', and Gemma's SentencePiece, 'llama', "
            "tokenizers); pass token ids"
        )
    tokens = _field(opened, "tokenizer.ggml.tokens", path)
    check_size(path, tokens)
    merges = [tuple(m.split(" ")) for m in _field(opened, "tokenizer.ggml.merges", path)]
    bad = next((i for i, m in enumerate(merges) if len(m) != 2), None)
    if bad is not None:
        raise CheckpointError(
            f"source {path!r}: GGUF key tokenizer.ggml.merges item {bad} is "
            f"{shown(' '.join(merges[bad]))}, not two tokens joined by one space"
        )
    types = _field(opened, "tokenizer.ggml.token_type", path, int, default=[])
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        (t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
        for i, t in enumerate(tokens)
    }
    try:
        tok = Tokenizer(
            BPE(
                vocab=vocab,
                merges=merges,
                dropout=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
            )
        )
    except Exception as e:  # tokenizers raises a bare Exception (a merge of a token not in the vocabulary)
        raise CheckpointError(
            f"source {path!r}: the GGUF vocabulary and merges make no BPE tokenizer ({str(e)[:200]})"
        ) from None
    pre = opened.metadata.get("tokenizer.ggml.pre")
    split = SPLITS.get(pre) if isinstance(pre, str) else None
    tok.pre_tokenizer = (
        pre_tokenizers.ByteLevel(add_prefix_space=False)
        if split is None
        else pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    )
    tok.decoder = decoders.ByteLevel()
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, k in zip(tokens, types)
        if k == 3 and set(t) <= alphabet
    ]
    if control:
        tok.add_special_tokens(control)
    user = [
        AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == 4 and t in vocab
    ]
    if user:
        tok.add_tokens(user)
    if opened.metadata.get("tokenizer.ggml.add_bos_token"):
        raise CheckpointError(
            f"source {path!r}: GGUF key tokenizer.ggml.add_bos_token = true is not "
            "supported for texts (hessviz adds no BOS token to a byte-level BPE text); "
            "pass token ids"
        )
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
