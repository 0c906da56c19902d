"""The pretrained-model API of ``MODEL.md`` part 2: layers of a real model and their inputs.

>>> import dataclasses
>>> import hessviz
>>> cfg, params = load_layer("pydoc-postln", layer=0)          # the bundled Post-LN model
>>> X = layer_inputs("pydoc-postln", "def add(a, b):", layer=0)
>>> cfg = dataclasses.replace(cfg, seq_len=X.shape[0])
>>> Z = hessviz.forward(cfg, params, X)                        # = layer 0's output in the real model
>>> bool(torch.allclose(Z, layer_inputs("pydoc-postln", "def add(a, b):", layer=1)))
True

Shapes: ``X, Z (L, d)``; the weights as :attr:`BlockConfig.param_shapes` give them
(``W_Q (d, H·d_k)``, ``W_1 (d, d_ff)``, ``b_Q (H·d_k,)``, ``ln1_gamma (d,)`` …).
Everything is checked before a tensor is read (the folder, the config, the layer index,
the text, and the names and shapes of every tensor needed), so a bad input raises a
``ValueError`` subclass naming the field and nothing is loaded halfway.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hessviz.api import forward
from hessviz.block.config import BlockConfig
from hessviz.block.inputs import FLOAT_DTYPES
from hessviz.errors import ConfigError, InputError, ModelRangeError
from hessviz.pretrained import tokens
from hessviz.pretrained.families import Family, family_of
from hessviz.pretrained.module_source import encoder_layer
from hessviz.pretrained.sources import open_source

Source = str | os.PathLike
TextOrIds = str | Sequence[int] | Tensor
Device = str | torch.device | None


@dataclass(frozen=True)
class ModelInfo:
    """What a checkpoint is, from its ``config.json`` (no weights read)."""

    name: str
    folder: str
    model_type: str
    family: str
    n_layers: int
    n_heads: int
    d_model: int
    d_ff: int
    max_positions: int
    vocab_size: int
    block: BlockConfig

    def describe(self) -> str:
        """One line, e.g. ``all-MiniLM-L6-v2: BERT, 6 layers, 12 heads, d = 384, …``."""
        b = self.block
        norm = "RMSNorm" if getattr(b, "norm_type", "layernorm") == "rmsnorm" else "LN"
        placement = {"post": f"Post-{norm}", "pre": f"Pre-{norm}"}.get(b.norm, f"{b.norm} {norm}")
        kv = getattr(b, "n_kv_heads", None)
        heads = f"{self.n_heads} heads" + (f" ({kv} key/value)" if kv not in (None, self.n_heads) else "")
        return (
            f"{self.name}: {self.family} ({placement}), {self.n_layers} layers, "
            f"{heads}, d = {self.d_model}, d_ff = {self.d_ff}, "
            f"{self.max_positions} positions, {self.vocab_size} tokens"
        )


def _open(source: Source) -> Family:
    return family_of(open_source(source))


def _check_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in FLOAT_DTYPES:
        raise InputError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    return dtype


def _check_layer(family: Family, layer: int) -> int:
    n = family.n_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n:
        raise ModelRangeError(
            f"layer must be an integer in [0, {n - 1}] ({family.ckpt.name!r} has {n} layers), got {layer!r}"
        )
    return layer


def _block(family: Family, seq_len: int | None, layer: int = 0) -> BlockConfig:
    """Layer ``layer``'s block with ``seq_len`` tokens (checked), or the model's positions."""
    if seq_len is None:
        return family.layer_block(layer)
    top = family.max_positions
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= top:
        raise ModelRangeError(
            f"seq_len must be an integer in [1, {top}] (the model's positions), got {seq_len!r}"
        )
    family.check_length(seq_len)
    return family.layer_block(layer, seq_len)


def _to(params: dict[str, Tensor], device: Device) -> dict[str, Tensor]:
    return params if device is None else {n: p.to(device) for n, p in params.items()}


def model_info(source: Source) -> ModelInfo:
    """The checkpoint's architecture and sizes; reads ``config.json`` and the tensor headers."""
    fam = _open(source)
    b = fam.block
    return ModelInfo(
        fam.ckpt.name,
        str(fam.ckpt.folder),
        fam.config["model_type"],
        fam.title,
        fam.n_layers,
        b.n_heads,
        b.d_model,
        b.d_ff,
        fam.max_positions,
        fam.vocab_size,
        b,
    )


