"""Model families: how a Hugging Face checkpoint's config and tensors map to hessviz blocks.

A family states four things about its checkpoints:

* the :class:`~hessviz.BlockConfig` of one layer, from ``config.json``;
* where each hessviz weight of layer ``i`` is stored, one :class:`Source` row per weight
  (the table the loader reads; a new weight is a new row);
* how many positions and tokens the model has;
* its embeddings, ``ids (L,) -> X (L, d)``, the hidden state entering layer 0.

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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from hessviz.config import BlockConfig
from hessviz.errors import CheckpointError
from hessviz.pretrained.checkpoint import Checkpoint

HF_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
"""Hugging Face activation name -> hessviz activation (only exact equivalents)."""


@dataclass(frozen=True)
class Source:
    """Where one hessviz weight is stored: the checkpoint tensor ``key``, whether it is
    an ``nn.Linear`` weight to transpose, and ``part = (k, n)`` when it is the ``k``-th of
    ``n`` equal blocks along the last axis of a packed tensor (GPT-2's ``c_attn``)."""

    key: str
    transpose: bool = False
    part: tuple[int, int] | None = None

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The checkpoint tensor's shape that holds a hessviz weight of ``shape``."""
        stored = list(reversed(shape)) if self.transpose else list(shape)
        if self.part is not None:
            stored[-1] *= self.part[1]
        return tuple(stored)

    def extract(self, stored: Tensor, dtype: torch.dtype) -> Tensor:
        """The hessviz weight in ``dtype`` from the stored tensor: one contiguous copy that
        converts, transposes and cuts in a single pass."""
        if self.part is not None:
            k, n = self.part
            stored = stored.chunk(n, dim=-1)[k]
        view = stored.T if self.transpose else stored
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
    (an int is a float too)."""
    value = config.get(key)
    value = default if value is None else value
    if value is None:
        raise CheckpointError(f"config.json: {key} is missing; a {config.get('model_type')} config needs it")
    kinds = (int, float) if kind is float else (kind,)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
        raise CheckpointError(f"config.json: {key} must be {'an integer' if kind is int else 'a number'} "
                              f">= {minimum:g}, got {value!r}")
    return value


def _activation(config: dict, key: str, default: str) -> str:
    name = config.get(key, default)
    if name not in HF_ACTIVATIONS:
        raise CheckpointError(f"config.json: {key} = {name!r} is not supported; hessviz has "
                              f"{', '.join(map(repr, HF_ACTIVATIONS))}")
    return HF_ACTIVATIONS[name]


def _refuse(config: dict, flags: dict[str, object]) -> None:
    """Refuse options that change the layer beyond what hessviz computes."""
    for key, allowed in flags.items():
        value = config.get(key, allowed)
        if value != allowed:
            raise CheckpointError(f"config.json: {key} = {value!r} is not supported (hessviz computes "
                                  f"the standard layer, {key} = {allowed!r})")


def _prefix(ckpt: Checkpoint, anchor: str) -> str:
    """The prefix of every tensor name (``""``, ``"bert."``, ``"transformer."``…), found from
    the one tensor whose name ends with ``anchor``."""
    hits = sorted((k for k in ckpt.tensors if k == anchor or k.endswith("." + anchor)), key=len)
    if not hits:
        raise CheckpointError(f"source {ckpt.name!r}: no tensor named {anchor!r} (with any prefix); the "
                              f"weights do not match config.json's model_type "
                              f"{ckpt.config.get('model_type')!r}")
    return hits[0][: -len(anchor)]


class Family:
    """What every family answers; subclasses fill in the table and the embeddings."""

    model_types: tuple[str, ...] = ()
    title = ""
    anchor = ""
    layers_key = positions_key = vocab_key = ""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt = ckpt
        self.config = ckpt.config
        self.block = self.block_config()
        self.n_layers: int = _get(self.config, self.layers_key, int)
        self.vocab_size: int = _get(self.config, self.vocab_key, int)
        self.prefix = _prefix(ckpt, self.anchor)

    @property
    def max_positions(self) -> int:
        return _get(self.config, self.positions_key, int)

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        raise NotImplementedError

    def layer_sources(self, layer: int) -> dict[str, Source]:
        """``hessviz name -> Source`` of layer ``layer``, full checkpoint keys."""
        raise NotImplementedError

    def embed(self, ids: list[int], dtype: torch.dtype) -> Tensor:
        """``X (L, d)``: the hidden state entering layer 0 for token ids ``ids``."""
        raise NotImplementedError

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        """``key -> shape`` of every embedding tensor :meth:`embed` reads."""
        raise NotImplementedError

    def layer_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """``key -> stored shape`` of every tensor layer ``layer`` reads."""
        shapes = self.block.param_shapes
        return {s.key: s.stored_shape(shapes[n]) for n, s in self.layer_sources(layer).items()}

    def read_layer(self, layer: int, dtype: torch.dtype) -> dict[str, Tensor]:
        """``name -> tensor`` of layer ``layer`` in hessviz orientation and ``dtype``."""
        sources = self.layer_sources(layer)
        self.ckpt.require(self.layer_shapes(layer))
        stored = self.ckpt.read(sorted({s.key for s in sources.values()}))
        return {n: sources[n].extract(stored[sources[n].key], dtype) for n in self.block.param_names}


class Bert(Family):
    """BERT (and RoBERTa): Post-LN, bidirectional (causal as a decoder), GELU, biases and
    LayerNorm γ/β everywhere."""

    model_types = ("bert", "roberta")
    title = "BERT"
    anchor = "embeddings.word_embeddings.weight"
    layers_key, positions_key, vocab_key = "num_hidden_layers", "max_position_embeddings", "vocab_size"

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        c = self.config
        _refuse(c, {"position_embedding_type": "absolute", "add_cross_attention": False})
        d, heads = _get(c, "hidden_size", int), _get(c, "num_attention_heads", int)
        if d % heads:
            raise CheckpointError(f"config.json: hidden_size = {d} must be a multiple of "
                                  f"num_attention_heads = {heads}")
        return BlockConfig(seq_len=self.max_positions if seq_len is None else seq_len, d_model=d,
                           d_k=d // heads, d_ff=_get(c, "intermediate_size", int), norm="post",
                           activation=_activation(c, "hidden_act", "gelu"),
                           ln_eps=float(_get(c, "layer_norm_eps", float, 1e-12, minimum=0)), n_heads=heads,
                           out_proj=True, bias=True, ln_affine=True, causal=bool(c.get("is_decoder", False)))

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
        return _table(W_Q=_linear(p + "attention.self.query"), W_K=_linear(p + "attention.self.key"),
                      W_V=_linear(p + "attention.self.value"), W_O=_linear(p + "attention.output.dense"),
                      ln1=_norm(p + "attention.output.LayerNorm"), W_1=_linear(p + "intermediate.dense"),
                      W_2=_linear(p + "output.dense"), ln2=_norm(p + "output.LayerNorm"))

    def _keys(self) -> dict[str, str]:
        p = f"{self.prefix}embeddings."
        return {"word": p + "word_embeddings.weight", "position": p + "position_embeddings.weight",
                "type": p + "token_type_embeddings.weight", "gamma": p + "LayerNorm.weight",
                "beta": p + "LayerNorm.bias"}

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        k, d = self._keys(), self.block.d_model
        return {k["word"]: (self.vocab_size, d),
                k["position"]: (_get(self.config, self.positions_key, int), d),
                k["type"]: (_get(self.config, "type_vocab_size", int, 2), d),
                k["gamma"]: (d,), k["beta"]: (d,)}

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
        X = (self.ckpt.read_rows(k["word"], ids, dtype)
             + self.ckpt.read_rows(k["position"], self.positions(ids), dtype)
             + self.ckpt.read_rows(k["type"], [0], dtype))
        ln = self.ckpt.read([k["gamma"], k["beta"]], dtype)
        return F.layer_norm(X, (X.shape[1],), ln[k["gamma"]], ln[k["beta"]], eps=self.block.ln_eps)


class GPT2(Family):
    """GPT-2: Pre-LN, causal, GELU-tanh, ``Conv1D`` weights ``(in, out)``, packed ``c_attn``."""

    model_types = ("gpt2",)
    title = "GPT-2"
    anchor = "wte.weight"
    layers_key, positions_key, vocab_key = "n_layer", "n_positions", "vocab_size"

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        c = self.config
        _refuse(c, {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                    "add_cross_attention": False})
        d, heads = _get(c, "n_embd", int), _get(c, "n_head", int)
        if d % heads:
            raise CheckpointError(f"config.json: n_embd = {d} must be a multiple of n_head = {heads}")
        return BlockConfig(seq_len=self.max_positions if seq_len is None else seq_len, d_model=d,
                           d_k=d // heads, d_ff=_get(c, "n_inner", int, 4 * d), norm="pre",
                           activation=_activation(c, "activation_function", "gelu_new"),
                           ln_eps=float(_get(c, "layer_norm_epsilon", float, 1e-5, minimum=0)), n_heads=heads,
                           out_proj=True, bias=True, ln_affine=True, causal=True)

    def layer_sources(self, layer: int) -> dict[str, Source]:
        p = f"{self.prefix}h.{layer}."

        def qkv(k: int) -> tuple[Source, Source]:
            return Source(p + "attn.c_attn.weight", part=(k, 3)), Source(p + "attn.c_attn.bias", part=(k, 3))

        def conv1d(prefix: str) -> tuple[Source, Source]:
            return Source(prefix + ".weight"), Source(prefix + ".bias")

        return _table(ln1=_norm(p + "ln_1"), W_Q=qkv(0), W_K=qkv(1), W_V=qkv(2),
                      W_O=conv1d(p + "attn.c_proj"), ln2=_norm(p + "ln_2"), W_1=conv1d(p + "mlp.c_fc"),
                      W_2=conv1d(p + "mlp.c_proj"))

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        d = self.block.d_model
        return {f"{self.prefix}wte.weight": (self.vocab_size, d),
                f"{self.prefix}wpe.weight": (self.max_positions, d)}

    def embed(self, ids: list[int], dtype: torch.dtype) -> Tensor:
        self.ckpt.require(self.embedding_shapes())
        return (self.ckpt.read_rows(f"{self.prefix}wte.weight", ids, dtype)
                + self.ckpt.read_rows(f"{self.prefix}wpe.weight", list(range(len(ids))), dtype))


FAMILIES: tuple[type[Family], ...] = (Bert, GPT2)
SUPPORTED = tuple(t for f in FAMILIES for t in f.model_types)


def family_of(ckpt: Checkpoint) -> Family:
    """The :class:`Family` that reads ``ckpt``, from ``config.json``'s ``model_type``."""
    model_type = ckpt.config.get("model_type")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family(ckpt)
    raise CheckpointError(f"config.json: model_type {model_type!r} is not supported; hessviz loads "
                          f"{', '.join(map(repr, SUPPORTED))} checkpoints")

