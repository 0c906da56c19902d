"""How the app shows the library's settings: URL keys, labels, sidebar sections, ranges and grids.

The library's table (:data:`hessviz.block.config.SETTINGS`: each setting's kind, default, bounds, help
text and command-line flags) knows no app. This one adds, for every setting the app offers, what
the sidebar and the URL need (:class:`AppSetting`); a setting it does not list (``d_v``,
``rope_theta``, ``rotary_dim``) keeps its default in the app.

>>> SETTINGS[0].url, SETTINGS[0].label, SETTINGS[0].app_range, SETTINGS[0].help
('L', 'Sequence length L', (1, 64), 'tokens: rows of X')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hessviz.block import config
from hessviz.block.config import Setting

XNORM_GRID: tuple[float, ...] = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    50.0,
    100.0,
)
"""The input sizes ``‖X‖₂`` the app offers."""
APP_NORMS: tuple[str, ...] = config.NORMS
"""The placements the app offers: every one of the library's, Peri-LN (``MODEL.md`` part 5) included."""
EPS_GRID: tuple[float, ...] = (0.0, 1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 1e-2, 0.1, 1.0)
"""The LayerNorm ``ε`` values the app offers."""


def _always(values: Mapping[str, object]) -> bool:
    return True


def _has_ffn(values: Mapping[str, object]) -> bool:
    return values.get("norm") != "attention"


def _has_layernorm(values: Mapping[str, object]) -> bool:
    return values.get("norm") in config.NORMED


def _has_heads(values: Mapping[str, object]) -> bool:
    return int(values.get("n_heads") or 1) > 1


@dataclass(frozen=True)
class AppSetting(Setting):
    """A :class:`hessviz.block.config.Setting` as the app shows it.

    ``url`` is its key in the address and ``label`` its control's name. The app offers ints in
    ``app_range`` and floats on ``grid``; ``relevant`` says, from the other values (by field name),
    whether the setting matters (the sidebar disables it when not). ``section`` groups the sidebar
    (:data:`SECTIONS`); ``stacks_only`` draws it only on the pages that show stacks of blocks (one
    block elsewhere).
    """

    url: str = ""
    label: str = ""
    section: str = "block"
    app_range: tuple[int, int] | None = None
    grid: tuple[float, ...] | None = None
    stacks_only: bool = False
    relevant: Callable[[Mapping[str, object]], bool] = _always


def _shown(url: str, label: str, **how: object) -> dict[str, object]:
    return {"url": url, "label": label, **how}


SHOWN: dict[str, dict[str, object]] = {
    "seq_len": _shown("L", "Sequence length L", section="size", app_range=(1, 64)),
    "d_model": _shown("d", "Model width d", section="size", app_range=(1, 64)),
    "d_k": _shown("dk", "Key width d_k", section="size", app_range=(1, 64)),
    "d_ff": _shown("dff", "FFN width d_ff", section="size", app_range=(1, 256), relevant=_has_ffn),
    "norm": _shown("norm", "LayerNorm placement", choices=APP_NORMS),
    "activation": _shown("act", "Activation φ", relevant=_has_ffn),
    "loss": _shown("loss", "Loss"),
    "ln_eps": _shown("eps", "LayerNorm ε", section="input", grid=EPS_GRID, relevant=_has_layernorm),
    "n_heads": _shown("heads", "Attention heads", section="size", app_range=(1, 8)),
    "out_proj": _shown("wo", "Output projection W_O", section="layer"),
    "bias": _shown("bias", "Biases", section="layer"),
    "ln_affine": _shown("affine", "LayerNorm γ, β", section="layer", relevant=_has_layernorm),
    "causal": _shown("causal", "Causal mask", section="layer"),
    "n_layers": _shown("layers", "Layers", app_range=(1, 4), stacks_only=True),
    "n_kv_heads": _shown("kv", "Key/value heads", section="modern", app_range=(1, 8), relevant=_has_heads),
    "rope": _shown("rope", "Rotary positions", section="modern"),
    "qk_norm": _shown("qknorm", "QK-norm", section="modern"),
    "norm_type": _shown("ntype", "Norm type", section="modern", relevant=_has_layernorm),
    "mlp": _shown("mlp", "Feed-forward kind", section="modern", relevant=_has_ffn),
    "input_norm": _shown("xnorm", "Input size ‖X‖₂", section="input", grid=XNORM_GRID),
    "seed": _shown("seed", "Seed", section="input", app_range=(0, 9999)),
}
"""Field name -> how the app shows it, for every setting the app offers, in the sidebar's order."""


def _app_setting(s: Setting) -> AppSetting:
    return AppSetting(**({f.name: getattr(s, f.name) for f in dataclasses.fields(Setting)} | SHOWN[s.name]))


SETTINGS: tuple[AppSetting, ...] = tuple(_app_setting(s) for s in config.SETTINGS if s.name in SHOWN)
"""The settings the app offers (the block's fields, then the input's), in the library's order."""

SECTIONS: dict[str, str] = {
    "block": "Block",
    "size": "Sizes",
    "layer": "Real layer",
    "modern": "Modern block",
    "input": "Input",
}
"""Sidebar sections, in the order they are drawn."""


def relevant(name: str, values: Mapping[str, object]) -> bool:
    """Whether the setting ``name`` matters given ``values`` (by field name); a setting the app
    does not offer always does."""
    return name not in SHOWN or SHOWN[name].get("relevant", _always)(values)
