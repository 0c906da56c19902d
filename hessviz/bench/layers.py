"""The real-layer shapes the benchmarks time, written once.

``REAL_FEATURES`` is what makes a block a *real* encoder layer rather than the papers' bare one:
``W_O``, every bias, LayerNorm's γ/β, Post-LN and GELU (under the MSE loss the benchmarks use);
:data:`MINILM` adds all-MiniLM-L6-v2's sizes (``d = 384``, 12 heads of 32, ``d_ff = 1536``,
``ε = 1e-12``), :data:`REAL_LAYER` the small sizes of the dense benchmark's real-layer case.
"""

from __future__ import annotations

import hessviz as hv

REAL_FEATURES: dict[str, object] = {
    "out_proj": True,
    "bias": True,
    "ln_affine": True,
    "norm": "post",
    "activation": "gelu",
    "loss": "mse",
}
MINILM: dict[str, object] = {
    "d_model": 384,
    "d_k": 32,
    "n_heads": 12,
    "d_ff": 1536,
    "ln_eps": 1e-12,
    **REAL_FEATURES,
}
"""A MiniLM-sized layer's :class:`~hessviz.BlockConfig` fields but ``seq_len``."""
REAL_LAYER = hv.BlockConfig(seq_len=64, d_model=32, d_k=8, d_ff=64, n_heads=4, **REAL_FEATURES)
"""The issue's real-layer case: Post-LN, 4 heads, W_O, biases, γ/β, GELU."""