def load_layer(
    source: Source,
    layer: int,
    *,
    dtype: torch.dtype = torch.float64,
    seq_len: int | None = None,
    device: Device = None,
) -> tuple[BlockConfig, dict[str, Tensor]]:
    """``(cfg, params)`` of layer ``layer`` of the checkpoint ``source``.

    ``cfg.seq_len`` is ``seq_len``, or the model's number of positions without it;
    ``params`` maps each of ``cfg.param_names`` to a tensor in hessviz's orientation
    (weights multiply from the right) and ``dtype``.

    ``source`` may also be a ``transformers`` model object or a ``torch.nn.TransformerEncoderLayer``
    (``layer = 0``, ``seq_len`` required), read where it is: the weights are copied at this call, so
    later changes to the module are not seen by this result (:mod:`hessviz.pretrained.module_source`).
    """
    if isinstance(source, torch.nn.TransformerEncoderLayer):
        if layer != 0 or isinstance(layer, bool):
            raise ModelRangeError(f"layer must be 0 for a TransformerEncoderLayer (one block), got {layer!r}")
        cfg, params = encoder_layer(source, seq_len, _check_dtype(dtype))
        return cfg, _to(params, device)
    fam = _open(source)
    layer, dtype = _check_layer(fam, layer), _check_dtype(dtype)
    cfg = _block(fam, seq_len, layer)
    return cfg, _to(fam.read_layer(layer, dtype), device)


def load_model(
    source: Source, *, dtype: torch.dtype = torch.float64, seq_len: int | None = None, device: Device = None
) -> list[tuple[BlockConfig, dict[str, Tensor]]]:
    """Every layer of ``source``, layer 0 first, as ``(cfg, params)`` pairs: each layer's own ``cfg`` (the
    same for every layer but where the layers differ in ``window`` and ``rope_theta``, Gemma)."""
    fam = _open(source)
    dtype = _check_dtype(dtype)
    cfgs = [_block(fam, seq_len, i) for i in range(fam.n_layers)]
    for i in range(fam.n_layers):  # all names and shapes, before reading
        fam.ckpt.require(fam.layer_shapes(i))
    return [(cfgs[i], _to(fam.read_layer(i, dtype), device)) for i in range(fam.n_layers)]


def _ids(family: Family, text_or_ids: TextOrIds) -> list[int]:
    ids = tokens.token_ids(family.ckpt, text_or_ids, family.vocab_size, family.max_positions)
    family.check_length(len(ids))
    return ids


def token_ids(source: Source, text_or_ids: TextOrIds) -> list[int]:
    """``text_or_ids`` as checked token ids: a text is tokenised with the checkpoint's
    ``tokenizer.json`` (special tokens included, never padded or truncated)."""
    return _ids(_open(source), text_or_ids)


def token_strings(source: Source, text_or_ids: TextOrIds) -> list[str]:
    """The token of each position, as the tokenizer writes it (``[CLS]``, ``hello``, ``##z``)."""
    fam = _open(source)
    return tokens.token_strings(fam.ckpt, _ids(fam, text_or_ids))


