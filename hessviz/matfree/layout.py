r"""Where each entry of ``θ'`` lives: whole weights and head slices as positions in ``vec_r``.

``θ'`` is the concatenation, in the order of ``names``, of ``vec_r`` of each named weight or
head slice (``cfg.head_indices``). The sweep works on whole weights: :meth:`Layout.scatter`
turns ``V (k, P')`` into per-weight tangents (zero outside the slices), and
:meth:`Layout.gather` reads ``(k, P')`` back from per-weight products.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hessviz.config import BlockConfig, parse_name


@dataclass(frozen=True)
class Slot:
    """Where one name (a whole weight or a head slice) sits: its columns of ``θ'`` and its
    positions in its whole weight."""

    name: str
    base: str
    index: Tensor | None
    """positions in ``vec_r`` of the whole weight, ``None`` for the whole weight."""
    columns: slice


class Layout:
    """The slots of ``θ'`` for ``names`` (checked, in θ order) of ``cfg``."""

    def __init__(self, cfg: BlockConfig, names: tuple[str, ...], device: torch.device):
        self.cfg, self.names = cfg, names
        self.slots = []
        for name, columns in cfg.offsets(names).items():
            base, head = parse_name(name)
            index = None if head is None else cfg.head_indices(name).to(device)
            self.slots.append(Slot(name, base, index, columns))
        self.size = sum(cfg.param_size(n) for n in names)
        self.bases = tuple(dict.fromkeys(p.base for p in self.slots))

    def scatter(self, V: Tensor) -> dict[str, Tensor]:
        """``V (k, P') -> {base: (k, *shape)}`` with zeros outside the named slices."""
        k = V.shape[0]
        out: dict[str, Tensor] = {}
        for p in self.slots:
            shape = self.cfg.param_shapes[p.base]
            if p.index is None:
                out[p.base] = V[:, p.columns].reshape(k, *shape)
                continue
            flat = out[p.base].reshape(k, -1) if p.base in out else \
                V.new_zeros(k, self.cfg.param_size(p.base))
            flat[:, p.index] = V[:, p.columns]
            out[p.base] = flat.reshape(k, *shape)
        return out

    def gather(self, products: dict[str, Tensor | None], k: int, like: Tensor) -> Tensor:
        """``{base: (k, *shape) or None} -> (k, P')`` (``None`` reads as zero)."""
        out = like.new_empty(k, self.size)
        for p in self.slots:
            prod = products.get(p.base)
            if prod is None:
                out[:, p.columns] = 0.0
                continue
            if p.index is None:                        # one copy, straight from a strided split
                out[:, p.columns].view(prod.shape).copy_(prod)
            else:
                out[:, p.columns] = prod.reshape(k, -1)[:, p.index]
        return out
