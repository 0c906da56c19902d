"""Today's Llama-like decoders: Llama (SmolLM, TinyLlama), Mistral, Qwen2 and Qwen3 (``MODEL.md`` part 3).

Pre-RMSNorm, SwiGLU (``W_G = gate_projᵀ``, ``W_1 = up_projᵀ``, ``W_2 = down_projᵀ``), rotary positions
(``rope_parameters`` or ``rope_theta``; only ``rope_type`` ``"default"``), grouped-query heads
(``num_key_value_heads``), causal; biases per ``attention_bias``/``mlp_bias`` (Qwen2: Q, K, V
always), Qwen3's ``q_norm``/``k_norm``. Embeddings: ``embed_tokens`` alone. A sliding window
(Mistral's ``sliding_window``, Qwen's ``use_sliding_window``) limits a text to its length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.errors import CheckpointError
from hessviz.pretrained.bounded import shown
from hessviz.pretrained.families.base import (
    Family,
    Head,
    Source,
    _activation,
    _bias,
    _flag,
    _get,
    _heads,
    _linear,
    _refuse_set,
    _rope,
    _rotary_dim,
    _table,
)


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
