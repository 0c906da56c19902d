"""What every model family shares: :class:`Source` (where one weight is stored), :class:`Head` (a
decoder's final norm and unembedding), :class:`Family` (what a family answers) and the readers of
``config.json`` values that every family uses (checked integers, flags, activations, rotary settings).

Orientation. hessviz multiplies weights from the right, ``X W`` (``MODEL.md``). A
``torch.nn.Linear`` stores ``weight`` as ``(out, in)`` and computes ``x weightᵀ``, so its matrices
are transposed on loading (:class:`Source` ``transpose``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.errors import CheckpointError, ConfigError
from hessviz.pretrained.bounded import shown
from hessviz.pretrained.checkpoint import Checkpoint

HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
"""Hugging Face activation name -> hessviz activation (only exact equivalents)."""
MAX_POSITIONS = 1 << 24
"""The most positions a config may claim (16,777,216; today's longest contexts are ~1M): a bound on a
number that no tensor checks in a rotary model, so no arithmetic on it runs away."""


@dataclass(frozen=True)
class Source:
    """Where one hessviz weight is stored: the checkpoint tensor ``key``, whether it is
    an ``nn.Linear`` weight to transpose, and ``part = (k, n)`` when it is the ``k``-th of
    ``n`` blocks packed along the last axis (in hessviz orientation) of one tensor.

    ``groups = 1``: ``n`` equal blocks side by side, ``[W_Q | W_K | W_V]`` (GPT-2's ``c_attn``).
    ``groups = H``: the packing repeats per head, ``[q_0 k_0 v_0 | q_1 k_1 v_1 | …]``
    (GPT-NeoX's ``query_key_value``, whose output is viewed as ``(H, 3·d_k)``); block ``k`` is then
    ``concat_h`` of the ``k``-th third of every head's group.
    """

    key: str
    transpose: bool = False
    part: tuple[int, int] | None = None
    groups: int = 1
    shift: float = 0.0
    """Added to the stored value in the working dtype: Gemma's norms scale by ``1 + w`` (``shift = 1``),
    and hessviz's ``γ`` is that scale."""

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The checkpoint tensor's shape that holds a hessviz weight of ``shape``."""
        packed = list(shape)
        if self.part is not None:
            packed[-1] *= self.part[1]
        return tuple(reversed(packed)) if self.transpose else tuple(packed)

    def extract(self, stored: Tensor, dtype: torch.dtype) -> Tensor:
        """The hessviz weight in ``dtype`` from the stored tensor: one contiguous copy that
        converts, transposes and cuts in a single pass."""
        view = stored.T if self.transpose else stored
        if self.part is not None:
            k, n = self.part
            lead, width = view.shape[:-1], view.shape[-1] // (n * self.groups)
            view = view.reshape(*lead, self.groups, n, width)[..., k, :].reshape(*lead, self.groups * width)
        out = torch.empty(view.shape, dtype=dtype).copy_(view)
        return out.add_(self.shift) if self.shift else out


def _linear(prefix: str) -> tuple[Source, Source]:
    return Source(f"{prefix}.weight", transpose=True), Source(f"{prefix}.bias")


def _norm(prefix: str) -> tuple[Source, Source]:
    return Source(f"{prefix}.weight"), Source(f"{prefix}.bias")


def _table(**pairs: tuple[Source, Source]) -> dict[str, Source]:
    """``W_Q=(weight, bias)`` -> ``{"W_Q": weight, "b_Q": bias}``; ``ln1=…`` -> ``ln1_gamma, ln1_beta``."""
    out = {}
    for name, (weight, bias) in pairs.items():
        if name.startswith("ln"):
            out[f"{name}_gamma"], out[f"{name}_beta"] = weight, bias
        else:
            out[name], out[name.replace("W_", "b_")] = weight, bias
    return out


def _get(config: dict, key: str, kind: type, default: object = None, minimum: float = 1) -> object:
    """``config[key]`` (or ``default`` when absent or null), checked to be a ``kind`` ``>= minimum``
    (an int is a float too; a number must be finite as a float)."""
    value = config.get(key)
    value = default if value is None else value
    if value is None:
        raise CheckpointError(
            f"config.json: {key} is missing; a {shown(config.get('model_type'))} config needs it"
        )
    kinds = (int, float) if kind is float else (kind,)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or value < minimum
        or (kind is float and not value < 1e308)  # finite: not NaN, not inf, no float(10**400) overflow
    ):
        raise CheckpointError(
            f"config.json: {key} must be {'an integer' if kind is int else 'a finite number'} "
            f">= {minimum:g}, got {shown(value)}"
        )
    return value


def _flag(config: dict, key: str, default: bool) -> bool:
    """``config[key]`` as a JSON ``true``/``false`` (``default`` when absent or null): a string such as
    ``"false"`` would be truthy, a silent wrong layer."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(f"config.json: {key} must be true or false, got {shown(value)}")
    return value


def _activation(config: dict, key: str, default: str) -> str:
    name = config.get(key, default)
    if not isinstance(name, str) or name not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"config.json: {key} = {shown(name)} is not supported; hessviz has "
            f"{', '.join(map(repr, HF_ACTIVATIONS))}"
        )
    return HF_ACTIVATIONS[name]


def _refuse(config: dict, flags: dict[str, object]) -> None:
    """Refuse options that change the layer beyond what hessviz computes."""
    for key, allowed in flags.items():
        value = config.get(key, allowed)
        if value != allowed:
            raise CheckpointError(
                f"config.json: {key} = {shown(value)} is not supported (hessviz computes "
                f"the standard layer, {key} = {allowed!r})"
            )


def _prefix(ckpt: Checkpoint, anchor: str) -> str:
    """The prefix of every tensor name (``""``, ``"bert."``, ``"transformer."``…), found from
    the one tensor whose name ends with ``anchor``."""
    hits = sorted((k for k in ckpt.tensors if k == anchor or k.endswith("." + anchor)), key=len)
    if not hits:
        raise CheckpointError(
            f"source {ckpt.name!r}: no tensor named {anchor!r} (with any prefix); the "
            f"weights do not match config.json's model_type "
            f"{shown(ckpt.config.get('model_type'))}"
        )
    return hits[0][: -len(anchor)]


def _descendants(cls: type) -> list[type]:
    """Every subclass of ``cls``, depth first in definition order (the families, without importing
    the package that lists them: it imports this module)."""
    return [d for sub in cls.__subclasses__() for d in (sub, *_descendants(sub))]


@dataclass(frozen=True)
class Head:
    """Where a decoder's output head is stored: the final norm's ``γ`` (and ``β`` for a LayerNorm)
    and the unembedding ``E (V, d)`` (``logits = norm(z) Eᵀ``), which is the token embedding when the
    weights are tied. ``gamma = None``: no final norm (OPT with ``do_layer_norm_before = false``)."""

    gamma: str | None
    beta: str | None
    unembedding: str
    norm_type: str = "layernorm"
    shift: float = 0.0
    """Added to the stored final-norm weight: ``γ = shift + w`` (Gemma: ``1 + w``)."""
    softcap: float | None = None
    """Final-logit soft-capping ``c·tanh(logits/c)`` (Gemma 2's ``final_logit_softcapping``)."""


class Family:
    """What every family answers; subclasses fill in the table and the embeddings."""

    model_types: tuple[str, ...] = ()
    title = ""
    blurb = ""
    """The block in a few words (``hessviz models``, the app)."""
    anchor = ""
    layers_key = positions_key = vocab_key = ""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt = ckpt
        self.config = ckpt.config
        try:
            self.block = self.block_config()
        except ConfigError as e:  # a config whose values make no block: the file's fault, named so
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"config.json describes no block hessviz computes: {e}") from None
        self.n_layers: int = _get(self.config, self.layers_key, int)
        self.vocab_size: int = _get(self.config, self.vocab_key, int)
        self._check_sizes()
        self.prefix = _prefix(ckpt, self.anchor)
        self._check_lazy_keys()

    def _check_lazy_keys(self) -> None:
        """Read now the keys that are otherwise read on first use (the sliding window, the head's
        ``tie_word_embeddings`` …), so a value of the wrong type fails at opening, not halfway through."""
        self.check_length(0)
        if self.has_head():
            self.head()

    def _check_sizes(self) -> None:
        """Refuse sizes no tensor backs, before anything loops or allocates by them: every width is at
        most the largest dimension of any tensor present, the layers at most the tensors (each layer has
        its own), the positions at most :data:`MAX_POSITIONS`. (Each tensor's exact shape is checked
        again before it is read, :meth:`Checkpoint.require`.)"""
        tensors, b = self.ckpt.tensors, self.block
        largest = max((max(shape) for _, shape in tensors.values() if shape), default=0)
        for what, value in (
            ("hidden size", b.d_model),
            ("feed-forward width", b.d_ff),
            ("heads × head width", b.n_heads * b.d_k),
            ("vocabulary size", self.vocab_size),
        ):
            if value > largest:
                raise CheckpointError(
                    f"config.json: the {what} {value} is larger than every dimension of every tensor "
                    f"in the weights (the largest is {largest}); the config does not describe them"
                )
        if self.n_layers > len(tensors):
            raise CheckpointError(
                f"config.json: {self.layers_key} = {self.n_layers}, but the weights hold only "
                f"{len(tensors)} tensors (each layer has its own); the config does not describe them"
            )
        if self.max_positions > MAX_POSITIONS:
            raise CheckpointError(
                f"config.json: {self.positions_key} = {self.max_positions} is beyond the "
                f"{MAX_POSITIONS} positions hessviz reads"
            )

    @property
    def max_positions(self) -> int:
        return _get(self.config, self.positions_key, int)

    @property
    def window(self) -> tuple[str, int] | None:
        """``(config key, length)`` of a sliding attention window that hessviz does not compute
        (then a text may be at most that long), or ``None``."""
        return None

    def check_length(self, n: int) -> None:
        """:class:`CheckpointError` when ``n`` tokens are more than a sliding window sees: the layer
        would then need the window's mask, which hessviz does not compute."""
        if self.window is not None and n > self.window[1]:
            key, w = self.window
            raise CheckpointError(
                f"config.json: {key} = {w} is shorter than the {n} tokens asked for; "
                f"hessviz computes full causal attention, which equals the sliding-window "
                f"layer only up to {w} tokens: use at most {w}"
            )

    def block_config(self, seq_len: int | None = None) -> BlockConfig:
        raise NotImplementedError

    def layer_block(self, layer: int, seq_len: int | None = None) -> BlockConfig:
        """Layer ``layer``'s own block (``seq_len`` tokens, else the model's positions): :attr:`block`,
        except in families whose layers differ in ``window`` and ``rope_theta`` (Gemma)."""
        return self.block if seq_len is None else dataclasses.replace(self.block, seq_len=seq_len)

    def stack(self, seq_len: int | None = None) -> BlockConfig:
        """Every layer as one stack config (:meth:`~hessviz.BlockConfig.stack_of` of :meth:`layer_block`)."""
        return BlockConfig.stack_of([self.layer_block(i, seq_len) for i in range(self.n_layers)])

    def layer_sources(self, layer: int) -> dict[str, Source]:
        """``hessviz name -> Source`` of layer ``layer``, full checkpoint keys (a table may hold
        rows for weights this block does not have, e.g. biases; only ``param_names`` are read)."""
        raise NotImplementedError

    def embed(self, ids: list[int], dtype: torch.dtype) -> Tensor:
        """``X (L, d)``: the hidden state entering layer 0 for token ids ``ids``."""
        raise NotImplementedError

    def embedding_shapes(self) -> dict[str, tuple[int, ...]]:
        """``key -> shape`` of every embedding tensor :meth:`embed` reads."""
        raise NotImplementedError

    def head(self) -> Head:
        """The final norm and the LM head; :class:`CheckpointError` for a family without one."""
        decoders = dict.fromkeys(t for f in _descendants(Family) if f.has_head() for t in f.model_types)
        raise CheckpointError(
            f"source {self.ckpt.name!r} is a {self.title} model: hessviz reads the "
            "next-token head (final norm and unembedding) of decoder families only "
            f"({', '.join(decoders)})"
        )

    @classmethod
    def has_head(cls) -> bool:
        """Whether hessviz reads this family's next-token head (the decoders)."""
        return cls.head is not Family.head

    def head_shapes(self) -> dict[str, tuple[int, ...]]:
        """``key -> shape`` of the head's tensors."""
        h, d = self.head(), self.block.d_model
        return {k: (d,) for k in (h.gamma, h.beta) if k is not None} | {h.unembedding: (self.vocab_size, d)}

    def _sources(self, layer: int) -> dict[str, Source]:
        table = self.layer_sources(layer)
        missing = [n for n in self.block.param_names if n not in table]
        if missing:
            raise CheckpointError(
                f"source {self.ckpt.name!r}: the {self.title} table has no row for "
                f"{', '.join(missing)} of this block"
            )
        return {n: table[n] for n in self.block.param_names}

    def layer_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """``key -> stored shape`` of every tensor layer ``layer`` reads."""
        shapes = self.block.param_shapes
        return {s.key: s.stored_shape(shapes[n]) for n, s in self._sources(layer).items()}

    def read_layer(self, layer: int, dtype: torch.dtype) -> dict[str, Tensor]:
        """``name -> tensor`` of layer ``layer`` in hessviz orientation and ``dtype``."""
        sources = self._sources(layer)
        self.ckpt.require(self.layer_shapes(layer))
        stored = self.ckpt.read(sorted({s.key for s in sources.values()}))
        return {n: sources[n].extract(stored[sources[n].key], dtype) for n in self.block.param_names}

    def read_rows(self, key: str, ids: list[int], dtype: torch.dtype) -> Tensor:
        """Rows ``ids`` of the table ``key`` (checked against :meth:`embedding_shapes` first)."""
        self.ckpt.require(self.embedding_shapes())
        return self.ckpt.read_rows(key, ids, dtype)


def _rope(config: dict, default_factor: float = 1.0) -> tuple[float, float]:
    """``(rope_theta, partial rotary factor)`` from either spelling of ``config.json``:
    ``rope_parameters = {rope_type, rope_theta, partial_rotary_factor}`` (``transformers`` 5) or
    ``rope_theta``/``rope_scaling``/``partial_rotary_factor`` (4.x; GPT-NeoX's ``rotary_emb_base``,
    ``rotary_pct``). Only the plain rotation is computed: any other ``rope_type`` is refused."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for key, table in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(table, dict) or any(isinstance(v, dict) for v in table.values()):
            raise CheckpointError(
                f"config.json: {key} must be one object of rope settings (hessviz computes "
                f"one rotation for every layer), got {shown(table)}"
            )
        kind = table.get("rope_type", table.get("type", "default"))
        if kind != "default":
            raise CheckpointError(
                f"config.json: {key} with rope_type {shown(kind)} is not supported; hessviz "
                "computes the plain rotation (rope_type 'default', no scaling)"
            )
    theta = params.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    factor = params.get(
        "partial_rotary_factor", config.get("partial_rotary_factor", config.get("rotary_pct", default_factor))
    )
    _get({"rope_theta": theta}, "rope_theta", float, minimum=1e-12)
    _get({"partial_rotary_factor": factor}, "partial_rotary_factor", float, minimum=1e-12)
    return float(theta), float(factor)


def _rotary_dim(d_k: int, factor: float) -> int | None:
    """GPT-NeoX's ``int(d_k · rotary_pct)``; ``None`` when the whole head rotates."""
    r = int(d_k * factor)
    if r > d_k or r < 2 or r % 2:
        raise CheckpointError(
            f"config.json: partial rotary factor {factor:g} of head width {d_k} gives "
            f"{r} rotated features; hessviz needs an even number in [2, {d_k}]"
        )
    return None if r == d_k else r


def _refuse_set(config: dict, keys: tuple[str, ...]) -> None:
    """Refuse options that are off (null or absent) in the layer hessviz computes."""
    for key in keys:
        if config.get(key) not in (None, False, 0):
            raise CheckpointError(
                f"config.json: {key} = {shown(config[key])} is not supported (it changes the "
                "layer's math; hessviz computes the layer without it)"
            )


def _heads(config: dict, d: int, heads_key: str, head_dim_key: str | None) -> int:
    """``d_k``: ``head_dim`` when the config gives it, else ``d / n_heads``."""
    heads = _get(config, heads_key, int)
    if head_dim_key and config.get(head_dim_key) is not None:
        return _get(config, head_dim_key, int)
    if d % heads:
        raise CheckpointError(f"config.json: hidden_size = {d} must be a multiple of {heads_key} = {heads}")
    return d // heads


def _bias(flags: dict[str, bool]) -> tuple[str, ...] | bool:
    """``BlockConfig.bias`` from ``projection letter -> has a bias``: the tuple, ``True`` or ``False``."""
    have = tuple(k for k, on in flags.items() if on)
    return False if not have else (True if len(have) == len(flags) else have)
