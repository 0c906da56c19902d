"""Model families: how a Hugging Face checkpoint's config and tensors map to hessviz blocks.

A family states five things about its checkpoints:

* the :class:`~hessviz.BlockConfig` of one layer, from ``config.json``;
* where each hessviz weight of layer ``i`` is stored, one :class:`Source` row per weight
  (the table the loader reads; a new weight is a new row);
* how many positions and tokens the model has;
* its embeddings, ``ids (L,) -> X (L, d)``, the hidden state entering layer 0;
* for a decoder, its final norm and LM head (:meth:`Family.head`).

Orientation. hessviz multiplies weights from the right, ``X W`` (``MODEL.md``). A
``torch.nn.Linear`` stores ``weight`` as ``(out, in)`` and computes ``x weightᵀ``, so BERT's
matrices are transposed on loading; GPT-2's ``Conv1D`` already stores ``(in, out)``, and its
``c_attn`` packs ``[W_Q | W_K | W_V]`` side by side in ``(d, 3d)`` (biases ``(3d,)`` alike),
so each is a column block of it. Head ``h`` is then columns ``h·d_k … (h+1)·d_k − 1`` of
``W_Q``, as in both implementations' ``view(L, H, d_k)``.

Supported families
------------------
* ``bert`` (and ``roberta``, which differs only in its position ids): Post-LN,
  ``Z1 = LN(X + SA(X))``, ``Z = LN(Z1 + FFN(Z1))``, ``hidden_act`` GELU (erf), ε from
  ``layer_norm_eps``; causal when ``is_decoder`` (a BERT decoder). Embeddings: word +
  position + token type 0, then LayerNorm.
* ``gpt2``: Pre-LN, causal, ``activation_function`` ``gelu_new`` (= GELU-tanh), ε from
  ``layer_norm_epsilon``. Embeddings: ``wte + wpe``.
* ``llama`` (SmolLM, TinyLlama), ``mistral``, ``qwen2``, ``qwen3`` (``MODEL.md`` part 3): Pre-RMSNorm,
  SwiGLU (``W_G = gate_projᵀ``, ``W_1 = up_projᵀ``, ``W_2 = down_projᵀ``), rotary positions
  (``rope_parameters`` or ``rope_theta``; only ``rope_type`` ``"default"``), grouped-query heads
  (``num_key_value_heads``), causal; biases per ``attention_bias``/``mlp_bias`` (Qwen2: Q, K, V
  always), Qwen3's ``q_norm``/``k_norm``. Embeddings: ``embed_tokens`` alone. A sliding window
  (Mistral's ``sliding_window``, Qwen's ``use_sliding_window``) limits a text to its length.
* ``gpt_neox`` (Pythia): parallel residual (Pre-LN when ``use_parallel_residual`` is false),
  LayerNorm γ/β, rotary on ``rotary_pct`` of each head, ``query_key_value`` packed per head
  ``[q_h; k_h; v_h]`` along its output rows (:class:`Source` ``groups = H``). Embeddings: ``embed_in``.
* ``opt``: Pre-LN (Post-LN when ``do_layer_norm_before`` is false), ReLU, biases, ε = 1e-5.
  Embeddings: ``embed_tokens + embed_positions[t + 2]`` (OPT's offset); ``project_in``/``project_out``
  refused.

Each decoder also names its head (:class:`Head`): the final norm and the unembedding, the token
embedding when ``tie_word_embeddings``. A config value that changes the math and is not computed is a
:class:`~hessviz.errors.CheckpointError` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.errors import CheckpointError, ConfigError
from hessviz.pretrained.bounded import shown
from hessviz.pretrained.checkpoint import Checkpoint

HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
"""Hugging Face activation name -> hessviz activation (only exact equivalents)."""
MAX_POSITIONS = 1 << 24
"""The most positions a config may claim (16,777,216; today's longest contexts are ~1M): a bound on a
number that no tensor checks in a rotary model, so no arithmetic on it runs away."""


@dataclass(frozen=True)
class Source:
    """Where one hessviz weight is stored: the checkpoint tensor ``key``, whether it is
    an ``nn.Linear`` weight to transpose, and ``part = (k, n)`` when it is the ``k``-th of
    ``n`` blocks packed along the last axis (in hessviz orientation) of one tensor.

    ``groups = 1``: ``n`` equal blocks side by side, ``[W_Q | W_K | W_V]`` (GPT-2's ``c_attn``).
    ``groups = H``: the packing repeats per head, ``[q_0 k_0 v_0 | q_1 k_1 v_1 | …]``
    (GPT-NeoX's ``query_key_value``, whose output is viewed as ``(H, 3·d_k)``); block ``k`` is then
    ``concat_h`` of the ``k``-th third of every head's group.
    """

    key: str
    transpose: bool = False
    part: tuple[int, int] | None = None
    groups: int = 1

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The checkpoint tensor's shape that holds a hessviz weight of ``shape``."""
        packed = list(shape)
        if self.part is not None:
            packed[-1] *= self.part[1]
        return tuple(reversed(packed)) if self.transpose else tuple(packed)

    def extract(self, stored: Tensor, dtype: torch.dtype) -> Tensor:
        """The hessviz weight in ``dtype`` from the stored tensor: one contiguous copy that
        converts, transposes and cuts in a single pass."""
        view = stored.T if self.transpose else stored
        if self.part is not None:
            k, n = self.part
            lead, width = view.shape[:-1], view.shape[-1] // (n * self.groups)
            view = view.reshape(*lead, self.groups, n, width)[..., k, :].reshape(*lead, self.groups * width)
        return torch.empty(view.shape, dtype=dtype).copy_(view)


def _linear(prefix: str) -> tuple[Source, Source]:
    return Source(f"{prefix}.weight", transpose=True), Source(f"{prefix}.bias")


def _norm(prefix: str) -> tuple[Source, Source]:
    return Source(f"{prefix}.weight"), Source(f"{prefix}.bias")


def _table(**pairs: tuple[Source, Source]) -> dict[str, Source]:
    """``W_Q=(weight, bias)`` -> ``{"W_Q": weight, "b_Q": bias}``; ``ln1=…`` -> ``ln1_gamma, ln1_beta``."""
    out = {}
    for name, (weight, bias) in pairs.items():
        if name.startswith("ln"):
            out[f"{name}_gamma"], out[f"{name}_beta"] = weight, bias
        else:
            out[name], out[name.replace("W_", "b_")] = weight, bias
    return out


def _get(config: dict, key: str, kind: type, default: object = None, minimum: float = 1) -> object:
    """``config[key]`` (or ``default`` when absent or null), checked to be a ``kind`` ``>= minimum``
    (an int is a float too; a number must be finite as a float)."""
    value = config.get(key)
    value = default if value is None else value
    if value is None:
        raise CheckpointError(
            f"config.json: {key} is missing; a {shown(config.get('model_type'))} config needs it"
        )
    kinds = (int, float) if kind is float else (kind,)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or value < minimum
        or (kind is float and not value < 1e308)  # finite: not NaN, not inf, no float(10**400) overflow
    ):
        raise CheckpointError(
            f"config.json: {key} must be {'an integer' if kind is int else 'a finite number'} "
            f">= {minimum:g}, got {shown(value)}"
        )
    return value


def _flag(config: dict, key: str, default: bool) -> bool:
    """``config[key]`` as a JSON ``true``/``false`` (``default`` when absent or null): a string such as
    ``"false"`` would be truthy, a silent wrong layer."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(f"config.json: {key} must be true or false, got {shown(value)}")
    return value


def _activation(config: dict, key: str, default: str) -> str:
    name = config.get(key, default)
    if not isinstance(name, str) or name not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"config.json: {key} = {shown(name)} is not supported; hessviz has "
            f"{', '.join(map(repr, HF_ACTIVATIONS))}"
        )
    return HF_ACTIVATIONS[name]


def _refuse(config: dict, flags: dict[str, object]) -> None:
    """Refuse options that change the layer beyond what hessviz computes."""
    for key, allowed in flags.items():
        value = config.get(key, allowed)
        if value != allowed:
            raise CheckpointError(
                f"config.json: {key} = {shown(value)} is not supported (hessviz computes "
                f"the standard layer, {key} = {allowed!r})"
            )


def _prefix(ckpt: Checkpoint, anchor: str) -> str:
    """The prefix of every tensor name (``""``, ``"bert."``, ``"transformer."``…), found from
    the one tensor whose name ends with ``anchor``."""
    hits = sorted((k for k in ckpt.tensors if k == anchor or k.endswith("." + anchor)), key=len)
    if not hits:
        raise CheckpointError(
            f"source {ckpt.name!r}: no tensor named {anchor!r} (with any prefix); the "
            f"weights do not match config.json's model_type "
            f"{shown(ckpt.config.get('model_type'))}"
        )
    return hits[0][: -len(anchor)]


@dataclass(frozen=True)
class Head:
    """Where a decoder's output head is stored: the final norm's ``γ`` (and ``β`` for a LayerNorm)
    and the unembedding ``E (V, d)`` (``logits = norm(z) Eᵀ``), which is the token embedding when the
    weights are tied. ``gamma = None``: no final norm (OPT with ``do_layer_norm_before = false``)."""

    gamma: str | None
    beta: str | None
    unembedding: str
    norm_type: str = "layernorm"


class Family:
    """What every family answers; subclasses fill in the table and the embeddings."""

    model_types: tuple[str, ...] = ()
    title = ""
    blurb = ""
    """The block in a few words (``hessviz models``, the app)."""
    anchor = ""
    layers_key = positions_key = vocab_key = ""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt = ckpt
        self.config = ckpt.config
        try:
            self.block = self.block_config()
        except ConfigError as e:  # a config whose values make no block: the file's fault, named so
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"config.json describes no block hessviz computes: {e}") from None
        self.n_layers: int = _get(self.config, self.layers_key, int)
        self.vocab_size: int = _get(self.config, self.vocab_key, int)
        self._check_sizes()
        self.prefix = _prefix(ckpt, self.anchor)
        self._check_lazy_keys()

    def _check_lazy_keys(self) -> None:
        """Read now the keys that are otherwise read on first use (the sliding window, the head's
        ``tie_word_embeddings`` …), so a value of the wrong type fails at opening, not halfway through."""
        self.check_length(0)
        if self.has_head():
            self.head()

    def _check_sizes(self) -> None:
        """Refuse sizes no tensor backs, before anything loops or allocates by them: every width is at
        most the largest dimension of any tensor present, the layers at most the tensors (each layer has
        its own), the positions at most :data:`MAX_POSITIONS`. (Each tensor's exact shape is checked
        again before it is read, :meth:`Checkpoint.require`.)"""
        tensors, b = self.ckpt.tensors, self.block
        largest = max((max(shape) for _, shape in tensors.values() if shape), default=0)
        for what, value in (
            ("hidden size", b.d_model),
            ("feed-forward width", b.d_ff),
            ("heads × head width", b.n_heads * b.d_k),
            ("vocabulary size", self.vocab_size),
        ):
            if value > largest:
                raise CheckpointError(
                    f"config.json: the {what} {value} is larger than every dimension of every tensor "
                    f"in the weights (the largest is {largest}); the config does not describe them"
                )
        if self.n_layers > len(tensors):
            raise CheckpointError(
                f"config.json: {self.layers_key} = {self.n_layers}, but the weights hold only "
                f"{len(tensors)} tensors (each layer has its own); the config does not describe them"
            )
        if self.max_positions > MAX_POSITIONS:
            raise CheckpointError(
                f"config.json: {self.positions_key} = {self.max_positions} is beyond the "
                f"{MAX_POSITIONS} positions hessviz reads"
            )

    @property
    def max_positions(self) -> int:
        return _get(self.config, self.positions_key, int)

    @property
    def window(self) -> tuple[str, int] | None:
        """``(config key, length)`` of a sliding attention window that hessviz does not compute
        (then a text may be at most that long), or ``None``."""
        return None

    def check_length(self, n: int) -> None:
        """:class:`CheckpointError` when ``n`` tokens are more than a sliding window sees: the layer
        would then need the window's mask, which hessviz does not compute."""
        if self.window is not None and n > self.window[1]:
            key, w = self.window
            raise CheckpointError(
                f"config.json: {key} = {w} is shorter than the {n} tokens asked for; "
                f"hessviz computes full causal attention, which equals the sliding-window "
                f"layer only up to {w} tokens: use at most {w}"
            )

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        raise NotImplementedError

    def layer_sources(self, layer: int) -> dict[str, Source]:
        """``hessviz name -> Source`` of layer ``layer``, full checkpoint keys (a table may hold
        rows for weights this block does not have, e.g. biases; only ``param_names`` are read)."""
        raise NotImplementedError

    def embed(self, ids: list[int], dtype: torch.dtype) -> Tensor:
        """``X (L, d)``: the hidden state entering layer 0 for token ids ``ids``."""
        raise NotImplementedError

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        """``key -> shape`` of every embedding tensor :meth:`embed` reads."""
        raise NotImplementedError

    def head(self) -> Head:
        """The final norm and the LM head; :class:`CheckpointError` for a family without one."""
        decoders = (t for f in FAMILIES if f.has_head() for t in f.model_types)
        raise CheckpointError(
            f"source {self.ckpt.name!r} is a {self.title} model: hessviz reads the "
            "next-token head (final norm and unembedding) of decoder families only "
            f"({', '.join(decoders)})"
        )

    @classmethod
    def has_head(cls) -> bool:
        """Whether hessviz reads this family's next-token head (the decoders)."""
        return cls.head is not Family.head

    def head_shapes(self) -> dict[str, tuple[int, ...]]:
        """``key -> shape`` of the head's tensors."""
        h, d = self.head(), self.block.d_model
        return {k: (d,) for k in (h.gamma, h.beta) if k is not None} | {h.unembedding: (self.vocab_size, d)}

    def _sources(self, layer: int) -> dict[str, Source]:
        table = self.layer_sources(layer)
        missing = [n for n in self.block.param_names if n not in table]
        if missing:
            raise CheckpointError(
                f"source {self.ckpt.name!r}: the {self.title} table has no row for "
                f"{', '.join(missing)} of this block"
            )
        return {n: table[n] for n in self.block.param_names}

    def layer_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """``key -> stored shape`` of every tensor layer ``layer`` reads."""
        shapes = self.block.param_shapes
        return {s.key: s.stored_shape(shapes[n]) for n, s in self._sources(layer).items()}

    def read_layer(self, layer: int, dtype: torch.dtype) -> dict[str, Tensor]:
        """``name -> tensor`` of layer ``layer`` in hessviz orientation and ``dtype``."""
        sources = self._sources(layer)
        self.ckpt.require(self.layer_shapes(layer))
        stored = self.ckpt.read(sorted({s.key for s in sources.values()}))
        return {n: sources[n].extract(stored[sources[n].key], dtype) for n in self.block.param_names}

    def read_rows(self, key: str, ids: list[int], dtype: torch.dtype) -> Tensor:
        """Rows ``ids`` of the table ``key`` (checked against :meth:`embedding_shapes` first)."""
        self.ckpt.require(self.embedding_shapes())
        return self.ckpt.read_rows(key, ids, dtype)


class Bert(Family):
    """BERT (and RoBERTa): Post-LN, bidirectional (causal as a decoder), GELU, biases and
    LayerNorm γ/β everywhere."""

    model_types = ("bert", "roberta")
    title = "BERT"
    blurb = "Post-LN, GELU, biases, LayerNorm γ/β; causal as a decoder (RoBERTa too)"
    anchor = "embeddings.word_embeddings.weight"
    layers_key, positions_key, vocab_key = "num_hidden_layers", "max_position_embeddings", "vocab_size"

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        c = self.config
        _refuse(c, {"position_embedding_type": "absolute", "add_cross_attention": False})
        d, heads = _get(c, "hidden_size", int), _get(c, "num_attention_heads", int)
        if d % heads:
            raise CheckpointError(
                f"config.json: hidden_size = {d} must be a multiple of num_attention_heads = {heads}"
            )
        return BlockConfig(
            seq_len=self.max_positions if seq_len is None else seq_len,
            d_model=d,
            d_k=d // heads,
            d_ff=_get(c, "intermediate_size", int),
            norm="post",
            activation=_activation(c, "hidden_act", "gelu"),
            ln_eps=float(_get(c, "layer_norm_eps", float, 1e-12, minimum=0)),
            n_heads=heads,
            out_proj=True,
            bias=True,
            ln_affine=True,
            causal=_flag(c, "is_decoder", False),
        )

    @property
    def _position_offset(self) -> int:
        """RoBERTa numbers positions from ``pad_token_id + 1``; BERT from 0."""
        if self.config["model_type"] != "roberta":
            return 0
        return _get(self.config, "pad_token_id", int, 1, minimum=0) + 1

    @property
    def max_positions(self) -> int:
        return _get(self.config, self.positions_key, int) - self._position_offset

    def layer_sources(self, layer: int) -> dict[str, Source]:
        p = f"{self.prefix}encoder.layer.{layer}."
        return _table(
            W_Q=_linear(p + "attention.self.query"),
            W_K=_linear(p + "attention.self.key"),
            W_V=_linear(p + "attention.self.value"),
            W_O=_linear(p + "attention.output.dense"),
            ln1=_norm(p + "attention.output.LayerNorm"),
            W_1=_linear(p + "intermediate.dense"),
            W_2=_linear(p + "output.dense"),
            ln2=_norm(p + "output.LayerNorm"),
        )

    def _keys(self) -> dict[str, str]:
        p = f"{self.prefix}embeddings."
        return {
            "word": p + "word_embeddings.weight",
            "position": p + "position_embeddings.weight",
            "type": p + "token_type_embeddings.weight",
            "gamma": p + "LayerNorm.weight",
            "beta": p + "LayerNorm.bias",
        }

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        k, d = self._keys(), self.block.d_model
        return {
            k["word"]: (self.vocab_size, d),
            k["position"]: (_get(self.config, self.positions_key, int), d),
            k["type"]: (_get(self.config, "type_vocab_size", int, 2), d),
            k["gamma"]: (d,),
            k["beta"]: (d,),
        }

    def positions(self, ids: list[int]) -> list[int]:
        """Position ids: ``0 … L−1`` (BERT); RoBERTa counts non-pad tokens from ``pad + 1`` and
        gives pad tokens the position ``pad`` (``create_position_ids_from_input_ids``)."""
        if self.config["model_type"] != "roberta":
            return list(range(len(ids)))
        pad, count, out = self._position_offset - 1, 0, []
        for t in ids:
            count += t != pad
            out.append(pad + count if t != pad else pad)
        return out

    def embed(self, ids: list[int], dtype: torch.dtype) -> Tensor:
        k = self._keys()
        self.ckpt.require(self.embedding_shapes())
        X = (
            self.ckpt.read_rows(k["word"], ids, dtype)
            + self.ckpt.read_rows(k["position"], self.positions(ids), dtype)
            + self.ckpt.read_rows(k["type"], [0], dtype)
        )
        ln = self.ckpt.read([k["gamma"], k["beta"]], dtype)
        return F.layer_norm(X, (X.shape[1],), ln[k["gamma"]], ln[k["beta"]], eps=self.block.ln_eps)


class GPT2(Family):
    """GPT-2: Pre-LN, causal, GELU-tanh, ``Conv1D`` weights ``(in, out)``, packed ``c_attn``."""

    model_types = ("gpt2",)
    title = "GPT-2"
    blurb = "Pre-LN, causal, GELU-tanh, biases, LayerNorm γ/β"
    anchor = "wte.weight"
    layers_key, positions_key, vocab_key = "n_layer", "n_positions", "vocab_size"

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        c = self.config
        _refuse(
            c,
            {
                "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False,
                "add_cross_attention": False,
            },
        )
        d, heads = _get(c, "n_embd", int), _get(c, "n_head", int)
        if d % heads:
            raise CheckpointError(f"config.json: n_embd = {d} must be a multiple of n_head = {heads}")
        return BlockConfig(
            seq_len=self.max_positions if seq_len is None else seq_len,
            d_model=d,
            d_k=d // heads,
            d_ff=_get(c, "n_inner", int, 4 * d),
            norm="pre",
            activation=_activation(c, "activation_function", "gelu_new"),
            ln_eps=float(_get(c, "layer_norm_epsilon", float, 1e-5, minimum=0)),
            n_heads=heads,
            out_proj=True,
            bias=True,
            ln_affine=True,
            causal=True,
        )

    def layer_sources(self, layer: int) -> dict[str, Source]:
        p = f"{self.prefix}h.{layer}."

        def qkv(k: int) -> tuple[Source, Source]:
            return Source(p + "attn.c_attn.weight", part=(k, 3)), Source(p + "attn.c_attn.bias", part=(k, 3))

        def conv1d(prefix: str) -> tuple[Source, Source]:
            return Source(prefix + ".weight"), Source(prefix + ".bias")

        return _table(
            ln1=_norm(p + "ln_1"),
            W_Q=qkv(0),
            W_K=qkv(1),
            W_V=qkv(2),
            W_O=conv1d(p + "attn.c_proj"),
            ln2=_norm(p + "ln_2"),
            W_1=conv1d(p + "mlp.c_fc"),
            W_2=conv1d(p + "mlp.c_proj"),
        )

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        d = self.block.d_model
        return {
            f"{self.prefix}wte.weight": (self.vocab_size, d),
            f"{self.prefix}wpe.weight": (self.max_positions, d),
        }

    def embed(self, ids: list[int], dtype: torch.dtype) -> Tensor:
        self.ckpt.require(self.embedding_shapes())
        return self.ckpt.read_rows(f"{self.prefix}wte.weight", ids, dtype) + self.ckpt.read_rows(
            f"{self.prefix}wpe.weight", list(range(len(ids))), dtype
        )

    def head(self) -> Head:
        return Head(f"{self.prefix}ln_f.weight", f"{self.prefix}ln_f.bias", f"{self.prefix}wte.weight")


# ----------------------------------------------------------------------------- today's decoders


def _rope(config: dict, default_factor: float = 1.0) -> tuple[float, float]:
    """``(rope_theta, partial rotary factor)`` from either spelling of ``config.json``:
    ``rope_parameters = {rope_type, rope_theta, partial_rotary_factor}`` (``transformers`` 5) or
    ``rope_theta``/``rope_scaling``/``partial_rotary_factor`` (4.x; GPT-NeoX's ``rotary_emb_base``,
    ``rotary_pct``). Only the plain rotation is computed: any other ``rope_type`` is refused."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for key, table in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(table, dict) or any(isinstance(v, dict) for v in table.values()):
            raise CheckpointError(
                f"config.json: {key} must be one object of rope settings (hessviz computes "
                f"one rotation for every layer), got {shown(table)}"
            )
        kind = table.get("rope_type", table.get("type", "default"))
        if kind != "default":
            raise CheckpointError(
                f"config.json: {key} with rope_type {shown(kind)} is not supported; hessviz "
                "computes the plain rotation (rope_type 'default', no scaling)"
            )
    theta = params.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    factor = params.get(
        "partial_rotary_factor", config.get("partial_rotary_factor", config.get("rotary_pct", default_factor))
    )
    _get({"rope_theta": theta}, "rope_theta", float, minimum=1e-12)
    _get({"partial_rotary_factor": factor}, "partial_rotary_factor", float, minimum=1e-12)
    return float(theta), float(factor)


def _rotary_dim(d_k: int, factor: float) -> int | None:
    """GPT-NeoX's ``int(d_k · rotary_pct)``; ``None`` when the whole head rotates."""
    r = int(d_k * factor)
    if r > d_k or r < 2 or r % 2:
        raise CheckpointError(
            f"config.json: partial rotary factor {factor:g} of head width {d_k} gives "
            f"{r} rotated features; hessviz needs an even number in [2, {d_k}]"
        )
    return None if r == d_k else r


def _refuse_set(config: dict, keys: tuple[str, ...]) -> None:
    """Refuse options that are off (null or absent) in the layer hessviz computes."""
    for key in keys:
        if config.get(key) not in (None, False, 0):
            raise CheckpointError(
                f"config.json: {key} = {shown(config[key])} is not supported (it changes the "
                "layer's math; hessviz computes the layer without it)"
            )


def _heads(config: dict, d: int, heads_key: str, head_dim_key: str | None) -> int:
    """``d_k``: ``head_dim`` when the config gives it, else ``d / n_heads``."""
    heads = _get(config, heads_key, int)
    if head_dim_key and config.get(head_dim_key) is not None:
        return _get(config, head_dim_key, int)
    if d % heads:
        raise CheckpointError(f"config.json: hidden_size = {d} must be a multiple of {heads_key} = {heads}")
    return d // heads


def _bias(flags: dict[str, bool]) -> tuple[str, ...] | bool:
    """``BlockConfig.bias`` from ``projection letter -> has a bias``: the tuple, ``True`` or ``False``."""
    have = tuple(k for k, on in flags.items() if on)
    return False if not have else (True if len(have) == len(flags) else have)


class Llama(Family):
    """Llama (SmolLM, TinyLlama): Pre-RMSNorm, SwiGLU (``gate_proj``, ``up_proj``, ``down_proj``),
    rotary positions, grouped-query attention, causal, no biases unless ``attention_bias`` /
    ``mlp_bias``. No position embeddings; the final ``norm`` and the LM head (tied or not)."""

    model_types = ("llama",)
    title = "Llama"
    blurb = "Pre-RMSNorm, SwiGLU, RoPE, grouped-query, causal (SmolLM, TinyLlama too)"
    anchor = "embed_tokens.weight"
    layers_key, positions_key, vocab_key = "num_hidden_layers", "max_position_embeddings", "vocab_size"
    head_dim_key: str | None = "head_dim"
    qk_norm = False
    tied_default = False

    def biases(self) -> dict[str, bool]:
        c = self.config
        attention, mlp = _flag(c, "attention_bias", False), _flag(c, "mlp_bias", False)
        return {"Q": attention, "K": attention, "V": attention, "O": attention, "G": mlp, "1": mlp, "2": mlp}

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        c = self.config
        _refuse_set(c, ("attn_logit_softcapping", "final_logit_softcapping"))
        d = _get(c, "hidden_size", int)
        heads = _get(c, "num_attention_heads", int)
        d_k = _heads(c, d, "num_attention_heads", self.head_dim_key)
        kv = _get(c, "num_key_value_heads", int, heads)
        if heads % kv:
            raise CheckpointError(
                f"config.json: num_key_value_heads = {kv} must divide num_attention_heads = {heads}"
            )
        theta, factor = _rope(c)
        return BlockConfig(
            seq_len=self.max_positions if seq_len is None else seq_len,
            d_model=d,
            d_k=d_k,
            d_ff=_get(c, "intermediate_size", int),
            norm="pre",
            norm_type="rmsnorm",
            mlp="gated",
            activation=_activation(c, "hidden_act", "silu"),
            ln_eps=float(_get(c, "rms_norm_eps", float, 1e-6, minimum=0)),
            n_heads=heads,
            n_kv_heads=None if kv == heads else kv,
            out_proj=True,
            bias=_bias(self.biases()),
            ln_affine=True,
            causal=True,
            rope=True,
            rope_theta=theta,
            rotary_dim=_rotary_dim(d_k, factor),
            qk_norm=self.qk_norm,
        )

    @property
    def window(self) -> tuple[str, int] | None:
        """A sliding window, where the config turns one on (Mistral's ``sliding_window``; Qwen's
        with ``use_sliding_window``; any ``layer_types`` entry ``sliding_attention``)."""
        c = self.config
        w, kinds = c.get("sliding_window"), c.get("layer_types") or []
        if not isinstance(kinds, list):
            raise CheckpointError(f"config.json: layer_types must be a list, got {shown(kinds)}")
        on = (
            self.config.get("model_type") == "mistral"
            or _flag(c, "use_sliding_window", False)
            or "sliding_attention" in kinds
        )
        return ("sliding_window", _get(c, "sliding_window", int)) if on and w is not None else None

    def layer_sources(self, layer: int) -> dict[str, Source]:
        p = f"{self.prefix}layers.{layer}."
        a, m = p + "self_attn.", p + "mlp."
        return {
            "ln1_gamma": Source(p + "input_layernorm.weight"),
            "ln2_gamma": Source(p + "post_attention_layernorm.weight"),
            "q_norm_gamma": Source(a + "q_norm.weight"),
            "k_norm_gamma": Source(a + "k_norm.weight"),
            **_table(
                W_Q=_linear(a + "q_proj"),
                W_K=_linear(a + "k_proj"),
                W_V=_linear(a + "v_proj"),
                W_O=_linear(a + "o_proj"),
                W_G=_linear(m + "gate_proj"),
                W_1=_linear(m + "up_proj"),
                W_2=_linear(m + "down_proj"),
            ),
        }

    @property
    def _embedding(self) -> str:
        return f"{self.prefix}embed_tokens.weight"

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self._embedding: (self.vocab_size, self.block.d_model)}

    def embed(self, ids: list[int], dtype: torch.dtype) -> Tensor:
        return self.read_rows(self._embedding, ids, dtype)

    def _unembedding(self, untied: str) -> str:
        tied = _flag(self.config, "tie_word_embeddings", self.tied_default)
        return self._embedding if tied else untied

    def head(self) -> Head:
        return Head(f"{self.prefix}norm.weight", None, self._unembedding("lm_head.weight"), "rmsnorm")


class Mistral(Llama):
    """Mistral: a Llama layer; ``sliding_window`` (a mask) limits a text to that many tokens."""

    model_types = ("mistral",)
    title = "Mistral"
    blurb = "as Llama; texts up to sliding_window tokens"


class Qwen2(Llama):
    """Qwen2: a Llama layer with biases on ``q_proj``, ``k_proj``, ``v_proj`` only."""

    model_types = ("qwen2",)
    title = "Qwen2"
    blurb = "as Llama, with biases on Q, K, V"

    def biases(self) -> dict[str, bool]:
        return {"Q": True, "K": True, "V": True, "O": False, "G": False, "1": False, "2": False}


class Qwen3(Llama):
    """Qwen3: a Llama layer with QK-norm (RMSNorm over each head's ``q`` and ``k``, ``q_norm`` and
    ``k_norm`` shared by the heads) and an explicit ``head_dim``."""

    model_types = ("qwen3",)
    title = "Qwen3"
    blurb = "as Llama, with QK-norm and an explicit head_dim"
    qk_norm = True

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        _get(self.config, "head_dim", int)
        return super().block_config(seq_len)


class GPTNeoX(Family):
    """GPT-NeoX (Pythia): parallel residual ``Z = X + SA(LN1(X)) + FFN(LN2(X))`` (Pre-LN when
    ``use_parallel_residual`` is false), LayerNorm with γ/β, partial rotary positions
    (``rotary_pct`` of each head), GELU, biases; ``query_key_value`` packed per head ``[q_h; k_h; v_h]``."""

    model_types = ("gpt_neox",)
    title = "GPT-NeoX"
    blurb = "parallel (or Pre-LN), LayerNorm γ/β, partial RoPE, GELU, biases (Pythia)"
    anchor = "embed_in.weight"
    layers_key, positions_key, vocab_key = "num_hidden_layers", "max_position_embeddings", "vocab_size"

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        c = self.config
        d, heads = _get(c, "hidden_size", int), _get(c, "num_attention_heads", int)
        d_k = _heads(c, d, "num_attention_heads", None)
        theta, factor = _rope(c, default_factor=0.25)
        bias = True if _flag(c, "attention_bias", True) else ("1", "2")
        return BlockConfig(
            seq_len=self.max_positions if seq_len is None else seq_len,
            d_model=d,
            d_k=d_k,
            d_ff=_get(c, "intermediate_size", int),
            norm="parallel" if _flag(c, "use_parallel_residual", True) else "pre",
            activation=_activation(c, "hidden_act", "gelu"),
            ln_eps=float(_get(c, "layer_norm_eps", float, 1e-5, minimum=0)),
            n_heads=heads,
            out_proj=True,
            bias=bias,
            ln_affine=True,
            causal=True,
            rope=True,
            rope_theta=theta,
            rotary_dim=_rotary_dim(d_k, factor),
        )

    def layer_sources(self, layer: int) -> dict[str, Source]:
        p = f"{self.prefix}layers.{layer}."
        qkv, H = p + "attention.query_key_value", self.block.n_heads

        def packed(k: int) -> tuple[Source, Source]:
            return (
                Source(qkv + ".weight", transpose=True, part=(k, 3), groups=H),
                Source(qkv + ".bias", part=(k, 3), groups=H),
            )

        return _table(
            ln1=_norm(p + "input_layernorm"),
            W_Q=packed(0),
            W_K=packed(1),
            W_V=packed(2),
            W_O=_linear(p + "attention.dense"),
            ln2=_norm(p + "post_attention_layernorm"),
            W_1=_linear(p + "mlp.dense_h_to_4h"),
            W_2=_linear(p + "mlp.dense_4h_to_h"),
        )

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        return {f"{self.prefix}embed_in.weight": (self.vocab_size, self.block.d_model)}

    def embed(self, ids: list[int], dtype: torch.dtype) -> Tensor:
        return self.read_rows(f"{self.prefix}embed_in.weight", ids, dtype)

    def head(self) -> Head:
        norm = f"{self.prefix}final_layer_norm."
        tied = _flag(self.config, "tie_word_embeddings", False)
        return Head(
            norm + "weight", norm + "bias", f"{self.prefix}embed_in.weight" if tied else "embed_out.weight"
        )


class OPT(Family):
    """OPT: Pre-LN (Post-LN when ``do_layer_norm_before`` is false), ReLU, biases, causal; learned
    positions read at ``t + 2`` (OPT's offset); ``project_in``/``project_out`` (a
    ``word_embed_proj_dim`` other than ``hidden_size``, OPT-350m) are refused."""

    model_types = ("opt",)
    title = "OPT"
    blurb = "Pre-LN (or Post-LN), ReLU, biases, learned positions (offset 2)"
    anchor = "embed_positions.weight"
    layers_key, positions_key, vocab_key = "num_hidden_layers", "max_position_embeddings", "vocab_size"
    OFFSET = 2

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        c = self.config
        d = _get(c, "hidden_size", int)
        if c.get("word_embed_proj_dim", d) != d:
            raise CheckpointError(
                f"config.json: word_embed_proj_dim = {shown(c['word_embed_proj_dim'])} differs "
                f"from hidden_size = {d}, so the model has project_in/project_out maps "
                "around its layers; hessviz does not support them"
            )
        _refuse(c, {"_remove_final_layer_norm": False, "layer_norm_elementwise_affine": True})
        heads = _get(c, "num_attention_heads", int)
        return BlockConfig(
            seq_len=self.max_positions if seq_len is None else seq_len,
            d_model=d,
            d_k=_heads(c, d, "num_attention_heads", None),
            d_ff=_get(c, "ffn_dim", int),
            norm="pre" if _flag(c, "do_layer_norm_before", True) else "post",
            activation=_activation(c, "activation_function", "relu"),
            ln_eps=1e-5,
            n_heads=heads,
            out_proj=True,
            bias=_flag(c, "enable_bias", True),
            ln_affine=True,
            causal=True,
        )

    def layer_sources(self, layer: int) -> dict[str, Source]:
        p = f"{self.prefix}layers.{layer}."
        a = p + "self_attn."
        return _table(
            W_Q=_linear(a + "q_proj"),
            W_K=_linear(a + "k_proj"),
            W_V=_linear(a + "v_proj"),
            W_O=_linear(a + "out_proj"),
            ln1=_norm(p + "self_attn_layer_norm"),
            W_1=_linear(p + "fc1"),
            W_2=_linear(p + "fc2"),
            ln2=_norm(p + "final_layer_norm"),
        )

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        d = self.block.d_model
        return {
            f"{self.prefix}embed_tokens.weight": (self.vocab_size, d),
            f"{self.prefix}embed_positions.weight": (self.max_positions + self.OFFSET, d),
        }

    def embed(self, ids: list[int], dtype: torch.dtype) -> Tensor:
        positions = [t + self.OFFSET for t in range(len(ids))]
        return self.read_rows(f"{self.prefix}embed_tokens.weight", ids, dtype) + self.read_rows(
            f"{self.prefix}embed_positions.weight", positions, dtype
        )

    def head(self) -> Head:
        norm = f"{self.prefix}final_layer_norm."
        final = _flag(self.config, "do_layer_norm_before", True)
        tied = _flag(self.config, "tie_word_embeddings", True)
        return Head(
            norm + "weight" if final else None,
            norm + "bias" if final else None,
            f"{self.prefix}embed_tokens.weight" if tied else "lm_head.weight",
        )


FAMILIES: tuple[type[Family], ...] = (Bert, GPT2, Llama, Mistral, Qwen2, Qwen3, GPTNeoX, OPT)
SUPPORTED = tuple(t for f in FAMILIES for t in f.model_types)


def family_of(ckpt: Checkpoint) -> Family:
    """The :class:`Family` that reads ``ckpt``, from ``config.json``'s ``model_type``."""
    model_type = ckpt.config.get("model_type")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family(ckpt)
    raise CheckpointError(
        f"config.json: model_type {shown(model_type)} is not supported; hessviz loads "
        f"{', '.join(map(repr, SUPPORTED))} checkpoints"
    )
