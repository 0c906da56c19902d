"""The shared view: what the sidebar controls describe, and how it maps to the URL.

Pure Python (no Streamlit), so it can be tested and reused. URL keys:

=======  ==========  ======================================
key      field       values
=======  ==========  ======================================
``L``    seq_len     1 … 64
``d``    d_model     1 … 64
``dk``   d_k         1 … 64
``dff``  d_ff        1 … 256
``norm`` norm        post | pre | none | attention
``act``  activation  relu | gelu
``loss`` loss        mse | ce
``xnorm`` ‖X‖₂       a value of :data:`XNORM_GRID`
``eps``  ln_eps      a value of :data:`EPS_GRID`
``seed`` seed        0 … 9999
=======  ==========  ======================================
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from urllib.parse import urlencode

import torch

import hessviz as hv
from hessviz.config import ACTIVATIONS, LOSSES, NORMS

XNORM_GRID: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                                 10.0, 20.0, 50.0, 100.0)
EPS_GRID: tuple[float, ...] = (0.0, 1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 1e-2, 0.1, 1.0)

DEFAULTS: dict[str, object] = {"L": 8, "d": 16, "dk": 8, "dff": 32, "norm": "post", "act": "relu",
                               "loss": "mse", "xnorm": 1.0, "eps": 0.0, "seed": 0}
"""The default view (URL key -> value); the app opens on it."""

INT_RANGES: dict[str, tuple[int, int]] = {"L": (1, 64), "d": (1, 64), "dk": (1, 64), "dff": (1, 256),
                                          "seed": (0, 9999)}
CHOICES: dict[str, tuple[str, ...]] = {"norm": NORMS, "act": ACTIVATIONS, "loss": LOSSES}
SHARED_KEYS: tuple[str, ...] = tuple(DEFAULTS)

NORM_LABELS = {"post": "Post-LN", "pre": "Pre-LN", "none": "no LN", "attention": "attention only"}
ACT_LABELS = {"relu": "ReLU", "gelu": "GELU"}
LOSS_LABELS = {"mse": "MSE", "ce": "cross-entropy"}


def device() -> torch.device:
    """Where the app computes: the first CUDA device when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_label() -> str:
    dev = device()
    if dev.type == "cuda":
        return f"CUDA ({torch.cuda.get_device_name(dev)})"
    return "CPU"


@dataclass(frozen=True)
class View:
    """One block, one input: everything a page needs to compute.

    ``values`` holds the shared controls by URL key (see the module docstring).
    Build one with :meth:`from_values`; it raises :class:`hessviz.HessvizError` with
    a message naming the control when the combination is not a valid block.
    """

    cfg: hv.BlockConfig
    input_norm: float
    seed: int

    @classmethod
    def from_values(cls, values: dict[str, object]) -> View:
        v = {**DEFAULTS, **values}
        cfg = hv.BlockConfig(seq_len=int(v["L"]), d_model=int(v["d"]), d_k=int(v["dk"]),
                             d_ff=int(v["dff"]), norm=str(v["norm"]), activation=str(v["act"]),
                             loss=str(v["loss"]), ln_eps=float(v["eps"]))
        return cls(cfg, float(v["xnorm"]), int(v["seed"]))

    @property
    def values(self) -> dict[str, object]:
        """URL key -> value."""
        c = self.cfg
        return {"L": c.seq_len, "d": c.d_model, "dk": c.d_k, "dff": c.d_ff, "norm": c.norm,
                "act": c.activation, "loss": c.loss, "xnorm": self.input_norm, "eps": c.ln_eps,
                "seed": self.seed}

    @property
    def key(self) -> tuple:
        """Hashable identity, used as the cache key of every computation."""
        return tuple(self.values.items())

    def describe(self) -> str:
        """One line in words, e.g. ``Post-LN block, L = 8, d = 16, …, ‖X‖₂ = 1, seed 0``."""
        return f"{self.cfg.describe(self.input_norm)}, seed {self.seed}"

    @property
    def num_params(self) -> int:
        return self.cfg.num_params

    @property
    def term_bytes(self) -> int:
        """Bytes of one dense ``(P, P)`` float64 Hessian term."""
        return self.cfg.num_params ** 2 * 8

    @cached_property
    def inputs(self) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """``(params, X, Y)`` drawn from ``seed`` on :func:`device`, float64."""
        dev = device()
        params = hv.init_params(self.cfg, seed=self.seed, device=dev)
        X, Y = hv.sample_inputs(self.cfg, seed=self.seed, input_norm=self.input_norm, device=dev)
        return params, X, Y

    def with_values(self, **changes: object) -> View:
        """A copy with some URL keys changed, e.g. ``view.with_values(norm="pre")``."""
        return View.from_values({**self.values, **changes})


def format_value(key: str, value: object) -> str | list[str]:
    """How a value is written in the URL (``1.0 -> "1"``, ``1e-05 -> "1e-05"``); a list is
    written as a repeated key (``?terms=full&terms=outer``), as Streamlit binds multi-selections."""
    if isinstance(value, (list, tuple)):
        return [format_value(key, v) for v in value]
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def query_string(values: dict[str, object], extra: dict[str, object] | None = None,
                 only_changed: bool = True) -> str:
    """``"norm=pre&L=6"``: the shared values that differ from :data:`DEFAULTS`, then ``extra``."""
    items = {k: v for k, v in values.items() if not only_changed or DEFAULTS.get(k) != v}
    items.update(extra or {})
    return urlencode({k: format_value(k, v) for k, v in items.items()}, doseq=True)


def parse_value(key: str, text: str) -> object:
    """Parse one URL value for ``key``; raise ``ValueError`` when it is not allowed."""
    if key in INT_RANGES:
        lo, hi = INT_RANGES[key]
        value = int(text)
        if not lo <= value <= hi:
            raise ValueError(f"{key} must be in [{lo}, {hi}], got {value}")
        return value
    if key in CHOICES:
        if text not in CHOICES[key]:
            raise ValueError(f"{key} must be one of {', '.join(CHOICES[key])}, got {text!r}")
        return text
    grid = {"xnorm": XNORM_GRID, "eps": EPS_GRID}[key]
    value = float(text)
    if value not in grid:
        raise ValueError(f"{key} must be one of {', '.join(f'{g:g}' for g in grid)}, got {text!r}")
    return value
