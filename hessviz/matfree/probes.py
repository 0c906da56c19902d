"""Random vectors drawn on the host from a seeded ``torch.Generator``, so that a seed gives the
same vectors on every device, and made cheap to draw: the Rademacher probes of SLQ and Hutchinson
and the start vectors of the Lanczos core.

>>> import torch
>>> rademacher(10, 2, torch.Generator().manual_seed(0), torch.zeros(1, dtype=torch.float64)).abs().sum()
tensor(20., dtype=torch.float64)
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from hessviz.runtime import pages


def rademacher(n: int, count: int, gen: torch.Generator, like: Tensor, out: Tensor | None = None) -> Tensor:
    """``(count, n)`` entries ±1 from ``gen``, in the dtype and device of ``like`` (written into
    ``out``, a contiguous ``(count, n)`` tensor, when given: the same draws).

    Eight signs per random byte: ``gen`` (on the host, so a seed gives the same probes on every
    device) draws ``⌈n/8⌉`` bytes a probe, which travel to the device and become signs there by a
    lookup in :func:`_sign_table` (bit ``i`` of the byte: ``+1`` set, ``−1`` clear), written into
    one huge-page buffer (:func:`pages.empty`): an eighth of the draws, and no conversion per entry
    as ``randint(0, 2)`` and ``.to(float64)`` took (both timed on MiniLM's 30 probes:
    ``benchmarks/MATFREE_NOTES.md``)."""
    width = -(-n // 8)
    packed = torch.randint(0, 256, (count * width,), generator=gen, dtype=torch.uint8)
    direct = out is not None and width * 8 == n
    V = out if direct else pages.empty((count, width * 8), like)
    torch.index_select(
        _sign_table(like.dtype, like.device), 0, packed.to(like.device, torch.int32), out=V.view(-1, 8)
    )
    if direct or width * 8 == n:
        return V
    return V[:, :n].contiguous() if out is None else out.copy_(V[:, :n])


@functools.lru_cache(maxsize=8)
def _sign_table(dtype: torch.dtype, device: torch.device) -> Tensor:
    """``(256, 8)``: row ``b`` holds ``+1`` where bit ``i`` of ``b`` is set, ``−1`` where it is clear."""
    bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
    return (2 * bits - 1).to(dtype=dtype, device=device)
