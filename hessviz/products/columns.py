r"""Product columns as the sweeps take them: ``V (k, n)`` with unit-stride rows, whatever ``v``'s layout.

Every engine sweeps ``k`` product columns as the **rows** of a ``(k, n)`` tensor, each row
unit-stride (a weight's tangent is then a view, :meth:`~hessviz.products.layout.Layout.scatter`).
A user's ``v (n, k)`` comes in any layout: F-contiguous (or the transpose of a ``(k, n)``
tensor) is already that, a view; C-contiguous (``torch.randn(n, k)``) or a column slice
(``w[:, ::2]``) is not, and must be transposed once.

A plain ``copy_`` of the transposed view walks the output row by row and reads the input with
stride ``k``: every input cache line is fetched ``k`` times from memory (a ``(1.77 M, 8)`` float64
block: 58 ms against 15 ms for a contiguous copy of the same 113 MiB, one thread). :func:`unit_rows`
copies it in tiles of :func:`tile_rows` input rows (about :data:`TILE_BYTES` of input, which stays
in the cache while its ``k`` output rows are written): 25 ms, the cost of a plain copy
(``/tmp`` timings of issue 47, alternating, median of 7). The copy is exact: values are moved, never
computed. Its buffer is :func:`hessviz.runtime.pages.empty` (huge pages, no fault per 4 KiB).
"""

from __future__ import annotations

from torch import Tensor

from hessviz.runtime import pages

TILE_BYTES = 512 << 10
"""Bytes of input one tile spans (half a typical L2): on the MiniLM-sized ``P = 1.77 M``, ``k = 8``,
8 192-row tiles copied a transposed block in 25 ms, 2 048 in 29 ms, 16 384 in 32 ms and one untiled
``copy_`` in 58 ms."""


def tile_rows(V: Tensor) -> int:
    """Columns of ``V (k, n)`` per tile of :func:`unit_rows`: :data:`TILE_BYTES` of the input it
    reads (``V.stride(1)`` elements apart), at least 1 024 (the Python loop's cost per tile)."""
    step = max(abs(V.stride(1)), 1) * V.element_size()
    return max(1024, TILE_BYTES // step)


def unit_rows(V: Tensor, out: Tensor | None = None) -> Tensor:
    """``V (k, n)`` with unit-stride rows: ``V`` itself when its rows already are (no copy), else one
    tiled copy into ``out`` (a ``(k, n)`` tensor with unit-stride rows, e.g. a reused buffer) or a
    fresh contiguous buffer. The values are ``V``'s, bit for bit."""
    if V.ndim != 2:
        raise ValueError(f"unit_rows takes a (k, n) tensor, got shape {tuple(V.shape)}")
    k, n = V.shape
    if V.stride(1) == 1 or n <= 1 or (k == 1 and out is None):
        if out is None:
            return V if V.stride(1) == 1 or n <= 1 else V.reshape(1, n)
        return out.copy_(V)
    if out is None:
        out = pages.empty((k, n), V)
    if V.device.type != "cpu":  # a GPU's copy kernel tiles by itself
        return out.copy_(V)
    tile = tile_rows(V)
    for start in range(0, n, tile):
        out[:, start : start + tile].copy_(V[:, start : start + tile])
    return out
