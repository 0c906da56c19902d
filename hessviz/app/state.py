"""The shared view: what the sidebar controls describe, and how it maps to the URL.

Pure Python (no Streamlit), so it can be tested and reused. Every control and its URL key
come from :data:`hessviz.config.SETTINGS` (the block's fields, then the input's): an int
within its ``app_range``, a float on its ``grid``, a choice, or ``true``/``false``. For
example ``L`` is ``seq_len`` in 1 … 64, ``norm`` one of post | pre | none | attention,
``heads`` the number of heads, ``xnorm`` the input's ``‖X‖₂``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from urllib.parse import urlencode

import torch

import hessviz as hv
from hessviz.config import BLOCK_SETTINGS, INPUT_SETTINGS, SETTINGS, Setting

APP_SETTINGS: dict[str, Setting] = {s.url: s for s in SETTINGS if s.in_app}
"""URL key -> setting, for every control the app shows."""

DEFAULTS: dict[str, object] = {k: s.default for k, s in APP_SETTINGS.items()}
"""The default view (URL key -> value); the app opens on it."""

SHARED_KEYS: tuple[str, ...] = tuple(DEFAULTS)


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
        fields = {s.name: v[s.url] if s.in_app else s.default for s in BLOCK_SETTINGS}
        inputs = {s.name: v[s.url] for s in INPUT_SETTINGS}
        return cls(hv.BlockConfig(**fields), float(inputs["input_norm"]), int(inputs["seed"]))

    @property
    def values(self) -> dict[str, object]:
        """URL key -> value."""
        given = {"input_norm": self.input_norm, "seed": self.seed}
        return {k: given[s.name] if s.name in given else getattr(self.cfg, s.name)
                for k, s in APP_SETTINGS.items()}

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
    """How a value is written in the URL (``1.0 -> "1"``, ``True -> "true"``); a list is
    written as a repeated key (``?terms=full&terms=outer``), as Streamlit binds multi-selections."""
    if isinstance(value, (list, tuple)):
        return [format_value(key, v) for v in value]
    setting = APP_SETTINGS.get(key)
    if setting is not None:
        return setting.format(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def query_string(values: dict[str, object], extra: dict[str, object] | None = None,
                 only_changed: bool = True) -> str:
    """``"norm=pre&L=6"``: the shared values that differ from :data:`DEFAULTS`, then ``extra``."""
    items = {k: v for k, v in values.items() if not only_changed or DEFAULTS.get(k) != v}
    items.update(extra or {})
    return urlencode({k: format_value(k, v) for k, v in items.items()}, doseq=True)


def parse_value(key: str, text: str) -> object:
    """Parse one URL value for ``key``; raise ``ValueError`` when the app does not offer it
    (out of the control's range or grid, not a choice, not a number)."""
    setting = APP_SETTINGS[key]
    try:
        value = setting.parse(text)
    except hv.HessvizError as err:
        raise ValueError(f"{key}: {err}") from None
    if setting.app_range is not None:
        lo, hi = setting.app_range
        if not lo <= value <= hi:
            raise ValueError(f"{key} must be in [{lo}, {hi}], got {value}")
    if setting.grid is not None and value not in setting.grid:
        raise ValueError(f"{key} must be one of {', '.join(f'{g:g}' for g in setting.grid)}, got {text!r}")
    return value
