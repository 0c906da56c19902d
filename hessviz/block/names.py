"""Parameter names and θ order: which weights a block has, their shapes, head slices and layers.

* The paper block's parameters, in this order: ``W_Q (d, d_k)``, ``W_K (d, d_k)``,
  ``W_V (d, d)``, ``W_1 (d, d_ff)``, ``W_2 (d_ff, d)``; the placement ``attention`` has
  only the first three. A real layer (``MODEL.md`` part 2) adds heads, ``W_O``, biases
  (vectors ``(n,)``) and norm scale and shift, each in the order the forward pass first uses
  it (:attr:`ThetaNames.param_names`). ``θ`` is their ``vec_r`` concatenated in that order and
  ``P = len(θ)``.
* Head ``h`` of ``W_Q``, ``W_K``, ``b_Q``, ``b_K`` is columns ``h·d_k … (h+1)·d_k − 1``; of
  ``W_V``, ``b_V`` columns ``h·d_v …``; of ``W_O`` the same rows. ``"W_Q[h]"`` names that
  slice, ``vec_r`` of the slice.
* A stack (``n_layers = N > 1``) prefixes every name by its layer, ``l0.W_Q … l1.W_Q …``,
  layer 0 first (``l1.W_Q[2]`` is a head slice of layer 1). With one layer the names carry no
  prefix.

The name grammar is the functions :func:`parse_name`, :func:`split_layer` and :func:`layer_name`;
what one configuration's names are is :class:`ThetaNames`, the part of
:class:`hessviz.block.config.BlockConfig` that reads its fields into names, shapes and offsets.
"""

from __future__ import annotations

import math
import re
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import torch

from hessviz.errors import ConfigError

ATTENTION_PARAMS = ("W_Q", "W_K", "W_V")
FFN_PARAMS = ("W_1", "W_2")


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


class ThetaNames:
    """The names, shapes and θ offsets of a :class:`~hessviz.block.config.BlockConfig`: a base of that
    dataclass, reading its fields (``norm``, ``out_proj``, ``bias``, ``mlp``, ``ln_affine``,
    ``norm_type``, ``qk_norm``, the widths and ``n_layers``) and its structure (``biases``,
    ``kv_heads``, ``heads_of``, ``block``, ``is_stack``)."""

    if TYPE_CHECKING:
        norm: str
        norm_type: str
        mlp: str
        out_proj: bool
        ln_affine: bool
        qk_norm: bool
        n_layers: int
        n_heads: int
        n_kv_heads: int | None
        d_model: int
        d_k: int
        d_ff: int
        biases: tuple[str, ...]
        kv_heads: int
        value_width: int
        is_stack: bool
        block: ThetaNames

        def heads_of(self, base: str) -> int: ...

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
