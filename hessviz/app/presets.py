"""Presets of the sidebar's *Modern block* group: today's decoder blocks in the app's URL keys.

Each preset names every structural key it depends on (placement, norm type, feed-forward kind,
activation, rotary positions, heads, key/value heads, QK-norm, biases, γ, mask), so following one
from any view gives that block; the sizes, the loss, the input and the seed stay as they were.
Pure data and Python (no Streamlit).

>>> sorted(PRESETS["Qwen2-style"].items())[:3]
[('act', 'silu'), ('affine', True), ('bias', ('Q', 'K', 'V'))]
>>> matching({**state.DEFAULTS, **PRESETS["Llama-style"]})
'Llama-style'
"""

from __future__ import annotations

from hessviz.app import state  # noqa: F401 (the doctests read DEFAULTS)

_LLAMA: dict[str, object] = {
    "norm": "pre",
    "ntype": "rmsnorm",
    "affine": True,
    "mlp": "gated",
    "act": "silu",
    "rope": True,
    "heads": 4,
    "kv": 2,
    "wo": True,
    "qknorm": False,
    "bias": False,
    "causal": True,
}

PRESETS: dict[str, dict[str, object]] = {
    "Llama-style": _LLAMA,
    "Qwen2-style": {**_LLAMA, "bias": ("Q", "K", "V")},
    "Qwen3-style": {**_LLAMA, "qknorm": True},
    "Pythia-style": {
        "norm": "parallel",
        "ntype": "layernorm",
        "affine": True,
        "mlp": "plain",
        "act": "gelu",
        "rope": True,
        "heads": 4,
        "kv": None,
        "wo": True,
        "qknorm": False,
        "bias": True,
        "causal": True,
    },
}
"""Preset title -> the shared values (URL key -> value) it sets.

* Llama-style (Llama, Mistral, SmolLM): Pre-RMSNorm with γ, SwiGLU, RoPE, 4 query heads over 2
  key/value heads, causal, no biases.
* Qwen2-style: the same with biases on q, k and v only.
* Qwen3-style: the same with an RMSNorm on each head's q and k (QK-norm).
* Pythia-style (GPT-NeoX): attention and MLP in parallel, LayerNorm with γ/β, GELU, RoPE (the
  checkpoints rotate a quarter of each head; here the whole head), every bias.
"""

HELP = {
    "Llama-style": "Llama, Mistral, SmolLM: Pre-RMSNorm, SwiGLU, RoPE, 4 query heads over 2 key/value heads",
    "Qwen2-style": "Llama-style with biases on q, k and v",
    "Qwen3-style": "Llama-style with an RMSNorm on each head's q and k",
    "Pythia-style": "GPT-NeoX: attention and MLP in parallel, LayerNorm, GELU, RoPE, all biases",
}


def apply(name: str, shared: dict[str, object]) -> dict[str, object]:
    """The shared values after following the preset ``name`` from ``shared``."""
    return {**shared, **PRESETS[name]}


def matching(shared: dict[str, object]) -> str | None:
    """The preset the view is in, if any."""
    for name, values in PRESETS.items():
        if all(shared.get(k) == v for k, v in values.items()):
            return name
    return None
