"""A whole model: the embeddings, every layer as one stack, the final norm and the head.

>>> import hessviz as hv
>>> model = hv.load_model("pydoc-llama")
>>> model.cfg.n_layers == len(model), model.names[0]
(True, 'l0.ln1_gamma')
>>> cfg, params = model[0]                       # as before: (cfg, params) of one layer per item

``hv.load_model(source)`` returns a :class:`Model`. It is also the sequence of ``(cfg, params)``
pairs of every layer that :func:`hessviz.pretrained.load.load_model` returns (the same tensors,
not copies), so ``hidden_states(source, text, layers=model)`` and ``for cfg, params in model``
keep working.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hessviz.config import BlockConfig, layer_name
from hessviz.errors import CheckpointError, InputError, ModelRangeError
from hessviz.pretrained import load
from hessviz.pretrained.families import Family
from hessviz.pretrained.objectives import LMHead, lm_head


@dataclass(frozen=True, eq=False)
class Model(Sequence):
    """A loaded checkpoint.

    ``cfg``: the stack of ``n_layers`` blocks (``seq_len`` the model's positions; fitted to
    the ids by :func:`hessviz.model_hessian`); ``params``: every layer weight by its stack name
    (``l{i}.W_Q``; the bare block names for a one-layer model, as ``BlockConfig`` spells them);
    ``head``: the final norm and the LM head of a decoder, ``None`` for an encoder (BERT);
    ``family``: the checkpoint's reader (the embeddings ``ids -> X0`` come from it).
    """

    source: str
    cfg: BlockConfig
    params: dict[str, Tensor] = field(repr=False)
    head: LMHead | None = field(repr=False)
    family: Family = field(repr=False)
    layers: list[tuple[BlockConfig, dict[str, Tensor]]] = field(repr=False)
    """The ``(cfg, params)`` pair of each layer (the old ``load_model`` result)."""

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i):
        return self.layers[i]

    def __iter__(self) -> Iterator[tuple[BlockConfig, dict[str, Tensor]]]:
        return iter(self.layers)

    @property
    def name(self) -> str:
        return self.family.ckpt.name

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.params.values())).dtype

    @property
    def names(self) -> tuple[str, ...]:
        """Every layer weight, ``l{i}.…``, in θ order."""
        return tuple(layer_name(i, n) for i in range(len(self)) for n in self.cfg.block.param_names)

    @property
    def causal(self) -> bool:
        return bool(self.cfg.causal)

    def check_ids(self, ids: object, need: int = 1) -> Tensor:
        """``ids`` as a ``(B, L)`` int64 tensor, checked: shape, range of the vocabulary, ``L``
        within the model's positions (and its sliding window), ``L ≥ need``."""
        if isinstance(ids, (list, tuple)):
            try:
                ids = torch.tensor(ids)
            except (TypeError, ValueError) as e:
                raise InputError(f"ids must be (L,) or (B, L) integers of equal-length sequences: {e}") \
                    from None
        if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.is_complex() \
                or ids.dtype == torch.bool:
            raise InputError(f"ids must be an integer tensor of shape (L,) or (B, L), got "
                             f"{getattr(ids, 'dtype', type(ids).__name__)}")
        if ids.dim() not in (1, 2) or ids.numel() == 0:
            raise InputError(f"ids must have shape (L,) or (B, L) (a batch of equal-length sequences), got "
                             f"{tuple(ids.shape)}")
        ids = ids.reshape(-1, ids.shape[-1]).to(torch.int64)
        L, V, top = ids.shape[1], self.family.vocab_size, self.family.max_positions
        if not need <= L <= top:
            raise ModelRangeError(f"ids must have a sequence length L in [{need}, {top}] ({self.name!r} has "
                                  f"{top} positions), got L = {L}")
        if bool(((ids < 0) | (ids >= V)).any()):
            raise InputError(f"ids must be token ids in [0, {V - 1}] ({self.name!r} has {V} tokens)")
        self.family.check_length(L)
        return ids

    def embed(self, ids: Tensor) -> list[Tensor]:
        """``[X0_b (L, d)]``: the hidden state entering layer 0, per sequence of checked ``ids (B, L)``."""
        return [self.family.embed(row.tolist(), self.dtype) for row in ids]


def load_model(source: load.Source, *, dtype: torch.dtype = torch.float64) -> Model:
    """The checkpoint ``source`` as a :class:`Model`: every layer (checked, then read), the
    final norm and the LM head of a decoder (``head = None`` for an encoder)."""
    fam = load._open(source)
    pairs = load.load_model(source, dtype=dtype)
    cfg = dataclasses.replace(fam.block, n_layers=len(pairs))
    if len(pairs) == 1:
        params = dict(pairs[0][1])
    else:
        params = {layer_name(i, n): p for i, (_, ps) in enumerate(pairs) for n, p in ps.items()}
    try:
        head = lm_head(source, dtype)
    except CheckpointError:
        if fam.has_head():                          # a decoder whose head is missing or malformed
            raise
        head = None
    return Model(str(source), cfg, params, head, fam, pairs)
