r"""Product columns as the sweeps take them: ``V (k, n)`` with unit-stride rows, whatever ``v``'s layout.

Every engine sweeps ``k`` product columns as the **rows** of a ``(k, n)`` tensor, each row
unit-stride (a weight's tangent is then a view, :meth:`~hessviz.products.layout.Layout.scatter`).
A user's ``v (n, k)`` comes in any layout: F-contiguous (or the transpose of a ``(k, n)``
tensor) is already that, a view; C-contiguous (``torch.randn(n, k)``) or a column slice
(``w[:, ::2]``) is not, and must be transposed once (:func:`unit_rows`) for an engine that needs
unit-stride rows.

An engine whose GEMMs take the columns *last* (the closed-form tape on the CPU:
:func:`hessviz.ops.batched.columns_last`, each weight tangent the ``(n, m·k)`` matrix
``[Ẇ_1 … Ẇ_k]`` interleaved) sweeps a C-contiguous ``v (n, k)`` as it is, with no copy at all, and a
column slice after one streaming copy into C order (:func:`sweepable`): rows read and written in
order, no transposition.

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


def is_columns_last(V: Tensor) -> bool:
    """Whether ``V (k, n)``, ``k > 1``, is the transpose of a C-contiguous ``(n, k)`` block."""
    k = V.shape[0]
    return V.ndim == 2 and k > 1 and V.stride(0) == 1 and V.stride(1) == k


def in_order(V: Tensor, columns_last: bool) -> bool:
    """Whether an engine that takes the columns last (``columns_last``) sweeps ``V (k, n)`` in C order:
    on the CPU, ``k > 1`` rows of a row-major ``v (n, ·)`` (C-contiguous, a column slice, a chunk of
    either): as it is when :func:`is_columns_last`, else after one streaming copy."""
    if not columns_last or V.ndim != 2 or V.device.type != "cpu" or V.shape[0] <= 1 or V.stride(1) == 1:
        return False
    return abs(V.stride(1)) >= V.shape[0] * abs(V.stride(0))


def needs_copy(V: Tensor, columns_last: bool, bounds: list[tuple[int, int]]) -> bool:
    """Whether :func:`swept_chunks` copies ``V`` in C order (into a buffer of ``V.numel()``): unless its
    rows are unit-stride, or it is one C-contiguous chunk already."""
    return in_order(V, columns_last) and not (len(bounds) == 1 and is_columns_last(V))


def swept_chunks(
    V: Tensor, bounds: list[tuple[int, int]], columns_last: bool, scratch: Tensor | None = None
) -> list[Tensor]:
    """``V (k, n)``'s chunks of rows ``[start, stop)`` (``bounds``) in a layout the sweep takes: unit-stride
    rows (a view, or :func:`unit_rows` each), or, where the engine takes the columns last
    (:func:`in_order`), each the transpose of a C-contiguous ``(n, c)`` block: ``V`` itself when it is one
    chunk of one (no copy), else all chunks in one streaming copy into ``scratch`` (a flat buffer of at
    least ``k n`` elements, reused across calls: a fresh one's page faults cost as much as the copy).
    The copy goes in tiles of ``V``'s rows ``(·, k)`` (about :data:`TILE_BYTES`), each read once while
    every chunk's rows are written from it. The values are ``V``'s, bit for bit."""
    if not in_order(V, columns_last):
        return [unit_rows(V[a:b]) for a, b in bounds]
    if not needs_copy(V, columns_last, bounds):
        return [V]
    k, n = V.shape
    buffer = pages.empty((k * n,), V) if scratch is None else scratch
    runs: list[tuple[int, int, int]] = []  # (first row, chunk size, chunks): equal-sized chunks in a run
    for a, b in bounds:
        if runs and runs[-1][1] == b - a and runs[-1][0] + runs[-1][1] * runs[-1][2] == a:
            runs[-1] = (runs[-1][0], b - a, runs[-1][2] + 1)
        else:
            runs.append((a, b - a, 1))
    pairs = [
        (buffer[a * n : (a + c * g) * n].view(g, n, c), V[a : a + c * g].unflatten(0, (g, c)).transpose(1, 2))
        for a, c, g in runs
    ]  # (g, n, c) each: a run's chunks in C order, and V's rows seen that way
    step = max(1024, TILE_BYTES // (max(abs(V.stride(1)), 1) * V.element_size()))
    for first in range(0, n, step):
        for dst, src in pairs:
            dst[:, first : first + step].copy_(src[:, first : first + step])
    return [dst[i].T for dst, _ in pairs for i in range(dst.shape[0])]
