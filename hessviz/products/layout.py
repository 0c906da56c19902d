r"""Where each entry of ``θ'`` lives: whole weights and head slices inside their whole weights.

``θ'`` is the concatenation, in the order of ``names``, of ``vec_r`` of each named weight or
head slice. The sweep works on whole weights: :meth:`Layout.scatter` turns ``V (k, P')`` into
per-weight tangents (zero outside the slices), and :meth:`Layout.gather` reads ``(k, P')`` back
from per-weight products. A head slice is found inside its whole weight by the head's
:class:`~hessviz.block.weights.Unit`, the strided view the dense assembler writes its blocks through:
one head-slicing mechanism for both engines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig, parse_name
from hessviz.block.weights import Unit, units_of


@dataclass(frozen=True)
class Slot:
    """Where one name (a whole weight or a head slice) sits: its columns of ``θ'`` and its
    positions in its whole weight."""

    name: str
    base: str
    head: Unit | None
    """the head's view inside ``vec_r`` of the whole weight, ``None`` for the whole weight."""
    columns: slice


class Layout:
    """The slots of ``θ'`` for ``names`` (checked, in θ order) of ``cfg``."""

    def __init__(self, cfg: BlockConfig, names: tuple[str, ...]):
        self.cfg, self.names = cfg, names
        self.slots = []
        block = cfg.block if cfg.is_stack else cfg  # every layer has the block's shapes
        for name, columns in cfg.offsets(names).items():
            base, head = parse_name(name)
            unit = None if head is None else units_of(block, cfg.layer_of(base)[1])[head]
            self.slots.append(Slot(name, base, unit, columns))
        self.size = sum(cfg.param_size(n) for n in names)
        self.bases = tuple(dict.fromkeys(p.base for p in self.slots))

    def scatter(self, V: Tensor) -> dict[str, Tensor]:
        """``V (k, P') -> {base: (k, *shape)}`` with zeros outside the named slices."""
        k = V.shape[0]
        out: dict[str, Tensor] = {}
        for p in self.slots:
            shape = self.cfg.param_shapes[p.base]
            if p.head is None:
                out[p.base] = V[:, p.columns].reshape(k, *shape)
                continue
            flat = (
                out[p.base].reshape(k, -1) if p.base in out else V.new_zeros(k, self.cfg.param_size(p.base))
            )
            p.head.rows_of(flat, 1).copy_(V[:, p.columns].unflatten(1, p.head.shape))
            out[p.base] = flat.reshape(k, *shape)
        return out

    def destinations(self, out: Tensor) -> dict[str, Tensor]:
        """``out (k, P') -> {base: (k, *shape)}``: views of ``out`` where a whole weight's product
        can be written in place (so :meth:`gather` has nothing to copy). Head slices have none."""
        k = out.shape[0]
        return {
            p.base: out[:, p.columns].view(k, *self.cfg.param_shapes[p.base])
            for p in self.slots
            if p.head is None
        }

    def gather(
        self,
        products: Mapping[str, Tensor | None],
        k: int,
        like: Tensor,
        out: Tensor | None = None,
        alpha: float = 1.0,
        accumulate: bool = False,
    ) -> Tensor:
        """``{base: (k, *shape) or None} -> (k, P')`` (``None`` reads as zero), into ``out`` when
        given; a product already written in its place (:meth:`destinations`) is not copied (nor
        scaled: it was written scaled). ``alpha``, ``accumulate``: ``out`` becomes
        ``(out if accumulate else 0) + alpha · products`` (a sum over a batch's sequences)."""
        out = like.new_empty(k, self.size) if out is None else out

        def put(place: Tensor, prod: Tensor) -> None:
            if accumulate:
                place.add_(prod, alpha=alpha)
            elif alpha != 1.0:
                torch.mul(prod, alpha, out=place)
            else:
                place.copy_(prod)

        for p in self.slots:
            prod = products.get(p.base)
            if prod is None:
                if not accumulate:
                    out[:, p.columns] = 0.0
                continue
            if p.head is None:  # one copy, straight from a strided split
                place = out[:, p.columns].view(prod.shape)
                if not (prod.data_ptr() == place.data_ptr() and prod.stride() == place.stride()):
                    put(place, prod)
            else:
                put(out[:, p.columns].unflatten(1, p.head.shape), p.head.rows_of(prod.reshape(k, -1), 1))
        return out
