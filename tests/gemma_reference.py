"""``transformers``' own Gemma 2 and Gemma 3 in float64, with its float32 round-trips taken out: the
reference the Gemma tests compare hessviz with (``MODEL.md`` part 5).

``transformers`` computes Gemma's RMSNorm (``x.float()``, ``1.0 + weight.float()``), its rotary angles
(``inv_freq`` and ``position_ids.float()``) and, under ``"eager"``, its attention softmax
(``dtype=torch.float32``) in float32 even in a float64 model, and keeps Gemma 3's embedding scale
``√d`` as a float32 buffer. :func:`exact` replaces exactly those four pieces by the same formulas in the
model's dtype, and nothing else: the layers, masks (sliding windows), soft-capping, GeGLU and the head
stay ``transformers``' own code.

:func:`hf_leaf` names the ``transformers`` parameter behind a hessviz weight (``l1.W_Q[2]``) and the view
that turns it into hessviz's orientation, so a tangent or a product can be moved between the two.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F

HF_KEYS = {
    "W_Q": "self_attn.q_proj.weight",
    "W_K": "self_attn.k_proj.weight",
    "W_V": "self_attn.v_proj.weight",
    "W_O": "self_attn.o_proj.weight",
    "W_G": "mlp.gate_proj.weight",
    "W_1": "mlp.up_proj.weight",
    "W_2": "mlp.down_proj.weight",
    "ln1_gamma": "input_layernorm.weight",
    "ln1_out_gamma": "post_attention_layernorm.weight",
    "ln2_gamma": "pre_feedforward_layernorm.weight",
    "ln2_out_gamma": "post_feedforward_layernorm.weight",
    "q_norm_gamma": "self_attn.q_norm.weight",
    "k_norm_gamma": "self_attn.k_norm.weight",
}
"""hessviz's layer weight -> the key under ``model.layers.{i}.`` (``γ = 1 + w``: the same Hessian)."""


def _rms(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def _rotary(self, x, position_ids, layer_type=None):
    params = self.config.rope_parameters
    base = (params[layer_type] if layer_type is not None else params)["rope_theta"]
    dim = self.config.head_dim
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = position_ids[..., None].to(torch.float64) * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _eager(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    """``eager_attention_forward`` with its softmax in the inputs' dtype (the only change)."""
    from transformers.models.gemma3.modeling_gemma3 import repeat_kv

    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = F.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def exact(model: torch.nn.Module, monkeypatch) -> torch.nn.Module:
    """``model`` (a float64 ``Gemma3ForCausalLM`` or ``Gemma2ForCausalLM``, ``attn_implementation="eager"``)
    with its float32 round-trips taken out; the attention function is patched for the test's duration."""
    for m in model.modules():
        name = type(m).__name__
        if name.endswith("RMSNorm"):
            m.forward = types.MethodType(_rms, m)
        elif name.endswith("RotaryEmbedding"):
            m.forward = types.MethodType(_rotary, m)
        if hasattr(m, "scalar_embed_scale"):
            m.embed_scale = torch.tensor(m.scalar_embed_scale, dtype=torch.float64)
    monkeypatch.setattr(sys.modules[type(model).__module__], "eager_attention_forward", _eager)
    return model.to(torch.float64).eval()


def hf_leaf(name: str, d_k: int):
    """``(key, view)`` of hessviz's layer weight ``name`` (``l1.W_Q[2]``): the ``transformers`` parameter's
    key and ``view(tensor) -> the hessviz-oriented weight`` (a view, so it can be written through)."""
    layer, local = name.split(".", 1)
    base, _, head = local.partition("[")
    key = f"model.layers.{layer[1:]}.{HF_KEYS[base]}"
    if base.startswith(("ln", "q_norm", "k_norm")):
        return key, lambda T: T
    if head:
        h = int(head[:-1])
        if base == "W_O":
            return key, lambda T: T[:, h * d_k : (h + 1) * d_k].T
        return key, lambda T: T[h * d_k : (h + 1) * d_k].T
    return key, lambda T: T.T


def next_token_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy of ``ids (L,)`` from the model's own logits (soft-capped by
    Gemma 2's head), in the model's dtype (``…ForCausalLM(labels=…)`` upcasts only to float32)."""
    logits = model(input_ids=ids[None]).logits[0]
    return F.cross_entropy(logits[:-1], ids[1:])


def products(
    model: torch.nn.Module, ids: torch.Tensor, names, d_k: int, v: torch.Tensor, offsets
) -> torch.Tensor:
    """``H v`` of :func:`next_token_loss` with respect to hessviz's weights ``names`` by double backward
    through ``model`` (the graph kept), ``v`` and the result in hessviz's order and orientation."""
    params = dict(model.named_parameters())
    leaves = {n: hf_leaf(n, d_k) for n in names}
    keys = list(dict.fromkeys(k for k, _ in leaves.values()))
    tangents = {k: torch.zeros_like(params[k]) for k in keys}
    for n in names:
        k, view = leaves[n]
        view(tangents[k]).copy_(v[offsets[n]].reshape(view(tangents[k]).shape))
    loss = next_token_loss(model, ids)
    grads = torch.autograd.grad(loss, [params[k] for k in keys], create_graph=True)
    dot = sum((g * tangents[k]).sum() for g, k in zip(grads, keys))
    hvp = dict(zip(keys, torch.autograd.grad(dot, [params[k] for k in keys])))
    return torch.cat([leaves[n][1](hvp[leaves[n][0]]).reshape(-1) for n in names])
