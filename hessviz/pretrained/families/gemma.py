r"""The Gemma family (``MODEL.md`` part 5): Gemma 3 (``gemma3_text``) and Gemma 2 (``gemma2``).

Both are Peri-LN decoders with RMSNorm around each sublayer's input and output:

.. math::
    Z_1 = X + \mathrm{RMS}_{1,out}(\mathrm{SA}(\mathrm{RMS}_1(X))),\qquad
    Z = Z_1 + \mathrm{RMS}_{2,out}(\mathrm{FFN}(\mathrm{RMS}_2(Z_1))),

``input_layernorm`` → ``ln1``, ``post_attention_layernorm`` → ``ln1_out``, ``pre_feedforward_layernorm``
→ ``ln2``, ``post_feedforward_layernorm`` → ``ln2_out``. GeGLU with the tanh GELU (``gate_proj``,
``up_proj``, ``down_proj``), rotary positions, grouped-query heads (``head_dim`` explicit), causal,
no biases (``attention_bias`` honoured on Q, K, V, O).

* **The norms scale by** ``1 + w``: Gemma's ``RMSNorm`` computes ``n(z) ⊙ (1 + w)`` with ``w`` the
  stored weight. hessviz's ``γ`` is the scale the norm applies, ``γ = 1 + w`` (:class:`Source` ``shift``);
  the Hessian in ``γ`` and in ``w`` is the same matrix. The final norm too (:class:`Head` ``shift``), and
  Gemma 3's ``q_norm``/``k_norm``.
* **The score's scale** ``attn_scale = query_pre_attn_scalar^(−1/2)`` (not ``1/√d_k``).
* **Local and global layers.** ``layer_types`` (``"sliding_attention"`` / ``"full_attention"``; absent:
  Gemma 3's pattern of ``sliding_window_pattern`` (6): every 6th layer global; Gemma 2: every other
  one, layer 0 local) gives each layer ``window = sliding_window`` or ``None``; Gemma 3's local layers
  rotate with their own base (``rope_parameters["sliding_attention"]``, or 4.x's
  ``rope_local_base_freq``, default 10,000) and its global ones with the global base
  (``rope_parameters["full_attention"]`` or ``rope_theta``). :meth:`Family.layer_block` gives each
  layer's block; the whole model is their :meth:`~hessviz.BlockConfig.stack_of`.
* **Embeddings** ``X_0 = √d · E[ids]`` (``Gemma3TextScaledWordEmbedding``; the scale in the working
  dtype, exactly).
* **Gemma 2's soft-capping**: the attention score ``S ← c·tanh(S/c)`` (``softcap =
  attn_logit_softcapping``) and the final logits ``c·tanh(logits/c)`` (``final_logit_softcapping``,
  :class:`Head` ``softcap``, computed inside the next-token objective).

Refused with a :class:`~hessviz.errors.CheckpointError` naming the key: a ``rope_type`` other than
``"default"`` (Gemma 3 4B+'s linear scaling of the global layers), bidirectional attention, a
``layer_types`` entry other than the two kinds, and Gemma 3's soft-capping values (it has none).
"""

from __future__ import annotations

import dataclasses
import math

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
    _table,
)

LAYER_KINDS = ("sliding_attention", "full_attention")
"""``layer_types`` entries: a local (sliding-window) layer and a global one."""


def _theta(table: object, where: str) -> float:
    """The ``rope_theta`` of one rope settings object; only ``rope_type`` ``"default"``."""
    if not isinstance(table, dict):
        raise CheckpointError(f"config.json: {where} must be an object of rope settings, got {shown(table)}")
    kind = table.get("rope_type", table.get("type", "default"))
    if kind != "default":
        raise CheckpointError(
            f"config.json: {where} has rope_type {shown(kind)}, which is not supported; hessviz "
            "computes the plain rotation (rope_type 'default', no scaling)"
        )
    return float(_get(table, "rope_theta", float, 10000.0, minimum=1e-12))