def _check_stack(family: Family, stack: list, dtype: torch.dtype) -> list[dict[str, Tensor]]:
    """The weights of a :func:`load_model` result, checked to be this model's, in ``dtype``."""
    shapes = family.block.param_shapes
    if not isinstance(stack, (list, tuple, str)) and isinstance(stack, Sequence):  # hv.load_model's Model
        stack = list(stack)

    def fits(params: object) -> bool:
        return isinstance(params, dict) and all(
            isinstance(params.get(n), Tensor) and tuple(params[n].shape) == shape and params[n].dtype == dtype
            for n, shape in shapes.items()
        )

    ok = (
        isinstance(stack, (list, tuple))
        and len(stack) == family.n_layers
        and all(isinstance(layer, tuple) and len(layer) == 2 and fits(layer[1]) for layer in stack)
    )
    if not ok:
        raise InputError(
            f"layers must be load_model(source, dtype={dtype})'s list of {family.n_layers} "
            "(cfg, params) pairs for this source"
        )
    return [params for _, params in stack]


def hidden_states(
    source: Source,
    text_or_ids: TextOrIds,
    *,
    upto: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: Device = None,
    layers: list[tuple[BlockConfig, dict[str, Tensor]]] | None = None,
) -> list[Tensor]:
    """``[X_0, X_1, …, X_upto]``, each ``(L, d)``: ``X_0`` the embeddings' output and
    ``X_{i+1} = hessviz.forward(layer i, X_i)``; ``upto`` defaults to the number of layers
    (then the last one is the last layer's output, before GPT-2's final ``ln_f``).

    ``layers``, the result of :func:`load_model` for this source and ``dtype``, saves reading
    the layers' weights again (an app keeps it in memory and runs many texts through it).
    """
    fam = _open(source)
    dtype = _check_dtype(dtype)
    upto = fam.n_layers if upto is None else upto
    if isinstance(upto, bool) or not isinstance(upto, int) or not 0 <= upto <= fam.n_layers:
        raise ConfigError(f"upto must be an integer in [0, {fam.n_layers}], got {upto!r}")
    ids = _ids(fam, text_or_ids)
    loaded = None if layers is None else _check_stack(fam, layers, dtype)
    fam.ckpt.require(fam.embedding_shapes())  # every name and shape, before reading
    for i in range(upto if loaded is None else 0):
        fam.ckpt.require(fam.layer_shapes(i))
    states = [fam.embed(ids, dtype).to(device)]
    for i in range(upto):
        params = fam.read_layer(i, dtype) if loaded is None else loaded[i]
        states.append(forward(fam.layer_block(i, len(ids)), _to(params, device), states[-1]))
    return states


def layer_inputs(
    source: Source,
    text_or_ids: TextOrIds,
    layer: int,
    *,
    dtype: torch.dtype = torch.float64,
    device: Device = None,
) -> Tensor:
    """``X (L, d)``: the hidden state entering layer ``layer`` for ``text_or_ids`` (the
    embeddings, then layers ``0 … layer−1``; dropout off, no padding)."""
    _check_layer(_open(source), layer)
    return hidden_states(source, text_or_ids, upto=layer, dtype=dtype, device=device)[-1]


def layer_for_text(
    source: Source,
    text_or_ids: TextOrIds,
    layer: int,
    *,
    dtype: torch.dtype = torch.float64,
    device: Device = None,
) -> tuple[BlockConfig, dict[str, Tensor], Tensor]:
    """``(cfg, params, X)`` in one call: layer ``layer`` of ``source`` with ``cfg.seq_len`` fitted to
    the text (``L`` tokens), and ``X (L, d)`` entering it, ready for ``hv.hessian(cfg, params, X, …)``.

    The same as :func:`load_layer` with ``seq_len = L`` and :func:`layer_inputs`, checked once."""
    fam = _open(source)
    layer, dtype = _check_layer(fam, layer), _check_dtype(dtype)
    ids = _ids(fam, text_or_ids)
    cfg = _block(fam, len(ids), layer)
    X = hidden_states(source, ids, upto=layer, dtype=dtype, device=device)[-1]
    return cfg, _to(fam.read_layer(layer, dtype), device), X
