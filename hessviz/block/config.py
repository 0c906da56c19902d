"""The block configuration, its settings table, and the conventions every module shares.

Conventions (fixed once, here)
------------------------------
* ``L`` = ``seq_len`` tokens, ``d`` = ``d_model`` features; a sequence is ``X`` of shape
  ``(L, d)``, one row per token.
* ``vec_r`` is row-major flattening (``tensor.reshape(-1)``); every Jacobian and Hessian
  is taken with respect to ``vec_r`` of its parameters.
* The paper block's parameters, in this order: ``W_Q (d, d_k)``, ``W_K (d, d_k)``,
  ``W_V (d, d)``, ``W_1 (d, d_ff)``, ``W_2 (d_ff, d)``; the placement ``attention`` has
  only the first three. A real layer (``MODEL.md`` part 2) adds heads, ``W_O``, biases
  (vectors ``(n,)``) and LayerNorm scale and shift, each in the order the forward pass
  first uses it (:attr:`BlockConfig.param_names`). Part 3 adds the gate ``W_G (d, d_ff)``, ``b_G``
  (``mlp="gated"``, before ``W_1``), RMSNorm (``norm_type``; ``γ`` without ``β``), biases on some
  projections only (``bias`` a tuple of :data:`BIAS_LETTERS`) and the parallel placement.
  ``θ`` is their ``vec_r`` concatenated in that order and ``P = len(θ)``.
* Head ``h`` of ``W_Q``, ``W_K``, ``b_Q``, ``b_K`` is columns ``h·d_k … (h+1)·d_k − 1``; of
  ``W_V``, ``b_V`` columns ``h·d_v …``; of ``W_O`` the same rows. ``"W_Q[h]"`` names that
  slice, ``vec_r`` of the slice.
* A stack (``n_layers = N > 1``) is ``N`` blocks of one shape, each with its own weights:
  every name is prefixed by its layer, ``l0.W_Q … l1.W_Q …``, layer 0 first (``l1.W_Q[2]``
  is a head slice of layer 1). With one layer the names carry no prefix.
* Weights multiply from the right: ``X @ W``.
* ``J = ∂ vec_r(Z) / ∂θ`` has shape ``(L*d, P)``; its row ``t*d + j`` is output
  feature ``j`` of token ``t``.

Every user-facing setting is declared once, as a :class:`Setting` in the metadata of its
:class:`BlockConfig` field (or in :data:`INPUT_SETTINGS` for the input): its type, bounds,
help text and CLI flags. The command line reads :data:`SETTINGS`; the app adds how it shows
each one (URL key, label, range) in :mod:`hessviz.app.settings`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import torch

from hessviz.errors import ConfigError
from hessviz.ops.activations import ACTIVATIONS as _ACTIVATION_OPS

NORMS = ("post", "pre", "none", "attention", "parallel", "peri")
NORMED = ("post", "pre", "parallel", "peri")
"""The placements with a LayerNorm (or RMSNorm): where ``ln_eps``, ``ln_affine`` and ``norm_type`` matter."""
NORM_TYPES = ("layernorm", "rmsnorm")
MLPS = ("plain", "gated")
PER_LAYER = ("window", "rope_theta")
"""The fields the layers of a stack may hold one value each of (a tuple of ``n_layers`` values;
Gemma 3's local and global layers, ``MODEL.md`` part 5)."""
BIAS_LETTERS: dict[str, str] = {
    "Q": "b_Q",
    "K": "b_K",
    "V": "b_V",
    "O": "b_O",
    "G": "b_G",
    "1": "b_1",
    "2": "b_2",
}
"""The projections a ``bias`` tuple may name, and the bias each one adds."""
ACTIVATIONS = tuple(_ACTIVATION_OPS)
"""The ``activation`` choices: the rows of :data:`hessviz.ops.activations.ACTIVATIONS`."""
LOSSES = ("mse", "ce")
ATTENTION_PARAMS = ("W_Q", "W_K", "W_V")
FFN_PARAMS = ("W_1", "W_2")

NORM_TITLES = {
    "post": "Post-LN block",
    "pre": "Pre-LN block",
    "none": "Block without LN",
    "attention": "Self-attention alone",
    "parallel": "Parallel block",
    "peri": "Peri-LN block",
}
ACTIVATION_TITLES = {name: op.title for name, op in _ACTIVATION_OPS.items()}
LOSS_TITLES = {"mse": "MSE", "ce": "cross-entropy"}

TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


# ----------------------------------------------------------------------------- the settings table


@dataclass(frozen=True)
class Setting:
    """One user-facing setting: what it is, where it may range, and how it is spelled.

    ``kind`` is ``int``, ``float``, ``str`` (one of ``choices``) or ``bool``; ``minimum`` is
    the library's lower bound (ints and floats), ``optional`` allows ``None``; ``short`` and
    ``alias`` are more command-line flags. ``members``: a ``bool`` setting that may also be a
    tuple of these words (``bias``), written ``Q,K,V`` on the command line (or in a URL).
    How the app shows a setting is :class:`hessviz.app.settings.AppSetting`.
    """

    help: str
    kind: type
    default: object
    minimum: float | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False
    short: str | None = None
    alias: str | None = None
    members: tuple[str, ...] | None = None
    name: str = ""

    @property
    def flag(self) -> str:
        """The long command-line flag, ``--d-model`` for ``d_model``."""
        return "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(f for f in (self.short, self.flag, self.alias) if f)

    def check(self, value: object) -> object:
        """``value`` if allowed, else :class:`ConfigError` naming the field and what is allowed."""
        if value is None and self.optional:
            return None
        if self.kind is bool and self.members and isinstance(value, tuple):
            unknown = [v for v in value if v not in self.members]
            if unknown or len(set(value)) != len(value):
                raise ConfigError(
                    f"{self.name} must be True, False or a tuple of distinct names from "
                    f"{self.members}, got {value!r}"
                )
        elif self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(
                    f"{self.name} must be True or False"
                    f"{' or a tuple of ' + ', '.join(self.members) if self.members else ''}"
                    f", got {value!r}"
                )
        elif self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
                raise ConfigError(
                    f"{self.name} must be an integer >= {self.minimum:g}"
                    f"{' or None' if self.optional else ''}, got {value!r}"
                )
        elif self.kind is float:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < self.minimum
            ):
                raise ConfigError(f"{self.name} must be a finite number >= {self.minimum:g}, got {value!r}")
        elif value not in self.choices:
            raise ConfigError(
                f"{self.name} must be one of {', '.join(map(repr, self.choices))}, got {value!r}"
            )
        return value

    def parse(self, text: str) -> object:
        """The value written as ``text`` (a URL or command-line word), checked; ``ValueError``
        (a :class:`ConfigError`) naming the field when it is not allowed."""
        if not isinstance(text, str):
            raise ConfigError(f"{self.name} must be given as text, got {type(text).__name__}")
        word = text.strip()
        if self.optional and word.lower() in ("", "none"):
            return None
        if self.kind is bool and self.members and word.lower() not in TRUE_WORDS + FALSE_WORDS:
            return self.check(tuple(w.strip() for w in word.split(",") if w.strip()))
        try:
            value: object
            if self.kind is bool:
                if word.lower() not in TRUE_WORDS + FALSE_WORDS:
                    raise ValueError(word)
                value = word.lower() in TRUE_WORDS
            elif self.kind is int:
                value = int(word)
            elif self.kind is float:
                value = float(word)
            else:
                value = word
        except ValueError:
            kinds = {bool: "true or false", int: "an integer", float: "a number"}
            raise ConfigError(f"{self.name} must be {kinds[self.kind]}, got {text[:40]!r}") from None
        return self.check(value)

    def format(self, value: object) -> str:
        """How ``value`` is written in a URL: ``1.0 -> "1"``, ``True -> "true"``."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


def setting(default: object, help: str, kind: type | None = None, **spec: object):
    """A :class:`BlockConfig` field whose :class:`Setting` lives in its metadata."""
    kind = kind or type(default)
    return field(default=default, metadata={"setting": Setting(help, kind, default, **spec)})


# ----------------------------------------------------------------------------- parameter names

HEADED: dict[str, int] = {"W_Q": 1, "W_K": 1, "W_V": 1, "W_O": 0, "b_Q": 0, "b_K": 0, "b_V": 0}
"""Parameters that are split by head, and the axis that holds the heads."""

KV_HEADED = ("W_K", "W_V", "b_K", "b_V")
"""The headed parameters whose heads are the key/value heads (``n_kv_heads`` of them)."""

_ATTENTION_ORDER = ("W_Q", "b_Q", "q_norm_gamma", "W_K", "b_K", "k_norm_gamma", "W_V", "b_V", "W_O", "b_O")
_FFN_ORDER = ("W_G", "b_G", "W_1", "b_1", "W_2", "b_2")
_LN1, _LN2 = ("ln1_gamma", "ln1_beta"), ("ln2_gamma", "ln2_beta")
_LN1_OUT, _LN2_OUT = ("ln1_out_gamma", "ln1_out_beta"), ("ln2_out_gamma", "ln2_out_beta")
_NAME = re.compile(r"^(?P<base>(l\d+\.)?[A-Za-z_][A-Za-z0-9_]*)(\[(?P<head>-?\d+)\])?$")
_LAYER = re.compile(r"^l(?P<layer>\d+)\.(?P<local>.+)$")


class ParamRef(NamedTuple):
    """A parameter name split into its base weight and head (``None`` for the whole weight);
    in a stack the base keeps its layer prefix (``"l1.W_Q[2]" -> ("l1.W_Q", 2)``)."""

    base: str
    head: int | None


def parse_name(name: str) -> ParamRef:
    """``"W_Q[3]" -> ParamRef("W_Q", 3)``, ``"W_1" -> ParamRef("W_1", None)``,
    ``"l1.W_Q[2]" -> ParamRef("l1.W_Q", 2)``."""
    m = _NAME.match(name) if isinstance(name, str) else None
    if m is None:
        raise ConfigError(
            f"parameter name must be a weight name such as 'W_Q' or a head slice such as "
            f"'W_Q[0]' (in a stack prefixed by its layer, 'l1.W_Q'), got {name!r}"
        )
    head = m.group("head")
    return ParamRef(m.group("base"), None if head is None else int(head))


def split_layer(name: str) -> tuple[int | None, str]:
    """``"l1.W_Q[2]" -> (1, "W_Q[2]")``; a name without a layer prefix -> ``(None, name)``."""
    m = _LAYER.match(name)
    return (None, name) if m is None else (int(m.group("layer")), m.group("local"))


def layer_name(layer: int, local: str) -> str:
    """``(1, "W_Q[2]") -> "l1.W_Q[2]"``."""
    return f"l{layer}.{local}"


# ----------------------------------------------------------------------------- the block


@dataclass(frozen=True)
class BlockConfig:
    """One Transformer block, as fixed by ``MODEL.md`` (parts 1 and 2).

    ``norm`` places the LayerNorm: ``post`` ``Z = LN(Z1 + FFN(Z1)), Z1 = LN(X + SA(X))``;
    ``pre`` ``Z = Z1 + FFN(LN(Z1)), Z1 = X + SA(LN(X))``; ``none`` without LayerNorm;
    ``attention`` the single self-attention layer ``Z = SA(X)``; ``parallel``
    ``Z = X + SA(LN(X)) + FFN(LN(X))`` (``MODEL.md`` part 3, with the other fields of that part);
    ``peri`` ``Z1 = X + LN(SA(LN(X))), Z = Z1 + LN(FFN(LN(Z1)))``, four norms (``MODEL.md`` part 5).
    The defaults are the papers' block: one head, no ``W_O``, no biases, LayerNorm without scale
    and shift.
    """

    seq_len: int = setting(8, "tokens: rows of X", minimum=1, short="-L")
    d_model: int = setting(16, "features: columns of X", minimum=1, short="-d")
    d_k: int = setting(8, "columns of W_Q and W_K per head", minimum=1)
    d_ff: int = setting(32, "hidden units of the feed-forward layer", minimum=1)
    norm: str = setting(
        "post",
        "post: LN after each residual sum; pre: LN before attention and FFN; none: "
        "residuals without LN; attention: the single self-attention layer "
        "SA(X) = softmax(X W_Q W_Kᵀ Xᵀ/√d_k) X W_V; parallel: X + SA(LN(X)) + FFN(LN(X)) "
        "(GPT-NeoX); peri: LN on each sublayer's input and output, X + LN(SA(LN(X))) (Gemma 2 and 3).",
        choices=NORMS,
    )
    activation: str = setting(
        "relu",
        "φ in FFN(Z) = φ(Z W_1) W_2: ReLU, GELU (exact erf form), GELU-tanh "
        "(GPT-2's approximation) or SiLU (u·sigmoid(u))",
        choices=ACTIVATIONS,
    )
    loss: str = setting(
        "mse",
        "mse: ‖Z − Y‖²/(L d) against a Gaussian target Y; ce: cross-entropy with d classes",
        choices=LOSSES,
    )
    ln_eps: float = setting(
        0.0, "LN(z) = (z − mean z)/√(var z + ε); ε = 0 as in the papers", kind=float, minimum=0.0
    )
    n_heads: int = setting(
        1,
        "heads of width d_k each; more than one needs the output projection W_O",
        minimum=1,
        alias="--heads",
    )
    out_proj: bool = setting(False, "SA(X) = concat_h(A_h V_h) W_O (+ b_O); required with more than one head")
    d_v: int | None = setting(
        None, "value width of one head (default: d_k with W_O, d without)", kind=int, minimum=1, optional=True
    )
    bias: bool | tuple[str, ...] = setting(
        False,
        "a bias on every linear map: b_Q, b_K, b_V, b_O, (b_G,) b_1, b_2; or a "
        "tuple naming the projections that have one, from Q, K, V, O, G, 1, 2 (Qwen2: Q,K,V)",
        members=tuple(BIAS_LETTERS),
    )
    ln_affine: bool = setting(False, "learnable LayerNorm scale γ and shift β in every LayerNorm")
    causal: bool = setting(False, "token t attends to tokens s ≤ t only")
    n_layers: int = setting(
        1,
        "a stack of this many blocks of this shape, each with "
        "its own weights (names l0.W_Q, l1.W_Q, …); the loss is on the last Z",
        minimum=1,
        alias="--layers",
    )
    n_kv_heads: int | None = setting(
        None,
        "grouped-query attention: W_K, W_V "
        "have this many heads; query head h reads key/value head "
        "h // (n_heads / n_kv_heads) (default: n_heads; 1 is multi-query)",
        kind=int,
        minimum=1,
        optional=True,
    )
    rope: bool = setting(
        False,
        "rotate each head's q and k by the token's "
        "position before the score (Hugging Face's rotate_half layout)",
    )
    rope_theta: float | tuple[float, ...] = setting(
        10000.0,
        "the base of the rotary frequencies ω_i = θ^(−2i/rotary_dim); > 0 "
        "(in a stack also one value per layer)",
        kind=float,
        minimum=0.0,
    )
    rotary_dim: int | None = setting(
        None,
        "rotate only the first rotary_dim features of each head (even, ≤ d_k; default d_k)",
        kind=int,
        minimum=1,
        optional=True,
    )
    qk_norm: bool = setting(
        False,
        "an RMSNorm over each head's q and k (width "
        "d_k, ε = ln_eps) with weights q_norm_gamma, k_norm_gamma shared by the heads",
    )
    norm_type: str = setting(
        "layernorm",
        "layernorm: γ ⊙ (z − mean z)/√(var z + ε) + β; rmsnorm: γ ⊙ z/√(mean(z²) + ε), "
        "no centring and no β (Llama)",
        choices=NORM_TYPES,
    )
    mlp: str = setting(
        "plain",
        "plain: φ(Z W_1 + b_1) W_2 + b_2; gated: (φ(Z W_G + b_G) ⊙ (Z W_1 + b_1)) W_2 + b_2 "
        "(SwiGLU with silu, GeGLU with gelu_tanh)",
        choices=MLPS,
    )

    attn_scale: float | None = setting(
        None,
        "the factor on the score q·k (default 1/√d_k; Gemma: query_pre_attn_scalar^(−1/2)); > 0",
        kind=float,
        minimum=0.0,
        optional=True,
    )
    window: int | tuple[int | None, ...] | None = setting(
        None,
        "sliding-window attention (needs causal): token t attends to tokens s with t − window < s ≤ t; "
        "in a stack also one value per layer (None: global attention)",
        kind=int,
        minimum=1,
        optional=True,
    )
    softcap: float | None = setting(
        None,
        "attention soft-capping: S ← c·tanh(S/c) before the mask and the softmax (Gemma 2); > 0",
        kind=float,
        minimum=0.0,
        optional=True,
    )

    def __post_init__(self) -> None:
        if isinstance(self.bias, list):
            object.__setattr__(self, "bias", tuple(self.bias))
        per_layer = self._check_per_layer()
        for s in BLOCK_SETTINGS:
            if s.name not in per_layer:
                s.check(getattr(self, s.name))
        if self.loss == "ce" and self.d_model < 2:
            raise ConfigError("d_model must be >= 2 with loss='ce' (the classes are the d_model features)")
        if self.uses_layernorm and self.norm_type == "layernorm" and self.d_model < 2 and self.ln_eps == 0:
            raise ConfigError(
                "d_model must be >= 2 when LayerNorm is used with ln_eps = 0 "
                "(a single feature has zero variance); raise d_model or set ln_eps > 0"
            )
        if self.n_heads > 1 and not self.out_proj:
            raise ConfigError(
                f"n_heads = {self.n_heads} needs out_proj=True (the heads are joined by "
                "W_O); set out_proj or n_heads = 1"
            )
        if self.d_v is not None and not self.out_proj:
            raise ConfigError(
                f"d_v = {self.d_v} needs out_proj=True (without W_O the value width is "
                "d_model); set out_proj or leave d_v = None"
            )
        self._check_attention_fields()
        if self.mlp == "gated" and not self.has_ffn:
            raise ConfigError("mlp='gated' needs the feed-forward branch: norm must not be 'attention'")
        if self.ln_affine and not self.uses_layernorm:
            raise ConfigError(
                "ln_affine needs a LayerNorm: norm must be 'post', 'pre', 'parallel' or 'peri', "
                f"got {self.norm!r}"
            )
        if isinstance(self.bias, tuple):
            self._check_bias_tuple()

    def _check_per_layer(self) -> tuple[str, ...]:
        """The fields given one value per layer (a tuple, :data:`PER_LAYER`), each element checked
        by its setting; a tuple whose values are all equal is stored as that one value, so a config
        has one spelling. :class:`ConfigError` for a tuple outside a stack or of the wrong length."""
        given = []
        for name in PER_LAYER:
            value = getattr(self, name)
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, name, value)
            if not isinstance(value, tuple):
                continue
            if len(value) != self.n_layers:
                raise ConfigError(
                    f"{name} given per layer must have n_layers = {self.n_layers} values, got {len(value)}"
                    + (" (a single block takes one value)" if self.n_layers == 1 else "")
                )
            setting_ = next(s for s in BLOCK_SETTINGS if s.name == name)
            for v in value:
                setting_.check(v)
            if len(set(value)) == 1:
                object.__setattr__(self, name, value[0])
            else:
                given.append(name)
        return tuple(given)

    def _check_attention_fields(self) -> None:
        """Grouped-query heads and rotary positions (``MODEL.md`` part 3); the score's scale, the
        sliding window and soft-capping (part 5)."""
        for name in ("attn_scale", "softcap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be a number > 0 or None, got {value!r}")
        if any(w is not None for w in self.layer_values("window")) and not self.causal:
            raise ConfigError(
                f"window = {self.window!r} needs causal=True (token t attends to t − window < s ≤ t); "
                "a window on bidirectional attention is not defined here: set causal or leave window = None"
            )
        if self.n_kv_heads is not None:
            if not self.out_proj:
                raise ConfigError(
                    f"n_kv_heads = {self.n_kv_heads} needs out_proj=True (grouped heads are "
                    "joined by W_O); set out_proj or leave n_kv_heads = None"
                )
            if self.n_heads % self.n_kv_heads:
                raise ConfigError(
                    f"n_kv_heads = {self.n_kv_heads} must divide n_heads = {self.n_heads} "
                    "(each key/value head is read by n_heads / n_kv_heads query heads)"
                )
        if not all(theta > 0 for theta in self.layer_values("rope_theta")):
            raise ConfigError(
                f"rope_theta must be > 0 (the base of the rotary frequencies), got {self.rope_theta!r}"
            )
        if self.rotary_dim is not None:
            if not self.rope:
                raise ConfigError(
                    f"rotary_dim = {self.rotary_dim} needs rope=True; set rope or leave rotary_dim = None"
                )
            if self.rotary_dim % 2 or self.rotary_dim > self.d_k:
                raise ConfigError(
                    f"rotary_dim must be even and <= d_k = {self.d_k} (rotate_half pairs "
                    f"feature i with i + rotary_dim/2), got {self.rotary_dim}"
                )
        if self.rope and self.d_k % 2 and self.rotary_dim is None:
            raise ConfigError(
                f"rope needs an even rotary width: d_k = {self.d_k} is odd; set an even "
                "rotary_dim < d_k or an even d_k"
            )

    def _check_bias_tuple(self) -> None:
        """Each projection a ``bias`` tuple names exists (``O`` with ``out_proj``, ``G`` with
        ``mlp="gated"``, ``G``, ``1``, ``2`` with a feed-forward branch); the tuple is kept in the
        order of :data:`BIAS_LETTERS` (the empty tuple is ``False``)."""
        missing = {
            "O": (not self.out_proj, "out_proj=False (no W_O)"),
            "G": (not self.has_ffn or self.mlp != "gated", "mlp='plain' (no W_G)"),
            "1": (not self.has_ffn, "norm='attention' (no feed-forward)"),
            "2": (not self.has_ffn, "norm='attention' (no feed-forward)"),
        }
        for letter in self.bias:
            absent, why = missing.get(letter, (False, ""))
            if absent:
                if letter == "G" and not self.has_ffn:
                    why = missing["1"][1]
                raise ConfigError(f"bias names {letter!r}, a projection this block does not have: {why}")
        ordered = tuple(k for k in BIAS_LETTERS if k in self.bias)
        object.__setattr__(self, "bias", ordered or False)

    # ------------------------------------------------------------------ structure

    @property
    def biases(self) -> tuple[str, ...]:
        """The bias names the block has, ``("b_Q", "b_K", "b_V")`` for ``bias=("Q", "K", "V")``;
        ``bias=True`` gives every projection that exists one."""
        if not self.bias:
            return ()
        letters = self.bias if isinstance(self.bias, tuple) else tuple(BIAS_LETTERS)
        exists = {"O": self.out_proj, "G": self.mlp == "gated"}
        return tuple(BIAS_LETTERS[k] for k in letters if exists.get(k, True))

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or ``n_heads`` when it is ``None``."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def kv_group(self) -> int:
        """Query heads per key/value head, ``n_heads / kv_heads`` (1 without grouped-query attention)."""
        return self.n_heads // self.kv_heads

    def query_heads(self, g: int) -> range:
        """The query heads that read key/value head ``g``: ``g·r … (g+1)·r − 1`` with ``r = kv_group``
        (query head ``h`` reads ``h // r``)."""
        return range(g * self.kv_group, (g + 1) * self.kv_group)

    @property
    def rotary_width(self) -> int:
        """Features of each head that ``rope`` rotates: ``rotary_dim`` (default ``d_k``); 0 without rope."""
        if not self.rope:
            return 0
        return self.d_k if self.rotary_dim is None else self.rotary_dim

    def heads_of(self, base: str) -> int:
        """How many heads the headed weight ``base`` (no layer prefix) has."""
        return self.kv_heads if base in KV_HEADED else self.n_heads

    @property
    def uses_layernorm(self) -> bool:
        return self.norm in NORMED

    @property
    def has_ffn(self) -> bool:
        return self.norm != "attention"

    @property
    def value_width(self) -> int:
        """``d_v`` of one head: ``d_model`` without ``W_O``, else ``d_v`` (default ``d_k``)."""
        if not self.out_proj:
            return self.d_model
        return self.d_k if self.d_v is None else self.d_v

    @property
    def is_paper_block(self) -> bool:
        """True for the papers' block: one head, no ``W_O``, no biases, no γ/β, no mask."""
        return (
            self.n_heads == 1
            and not self.out_proj
            and not self.bias
            and not self.ln_affine
            and not self.causal
            and self.norm_type == "layernorm"
            and self.mlp == "plain"
            and not self.rope
            and not self.qk_norm
            and self.n_kv_heads is None
            and self.attn_scale is None
            and self.window is None
            and self.softcap is None
        )

    @cached_property
    def block(self) -> BlockConfig:
        """One block of this stack (``n_layers = 1``): its names carry no layer prefix. Its shapes and
        names are every layer's; where layers differ in :data:`PER_LAYER` fields it is layer 0
        (:meth:`layer` gives each layer's own)."""
        return self.layer(0)

    def layer(self, i: int) -> BlockConfig:
        """Layer ``i``'s own block (``n_layers = 1``, its own ``window`` and ``rope_theta``)."""
        if not 0 <= i < self.n_layers:
            raise ConfigError(
                f"layer must be in [0, {self.n_layers - 1}] (n_layers = {self.n_layers}), got {i}"
            )
        return self if self.n_layers == 1 else self._layers[i]

    @cached_property
    def _layers(self) -> tuple[BlockConfig, ...]:
        values = {name: self.layer_values(name) for name in PER_LAYER}
        return tuple(
            dataclasses.replace(self, n_layers=1, **{name: v[i] for name, v in values.items()})
            for i in range(self.n_layers)
        )

    def layer_values(self, name: str) -> tuple:
        """The value of a :data:`PER_LAYER` field for each layer, ``(v_0, …, v_{N−1})``."""
        value = getattr(self, name)
        return value if isinstance(value, tuple) else (value,) * self.n_layers

    @classmethod
    def stack_of(cls, layers: list[BlockConfig] | tuple[BlockConfig, ...]) -> BlockConfig:
        """One stack config from each layer's own block (``hv.load_layer``'s): the layers must agree in
        every field but :data:`PER_LAYER` (given then one value per layer), else :class:`ConfigError`."""
        if not layers:
            raise ConfigError("a stack needs at least one layer config")
        first = layers[0]
        for i, c in enumerate(layers):
            if c.n_layers != 1:
                raise ConfigError(f"stack_of takes one-block configs, layer {i} has n_layers = {c.n_layers}")
            other = {
                f.name
                for f in dataclasses.fields(cls)
                if f.name not in PER_LAYER and getattr(c, f.name) != getattr(first, f.name)
            }
            if other:
                raise ConfigError(
                    f"layers of one stack may differ only in {', '.join(PER_LAYER)}; layer {i} differs "
                    f"from layer 0 in {', '.join(sorted(other))}"
                )
        own = {name: tuple(getattr(c, name) for c in layers) for name in PER_LAYER}
        return dataclasses.replace(first, n_layers=len(layers), **own)

    @property
    def score_scale(self) -> float:
        """The factor on ``q·k``: ``attn_scale``, or ``1/√d_k`` when it is ``None``."""
        return 1.0 / math.sqrt(self.d_k) if self.attn_scale is None else float(self.attn_scale)

    @property
    def is_stack(self) -> bool:
        return self.n_layers > 1

    @property
    def param_names(self) -> tuple[str, ...]:
        """Whole parameter names in θ order (the order the forward pass first uses them);
        layer by layer with the prefix ``l{i}.`` in a stack."""
        if self.is_stack:
            return tuple(layer_name(i, n) for i in range(self.n_layers) for n in self.block.param_names)
        keep = {"W_Q", "W_K", "W_V", "W_1", "W_2"} | set(self.biases)
        if self.out_proj:
            keep.add("W_O")
        if self.mlp == "gated":
            keep.add("W_G")
        if self.ln_affine:
            norms = _LN1 + _LN2 + (_LN1_OUT + _LN2_OUT if self.norm == "peri" else ())
            keep |= {n for n in norms if self.norm_type == "layernorm" or n.endswith("_gamma")}
        if self.qk_norm:
            keep |= {"q_norm_gamma", "k_norm_gamma"}
        if self.norm == "attention":
            order = _ATTENTION_ORDER
        elif self.norm in ("pre", "parallel"):
            order = _LN1 + _ATTENTION_ORDER + _LN2 + _FFN_ORDER
        elif self.norm == "peri":
            order = _LN1 + _ATTENTION_ORDER + _LN1_OUT + _LN2 + _FFN_ORDER + _LN2_OUT
        else:
            order = _ATTENTION_ORDER + _LN1 + _FFN_ORDER + _LN2
        return tuple(n for n in order if n in keep)

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``name -> shape`` in θ order: matrices ``(rows, cols)``, biases and γ/β ``(n,)``."""
        return dict(self._shape_table)

    @cached_property
    def _shape_table(self) -> dict[str, tuple[int, ...]]:
        d, H, dk, dv, dff = self.d_model, self.n_heads, self.d_k, self.value_width, self.d_ff
        G = self.kv_heads
        shapes = {
            "W_Q": (d, H * dk),
            "b_Q": (H * dk,),
            "W_K": (d, G * dk),
            "b_K": (G * dk,),
            "W_V": (d, G * dv),
            "b_V": (G * dv,),
            "W_O": (H * dv, d),
            "b_O": (d,),
            "q_norm_gamma": (dk,),
            "k_norm_gamma": (dk,),
            "W_G": (d, dff),
            "b_G": (dff,),
            "W_1": (d, dff),
            "b_1": (dff,),
            "W_2": (dff, d),
            "b_2": (d,),
            "ln1_gamma": (d,),
            "ln1_beta": (d,),
            "ln2_gamma": (d,),
            "ln2_beta": (d,),
            "ln1_out_gamma": (d,),
            "ln1_out_beta": (d,),
            "ln2_out_gamma": (d,),
            "ln2_out_beta": (d,),
        }
        if self.is_stack:
            one = self.block._shape_table
            return {layer_name(i, n): s for i in range(self.n_layers) for n, s in one.items()}
        return {n: shapes[n] for n in self.param_names}

    @property
    def num_params(self) -> int:
        """``P``, the length of θ."""
        return sum(math.prod(s) for s in self.param_shapes.values())

    # ------------------------------------------------------------------ names and head slices

    def layer_names(self, layer: int) -> tuple[str, ...]:
        """The whole names of layer ``layer``, in θ order (prefixed in a stack)."""
        return tuple(n for n in self.param_names if self.layer_of(n)[0] == layer)

    def layer_of(self, name: str) -> tuple[int, str]:
        """``(layer, name inside its block)``: ``"l1.W_Q[2]" -> (1, "W_Q[2]")``; ``(0, name)`` for
        one block. Checked: a layer beyond the stack is a :class:`ConfigError` naming ``n_layers``."""
        layer, local = split_layer(name) if isinstance(name, str) else (None, name)
        if not self.is_stack:
            if layer is not None:
                raise ConfigError(
                    f"parameter name {name!r} has a layer prefix but n_layers = 1: the names "
                    f"of one block carry none ({', '.join(self.param_names)})"
                )
            return 0, name
        if layer is None:
            parse_name(name)
            raise ConfigError(
                f"parameter name {name!r} needs its layer prefix with n_layers = "
                f"{self.n_layers}: 'l0.{name}' … 'l{self.n_layers - 1}.{name}'"
            )
        if name != layer_name(layer, local):
            raise ConfigError(
                f"layer index in {name!r} must be written without leading zeros: {layer_name(layer, local)!r}"
            )
        if layer >= self.n_layers:
            raise ConfigError(
                f"layer index in {name!r} must be in [0, {self.n_layers - 1}] "
                f"(n_layers = {self.n_layers}), got {layer}"
            )
        return layer, local

    def check_name(self, name: str) -> str:
        """``name`` if it is a parameter of this block or a head slice of one, else :class:`ConfigError`."""
        if self.is_stack:
            layer, local = self.layer_of(name)
            try:
                self.block.check_name(local)
            except ConfigError as err:
                raise ConfigError(
                    f"{err} (in {name!r}: layer {layer} of n_layers = {self.n_layers})"
                ) from None
            return name
        self.layer_of(name)
        base, head = parse_name(name)
        if base not in self._shape_table:
            raise ConfigError(
                f"parameter name must be one of {', '.join(self.param_names)} for norm={self.norm!r} "
                f"(or a head slice such as 'W_Q[0]'), got {name!r}"
            )
        if head is not None:
            if base not in HEADED:
                headed = ", ".join(n for n in self.param_names if n in HEADED)
                raise ConfigError(
                    f"{base} has no heads, so {name!r} is not a parameter; head slices exist for {headed}"
                )
            count = self.heads_of(base)
            field_name = "n_kv_heads" if base in KV_HEADED and self.n_kv_heads is not None else "n_heads"
            if not 0 <= head < count:
                raise ConfigError(
                    f"head index in {name!r} must be in [0, {count - 1}] ({field_name} = {count}), got {head}"
                )
        return name

    def shape_of(self, name: str) -> tuple[int, ...]:
        """Shape of a whole parameter or of one head's slice: ``W_Q[h] (d, d_k)``, ``W_O[h] (d_v, d)``."""
        if self.is_stack:
            return self.block.shape_of(self.layer_of(name)[1])
        base, head = parse_name(self.check_name(name))
        shape = list(self.param_shapes[base])
        if head is not None:
            shape[HEADED[base]] //= self.heads_of(base)
        return tuple(shape)

    def param_size(self, name: str) -> int:
        return math.prod(self.shape_of(name))

    def head_indices(self, name: str) -> torch.Tensor:
        """Positions of ``name``'s entries inside ``vec_r`` of its whole weight, in the slice's
        own ``vec_r`` order (``arange`` for a whole name); int64 on the CPU."""
        if self.is_stack:
            return self.block.head_indices(self.layer_of(name)[1])
        base, head = parse_name(self.check_name(name))
        shape = self.param_shapes[base]
        full = torch.arange(math.prod(shape)).reshape(shape)
        if head is None:
            return full.reshape(-1)
        axis = HEADED[base]
        width = shape[axis] // self.heads_of(base)
        return full.narrow(axis, head * width, width).reshape(-1)

    def is_headed(self, name: str) -> bool:
        """Whether ``name`` (a whole weight, ``"W_Q"`` or ``"l1.W_Q"``) is split by head."""
        return parse_name(self.layer_of(name)[1]).base in HEADED

    def head_names(self, base: str) -> tuple[str, ...]:
        """``("W_Q[0]", …, "W_Q[H-1]")`` for a weight with heads (``"l1.W_Q[0]"`` … in a stack)."""
        if self.is_stack:
            layer, local = self.layer_of(base)
            return tuple(layer_name(layer, n) for n in self.block.head_names(local))
        self.check_name(base)
        if base not in HEADED:
            raise ConfigError(
                f"{base} has no heads; head slices exist for "
                f"{', '.join(n for n in self.param_names if n in HEADED)}"
            )
        return tuple(f"{base}[{h}]" for h in range(self.heads_of(base)))

    def sort_names(self, names: tuple[str, ...] | list[str] | str) -> tuple[str, ...]:
        """``names`` checked and put in θ order (a slice at its weight's place, by head);
        :class:`ConfigError` on a repeat or on a weight given both whole and sliced."""
        names = (names,) if isinstance(names, str) else tuple(names)
        refs = {n: parse_name(self.check_name(n)) for n in names}
        if len(refs) != len(names):
            raise ConfigError(f"wrt must not repeat a name, got {names}")
        whole = {r.base for r in refs.values() if r.head is None}
        for n, r in refs.items():
            if r.head is not None and r.base in whole:
                raise ConfigError(f"wrt names {r.base!r} whole and its slice {n!r}; give one or the other")
        order = self.param_names
        return tuple(sorted(names, key=lambda n: (order.index(refs[n].base), refs[n].head or 0)))

    def offsets(self, names: tuple[str, ...] | None = None) -> dict[str, slice]:
        """``name -> slice`` of that parameter inside θ restricted to ``names`` (in the given order)."""
        names = self.param_names if names is None else names
        out, start = {}, 0
        for n in names:
            size = self.param_size(n)
            out[n] = slice(start, start + size)
            start += size
        return out

    # ------------------------------------------------------------------ words

    def describe(self, input_norm: float | None = None) -> str:
        """One line in words, e.g. ``Post-LN block, L = 8, d = 16, ReLU, MSE, ‖X‖₂ = 1``."""
        parts = [
            NORM_TITLES[self.norm] + (f" × {self.n_layers} layers" if self.is_stack else ""),
            f"L = {self.seq_len}",
            f"d = {self.d_model}",
            f"d_k = {self.d_k}",
        ]
        if self.n_heads > 1:
            parts.append(
                f"{self.n_heads} heads"
                + (f" over {self.kv_heads} key/value heads" if self.kv_heads != self.n_heads else "")
            )
        if self.out_proj:
            parts.append("W_O" + (f" (d_v = {self.value_width})" if self.value_width != self.d_k else ""))
        if self.has_ffn:
            parts += [
                f"d_ff = {self.d_ff}",
                ACTIVATION_TITLES[self.activation] + (" gated" if self.mlp == "gated" else ""),
            ]
        rms = self.uses_layernorm and self.norm_type == "rmsnorm"
        some = f"biases {','.join(self.bias)}" if isinstance(self.bias, tuple) else "biases"
        parts += [
            label
            for flag, label in (
                (rms, "RMSNorm"),
                (self.bias, some),
                (self.ln_affine, "RMSNorm γ" if rms else "LN γ/β"),
                (self.causal, "causal"),
                (self.qk_norm, "QK-norm"),
            )
            if flag
        ]
        if self.rope:
            parts.append(
                "RoPE" + (f" on {self.rotary_width} of {self.d_k}" if self.rotary_width < self.d_k else "")
            )
        if self.attn_scale is not None:
            parts.append(f"score scale {self.attn_scale:g}")
        if self.window is not None:
            windows = self.layer_values("window")
            parts.append(
                f"window {self.window}"
                if not isinstance(self.window, tuple)
                else "windows " + ",".join("global" if w is None else str(w) for w in windows)
            )
        if self.softcap is not None:
            parts.append(f"softcap {self.softcap:g}")
        parts.append(LOSS_TITLES[self.loss])
        if self.uses_layernorm and self.ln_eps:
            parts.append(f"ε = {self.ln_eps:g}")
        if input_norm is not None:
            parts.append(f"‖X‖₂ = {input_norm:g}")
        return ", ".join(parts)

    def values(self) -> dict[str, object]:
        """``field name -> value`` of every setting (what the CLI and the JSON summaries record)."""
        return {s.name: getattr(self, s.name) for s in BLOCK_SETTINGS}


def _settings_of(cls: type) -> tuple[Setting, ...]:
    return tuple(
        dataclasses.replace(f.metadata["setting"], name=f.name)
        for f in dataclasses.fields(cls)
        if "setting" in f.metadata
    )


BLOCK_SETTINGS: tuple[Setting, ...] = _settings_of(BlockConfig)
"""One :class:`Setting` per :class:`BlockConfig` field, in field order."""

INPUT_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "the spectral norm (largest singular value) of the input X",
        float,
        1.0,
        minimum=0.0,
        name="input_norm",
    ),
    Setting("draws the weights W ~ N(0, 1/fan_in), X and the target", int, 0, minimum=0, name="seed"),
)
"""The input's settings (not part of the block): its spectral norm and the seed."""

SETTINGS: tuple[Setting, ...] = BLOCK_SETTINGS + INPUT_SETTINGS
"""Every user-facing setting; the CLI is built from this table (the app: :mod:`hessviz.app.settings`)."""