class Gemma3(Family):
    """Gemma 3 (text): Peri-RMSNorm with ``1 + w`` scales, GeGLU (tanh), QK-norm, rotary positions with
    a local and a global base, sliding-window and global layers, grouped-query heads, ``√d`` embeddings,
    tied 262,144-token head."""

    model_types = ("gemma3_text",)
    title = "Gemma 3"
    blurb = "Peri-RMSNorm (1 + w), GeGLU, QK-norm, local/global RoPE and windows, √d embeddings"
    anchor = "embed_tokens.weight"
    layers_key, positions_key, vocab_key = "num_hidden_layers", "max_position_embeddings", "vocab_size"
    qk_norm = True
    soft_capped = False
    pattern_key, pattern_default = "sliding_window_pattern", 6

    def _refuse_options(self) -> None:
        c = self.config
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if c.get(key) is not None:
                raise CheckpointError(
                    f"config.json: {key} = {shown(c[key])} is not supported for {self.title} (its "
                    "layers have no soft-capping; a Gemma 2 checkpoint has model_type 'gemma2')"
                )
        if _flag(c, "use_bidirectional_attention", False):
            raise CheckpointError(
                "config.json: use_bidirectional_attention = true is not supported (hessviz computes "
                "Gemma's causal layers)"
            )

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        c = self.config
        self._refuse_options()
        d = _get(c, "hidden_size", int)
        heads = _get(c, "num_attention_heads", int)
        d_k = _heads(c, d, "num_attention_heads", "head_dim")
        kv = _get(c, "num_key_value_heads", int, heads)
        if heads % kv:
            raise CheckpointError(
                f"config.json: num_key_value_heads = {kv} must divide num_attention_heads = {heads}"
            )
        scalar = _get(c, "query_pre_attn_scalar", float, 256, minimum=1e-12)
        attention = _flag(c, "attention_bias", False)
        return BlockConfig(
            seq_len=self.max_positions if seq_len is None else seq_len,
            d_model=d,
            d_k=d_k,
            d_ff=_get(c, "intermediate_size", int),
            norm="peri",
            norm_type="rmsnorm",
            mlp="gated",
            activation=_activation(c, self._activation_key, "gelu_pytorch_tanh"),
            ln_eps=float(_get(c, "rms_norm_eps", float, 1e-6, minimum=0)),
            n_heads=heads,
            n_kv_heads=None if kv == heads else kv,
            out_proj=True,
            bias=_bias({"Q": attention, "K": attention, "V": attention, "O": attention}),
            ln_affine=True,
            causal=True,
            rope=True,
            qk_norm=self.qk_norm,
            attn_scale=float(scalar) ** -0.5,
            softcap=self._softcap("attn_logit_softcapping"),
            **self._layer_fields(0),
        )

    @property
    def _activation_key(self) -> str:
        """``hidden_activation`` (Gemma 2 and 3), or the older ``hidden_act`` where only it is given."""
        c = self.config
        return (
            "hidden_act"
            if c.get("hidden_activation") is None and c.get("hidden_act") is not None
            else ("hidden_activation")
        )

    def _softcap(self, key: str) -> float | None:
        if not self.soft_capped:  # Gemma 3: refused by _refuse_options when set
            return None
        value = self.config.get(key)
        return None if value is None else float(_get(self.config, key, float, minimum=1e-12))

    def _thetas(self) -> tuple[float, float]:
        """``(local base, global base)`` from ``rope_parameters`` per layer kind (``transformers`` 5) or
        ``rope_local_base_freq`` and ``rope_theta`` (4.x); ``rope_scaling`` must be absent or default."""
        c = self.config
        params = c.get("rope_parameters")
        if isinstance(params, dict) and any(k in params for k in LAYER_KINDS):
            local = _theta(params.get("sliding_attention", {}), "rope_parameters['sliding_attention']")
            top = _theta(params.get("full_attention", {}), "rope_parameters['full_attention']")
            return local, top
        if params is not None:
            top = _theta(params, "rope_parameters")
        else:
            top = float(_get(c, "rope_theta", float, 10000.0, minimum=1e-12))
        if c.get("rope_scaling") is not None:
            _theta(c["rope_scaling"], "rope_scaling")
        local = float(_get(c, "rope_local_base_freq", float, 10000.0, minimum=1e-12))
        return local, top

    def layer_kinds(self) -> tuple[str, ...]:
        """Each layer's kind, ``"sliding_attention"`` or ``"full_attention"``, from ``layer_types``
        (or the family's default pattern)."""
        c, n = self.config, _get(self.config, self.layers_key, int)
        kinds = c.get("layer_types")
        if kinds is None:
            every = _get(c, self.pattern_key, int, c.get("_" + self.pattern_key) or self.pattern_default)
            return tuple(LAYER_KINDS[(i + 1) % every == 0] for i in range(n))
        if not isinstance(kinds, list) or len(kinds) != n or any(k not in LAYER_KINDS for k in kinds):
            raise CheckpointError(
                f"config.json: layer_types must be a list of {n} entries, each "
                f"{' or '.join(map(repr, LAYER_KINDS))}, got {shown(kinds)}"
            )
        return tuple(kinds)

    def _layer_fields(self, layer: int) -> dict[str, object]:
        """Layer ``layer``'s ``window`` and ``rope_theta``: a local layer has ``sliding_window`` (``None``
        when the config has none) and the local base, a global one no window and the global base."""
        local = self.layer_kinds()[layer] == "sliding_attention"
        window = self.config.get("sliding_window")
        if window is not None:
            window = _get(self.config, "sliding_window", int)
        theta_local, theta_global = self._thetas()
        return {
            "window": window if local else None,
            "rope_theta": (theta_local if self.rotates_locally else theta_global) if local else theta_global,
        }

    rotates_locally = True
    """Gemma 3's local layers rotate with their own base; Gemma 2 has one base for every layer."""

    def layer_block(self, layer: int, seq_len: int | None = None) -> BlockConfig:
        return dataclasses.replace(super().layer_block(layer, seq_len), **self._layer_fields(layer))

    def layer_sources(self, layer: int) -> dict[str, Source]:
        p = f"{self.prefix}layers.{layer}."
        a, m = p + "self_attn.", p + "mlp."

        def norm(key: str) -> Source:
            return Source(key + ".weight", shift=1.0)

        return {
            "ln1_gamma": norm(p + "input_layernorm"),
            "ln1_out_gamma": norm(p + "post_attention_layernorm"),
            "ln2_gamma": norm(p + "pre_feedforward_layernorm"),
            "ln2_out_gamma": norm(p + "post_feedforward_layernorm"),
            "q_norm_gamma": norm(a + "q_norm"),
            "k_norm_gamma": norm(a + "k_norm"),
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
        """``√d · E[ids]``, the scale ``√d`` rounded once in ``dtype``."""
        rows = self.read_rows(self._embedding, ids, dtype)
        return rows * torch.tensor(math.sqrt(self.block.d_model), dtype=dtype)

    def head(self) -> Head:
        tied = _flag(self.config, "tie_word_embeddings", True)
        return Head(
            f"{self.prefix}norm.weight",
            None,
            self._embedding if tied else "lm_head.weight",
            "rmsnorm",
            shift=1.0,
            softcap=self._softcap("final_logit_softcapping"),
        )


class Gemma2(Gemma3):
    """Gemma 2: Gemma 3's layer without QK-norm, one rotary base for every layer, local and global
    layers alternating (layer 0 local), attention soft-capping (``attn_logit_softcapping``) and the
    final logits soft-capped (``final_logit_softcapping``)."""

    model_types = ("gemma2",)
    title = "Gemma 2"
    blurb = "Peri-RMSNorm (1 + w), GeGLU, RoPE, alternating windows, soft-capping, √d embeddings"
    qk_norm = False
    soft_capped = True
    pattern_key, pattern_default = "sliding_window_pattern", 2
    rotates_locally = False

    def _refuse_options(self) -> None:
        if _flag(self.config, "use_bidirectional_attention", False):
            raise CheckpointError(
                "config.json: use_bidirectional_attention = true is not supported (hessviz computes "
                "Gemma's causal layers)"
            )

    def layer_kinds(self) -> tuple[str, ...]:
        c, n = self.config, _get(self.config, self.layers_key, int)
        if c.get("layer_types") is None:  # Gemma 2: even layers local, odd layers global
            return tuple(LAYER_KINDS[i % 2] for i in range(n))
        return super().layer_kinds()

    def _thetas(self) -> tuple[float, float]:
        top = super()._thetas()[1]
        return top, top
