"""The classic families: BERT (and RoBERTa), GPT-2, GPT-NeoX (Pythia) and OPT.

* ``bert`` (and ``roberta``, which differs only in its position ids): Post-LN,
  ``Z1 = LN(X + SA(X))``, ``Z = LN(Z1 + FFN(Z1))``, ``hidden_act`` GELU (erf), ε from
  ``layer_norm_eps``; causal when ``is_decoder`` (a BERT decoder). Embeddings: word +
  position + token type 0, then LayerNorm.
* ``gpt2``: Pre-LN, causal, ``activation_function`` ``gelu_new`` (= GELU-tanh), ε from
  ``layer_norm_epsilon``. GPT-2's ``Conv1D`` already stores ``(in, out)``, and its ``c_attn`` packs
  ``[W_Q | W_K | W_V]`` side by side in ``(d, 3d)`` (biases ``(3d,)`` alike), so each is a column block
  of it. Head ``h`` is then columns ``h·d_k … (h+1)·d_k − 1`` of ``W_Q``. Embeddings: ``wte + wpe``.
* ``gpt_neox`` (Pythia): parallel residual (Pre-LN when ``use_parallel_residual`` is false),
  LayerNorm γ/β, rotary on ``rotary_pct`` of each head, ``query_key_value`` packed per head
  ``[q_h; k_h; v_h]`` along its output rows (:class:`Source` ``groups = H``). Embeddings: ``embed_in``.
* ``opt``: Pre-LN (Post-LN when ``do_layer_norm_before`` is false), ReLU, biases, ε = 1e-5.
  Embeddings: ``embed_tokens + embed_positions[t + 2]`` (OPT's offset); ``project_in``/``project_out``
  refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.errors import CheckpointError
from hessviz.pretrained.bounded import shown
from hessviz.pretrained.families.base import (
    Family,
    Head,
    Source,
    _activation,
    _flag,
    _get,
    _heads,
    _linear,
    _norm,
    _refuse,
    _rope,
    _rotary_dim,
    _table,
)


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
