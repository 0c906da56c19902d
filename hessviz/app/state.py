"""The shared view: what the sidebar controls describe, and how it maps to the URL.

Pure Python (no Streamlit), so it can be tested and reused. Every control and its URL key
come from :data:`hessviz.app.settings.SETTINGS` (the block's fields, then the input's): an int
within its ``app_range``, a float on its ``grid``, a choice, or ``true``/``false``. For
example ``L`` is ``seq_len`` in 1 … 64, ``norm`` one of post | pre | none | attention,
``heads`` the number of heads, ``xnorm`` the input's ``‖X‖₂``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from urllib.parse import urlencode

import torch

import hessviz as hv
from hessviz.app import settings
from hessviz.app.settings import SETTINGS, AppSetting
from hessviz.block.config import BLOCK_SETTINGS, INPUT_SETTINGS, NORMED

APP_SETTINGS: dict[str, AppSetting] = {s.url: s for s in SETTINGS}
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
        url = {s.name: s.url for s in SETTINGS}
        chosen = {s.name: v[url[s.name]] if s.name in url else s.default for s in BLOCK_SETTINGS}
        # a control the block does not use (disabled in the sidebar) keeps its value for later
        # but the block takes the default: LN γ/β or RMSNorm without a LayerNorm, a gated MLP
        # for attention alone
        fields = {
            s.name: chosen[s.name] if settings.relevant(s.name, chosen) else s.default for s in BLOCK_SETTINGS
        }
        inputs = {s.name: v[url[s.name]] for s in INPUT_SETTINGS}
        return cls(hv.BlockConfig(**fields), float(inputs["input_norm"]), int(inputs["seed"]))

    @property
    def values(self) -> dict[str, object]:
        """URL key -> value."""
        given = {"input_norm": self.input_norm, "seed": self.seed}
        return {
            k: given[s.name] if s.name in given else getattr(self.cfg, s.name)
            for k, s in APP_SETTINGS.items()
        }

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
        return self.cfg.num_params**2 * 8

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
    setting = APP_SETTINGS.get(key)
    if setting is not None and setting.members:  # bias=Q,K,V: one value
        return setting.format(value)
    if isinstance(value, (list, tuple)):
        return [format_value(key, v) for v in value]
    if setting is not None:
        return setting.format(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def query_string(
    values: dict[str, object], extra: dict[str, object] | None = None, only_changed: bool = True
) -> str:
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
    if value is None and setting.optional:
        return value
    if setting.app_range is not None:
        lo, hi = setting.app_range
        if not lo <= value <= hi:
            raise ValueError(f"{key} must be in [{lo}, {hi}], got {value}")
    if setting.grid is not None and value not in setting.grid:
        raise ValueError(f"{key} must be one of {', '.join(f'{g:g}' for g in setting.grid)}, got {text!r}")
    return value


# ----------------------------------------------------------------------------- a visitor's text

SHOWN_CHARS = 40
"""How much of a refused URL value a message repeats."""


def shown(text: str) -> str:
    """A refused URL value as a message repeats it: at most :data:`SHOWN_CHARS` characters, each
    control character (a line break, a tab, a direction override) as ``?``. Still the visitor's
    text: the app draws a message through :func:`plain`, never as Markdown."""
    clean = "".join(c if c.isprintable() else "?" for c in str(text))
    return clean if len(clean) <= SHOWN_CHARS else clean[:SHOWN_CHARS] + "…"


_MARKUP = re.compile(r"[!-/:-@\[-`{-~]")
"""Every ASCII punctuation character: the ones CommonMark lets a backslash escape."""
_JOINED = re.compile(r"(?<=[:@])(?=\S)|(?<=www)(?=\.)", re.IGNORECASE)
"""Where a word joiner goes: after a colon or an at sign that a character follows, between ``www``
and its dot."""


def sentence(text: object) -> str:
    """``text`` (an error's words) as a sentence: its first word capitalised when it is an ordinary
    lower-case word, and a full stop at its end. A name the visitor types or reads as it is
    (``d_model``, ``eps:``, ``mlp='gated'``, ``smollm2-135m``) keeps its case.

    >>> sentence("the weights of smollm2-135m need about 810 MiB"), sentence("d_model must be >= 2")
    ('The weights of smollm2-135m need about 810 MiB.', 'd_model must be >= 2.')
    """
    text = str(text).strip()
    if not text:
        return ""
    word = text.split(" ", 1)[0]
    text = text[:1].upper() + text[1:] if word.isalpha() and word.islower() else text
    return text if text[-1] in ".!?)" else text + "."


def plain(text: object) -> str:
    r"""``text`` as Markdown that Streamlit draws as these very characters: the one way a visitor's
    text (a URL value, a text box, a message that repeats either) enters ``st.markdown``,
    ``st.caption``, ``st.warning``, ``st.error`` and the like.

    - Every ASCII punctuation character gets a backslash, which CommonMark reads as that character
      and nothing else: no link ``[a](b)``, image ``![a](b)``, emphasis, code span, HTML tag or
      entity, math ``$…$`` or Streamlit directive ``:red[…]`` can form, and Streamlit's raw
      ``:material/…:`` rewrite finds no match.
    - A line break or other control character becomes a space, so the text stays inside its line:
      no heading, list, quote, table or code block can start.
    - Streamlit's renderer then rewrites the text it has parsed, where escapes no longer count: GFM
      links a bare ``https://…``, ``www.…`` or ``a@b.c`` (seen in Chromium), and shortcodes become
      the Streamlit logo (``:streamlit:``), an icon (``:material_home:``) or an emoji. A colon or an
      at sign before a character, and ``www`` before its dot, get an invisible word joiner (U+2060),
      which none of those patterns matches.

    >>> print(plain("[Log in](https://x.example) <b>hi</b> **1**").replace("\u2060", "|"))
    \[Log in\]\(https\:|\/\/x\.example\) \<b\>hi\<\/b\> \*\*1\*\*
    >>> print(plain("a\n# b :streamlit: www.x.org a@b.c").replace("\u2060", "|"))
    a \# b \:|streamlit\: www|\.x\.org a\@|b\.c
    """
    one_line = "".join(c if c.isprintable() else " " for c in str(text))
    return _MARKUP.sub(lambda m: "\\" + m.group(), _JOINED.sub("\u2060", one_line))


def nearest_on_grid(value: float, grid: tuple[float, ...]) -> float:
    """The grid value nearest to ``value`` on a log scale (grids span decades); ≤ 0 gives the smallest."""
    positive = [g for g in grid if g > 0]
    if value <= 0 or not positive:
        return min(grid)
    return min(positive, key=lambda g: abs(math.log(value) - math.log(g)))


def settle(
    key: str,
    texts: list[str],
    default: object,
    *,
    options: tuple | None = None,
    int_range: tuple[int, int] | None = None,
    grid: tuple[float, ...] | None = None,
    multi: bool = False,
    parse: Callable[[str], object] | None = None,
) -> tuple[object, str | None]:
    """The value the app uses for a URL key written ``texts`` (every occurrence, in order), and a
    one-line note when that is not exactly what the URL asked (``None`` when it is).

    A value out of ``int_range`` is clamped to it, a number off ``grid`` goes to the nearest grid
    value, anything else that is not allowed (not a number, NaN, ∞, not one of ``options``) falls
    back to ``default``. A key given several times uses the last (``multi`` keys keep all their
    allowed values). ``parse`` checks one text first (raises ``ValueError``). A note is plain text
    that repeats the URL's text cut by :func:`shown`: the app draws it through :func:`plain`.

    >>> settle("L", ["100000"], 8, int_range=(1, 64))
    (64, 'L=100000 is out of range 1 … 64: used L = 64.')
    >>> settle("L", ["4", "16"], 8, int_range=(1, 64))
    (16, 'L was given 2 times (4, 16): used the last, L = 16.')
    >>> settle("xnorm", ["nan"], 1.0, grid=(0.1, 1.0, 10.0))
    (1.0, 'xnorm=nan is not a finite number: used the default, xnorm = 1.')
    """
    if not texts:
        return default, None
    fmt = (lambda v: f"{v:g}") if grid is not None else str
    if multi:
        allowed = [t for t in texts if options is None or t in options]
        bad = [t for t in texts if t not in allowed]
        if not bad:
            return allowed, None
        note = f"{key} has values that are not options ({shown(', '.join(bad))}): ignored them."
        return allowed or list(default), note
    note = None
    if len(texts) > 1:
        note = f"{key} was given {len(texts)} times ({shown(', '.join(texts))}): used the last, "
    text = texts[-1]
    try:
        value = parse(text) if parse is not None else _parse_plain(text, options, int_range, grid)
        return value, None if note is None else f"{note}{key} = {fmt(value)}."
    except ValueError:
        pass
    head = f"{key}={shown(text)}"
    if options is not None:
        return default, f"{head} is not one of {', '.join(options)}: used the default, {key} = {default}."
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        what = "an integer" if int_range is not None else "a finite number"
        return default, f"{head} is not {what}: used the default, {key} = {fmt(default)}."
    if int_range is not None:
        lo, hi = int_range
        value = int(min(max(round(number), lo), hi))
        why = "is not an integer" if lo <= number <= hi else f"is out of range {lo} … {hi}"
        return value, f"{head} {why}: used {key} = {value}."
    if grid is not None:
        value = nearest_on_grid(number, grid)
        return value, f"{head} is not offered: used the nearest, {key} = {value:g}."
    return default, f"{head} is not allowed: used the default, {key} = {fmt(default)}."


def _parse_plain(text: str, options, int_range, grid) -> object:
    if options is not None:
        if text not in options:
            raise ValueError(text)
        return text
    if int_range is not None:
        value = int(text)
        if not int_range[0] <= value <= int_range[1]:
            raise ValueError(text)
        return value
    if grid is not None:
        value = float(text)
        if value not in grid:
            raise ValueError(text)
        return value
    return text


def settle_shared(key: str, texts: list[str]) -> tuple[object, str | None]:
    """:func:`settle` for a shared control of :data:`APP_SETTINGS` (its range, grid or choices)."""
    s = APP_SETTINGS[key]
    value, note = settle(
        key,
        texts,
        s.default,
        options=s.choices,
        int_range=s.app_range,
        grid=s.grid,
        parse=lambda t: parse_value(key, t),
    )
    if s.kind is bool and texts:
        if note is not None and value is s.default:
            note = (
                f"{key}={shown(texts[-1])} is not true or false: used the default, {key} = {s.format(value)}."
            )
        elif note is None and texts[-1] != s.format(value):  # wo=1, wo=yes: say how it was read
            note = f"{key}={shown(texts[-1])} read as {key} = {s.format(value)}."
    return value, note


def reconcile(values: dict[str, object]) -> tuple[dict[str, object], list[str]]:
    """The shared values with the couplings a student would otherwise trip over made for them, and
    one line for each, in the controls' own words: more than one head needs the output projection
    ``W_O`` (``wo``), which is turned on rather than refusing the view; key/value heads must divide
    the heads; LayerNorm with ε = 0 (and the cross-entropy's classes) need a width d ≥ 2; rotary
    positions need an even key width d_k; a bias needs its projection.

    >>> values, notes = reconcile({"heads": 2, "wo": False})
    >>> values, notes[0][:44]
    ({'heads': 2, 'wo': True}, '2 attention heads need the output projection')
    >>> reconcile({**DEFAULTS, "d": 1})[1]
    ['Model width d = 1: LayerNorm with ε = 0 needs d ≥ 2 (one feature has no variance), so d = 2 is used.']
    """
    out, notes = dict(values), []
    heads = int(out.get("heads", 1))
    if heads > 1 and not out.get("wo", False):
        out["wo"] = True
        notes.append(f"{heads} attention heads need the output projection W_O to join them: turned W_O on.")
    kv = out.get("kv")
    if kv is not None and heads > 1 and heads % int(kv):  # one head: the control is off, kept
        out["kv"] = max(g for g in range(1, min(int(kv), heads) + 1) if heads % g == 0)
        notes.append(
            f"Key/value heads = {kv} does not divide the {heads} attention heads: used "
            f"{out['kv']} key/value head{'s' if out['kv'] > 1 else ''}."
        )
    d = int(out.get("d", DEFAULTS["d"]))
    norm = out.get("norm", DEFAULTS["norm"])
    layernorm = norm in NORMED and out.get("ntype", DEFAULTS["ntype"]) == "layernorm"
    if d < 2 and layernorm and float(out.get("eps", DEFAULTS["eps"])) == 0:
        out["d"] = 2
        notes.append(
            "Model width d = 1: LayerNorm with ε = 0 needs d ≥ 2 (one feature has no variance), "
            "so d = 2 is used."
        )
    elif d < 2 and out.get("loss", DEFAULTS["loss"]) == "ce":
        out["d"] = 2
        notes.append(
            "Model width d = 1: the cross-entropy loss needs d ≥ 2 (its classes are the d "
            "features), so d = 2 is used."
        )
    dk = int(out.get("dk", DEFAULTS["dk"]))
    if out.get("rope") and dk % 2:
        out["dk"] = dk + 1
        notes.append(
            f"Key width d_k = {dk}: rotary positions turn pairs of features, so d_k = {dk + 1} is used."
        )
    bias = out.get("bias")
    if isinstance(bias, tuple):
        kept = tuple(b for b in bias if b in bias_letters(out))
        if kept != bias:
            out["bias"] = kept or False
            gone = ", ".join(f"b_{b}" for b in bias if b not in kept)
            notes.append(f"This block has no projection for {gone}: dropped from the biases.")
    return out, notes


def bias_letters(values: dict[str, object]) -> tuple[str, ...]:
    """The projections that can carry a bias in the block the shared ``values`` describe: ``O`` with
    ``W_O``, ``G`` with a gated MLP, ``G 1 2`` only with a feed-forward branch.

    >>> bias_letters({"wo": False, "mlp": "gated", "norm": "pre"})
    ('Q', 'K', 'V', 'G', '1', '2')
    """
    ffn = values.get("norm", DEFAULTS["norm"]) != "attention"
    exists = {"O": bool(values.get("wo")), "G": ffn and values.get("mlp") == "gated", "1": ffn, "2": ffn}
    return tuple(b for b in APP_SETTINGS["bias"].members if exists.get(b, True))
