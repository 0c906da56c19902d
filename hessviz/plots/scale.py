r"""What makes large, signed matrices drawable: the symmetric-log scale and tile reduction.

The symmetric log

.. math::
    s(h) = \operatorname{sign}(h)\,\log_{10}\!\left(1 + |h| / c\right),

is linear for ``|h| ≪ c`` and logarithmic beyond, so that entries spanning many decades
and of both signs stay visible around a white zero. Every symlog axis or colour bar of
:mod:`hessviz.plots` uses it, with ``c = max|h| · 10^(−decades)``.

A matrix larger than a browser can draw is reduced tile by tile, each tile shown by its
entry of largest magnitude (so a lone large entry is never averaged away).

>>> import numpy as np
>>> symlog(np.array([-1000.0, 0.0, 1000.0]), 1.0).round(3).tolist()
[-3.0, 0.0, 3.0]
>>> tile_extremes(np.array([[1.0, -5.0], [2.0, 3.0]]), [0], [0]).tolist()
[[-5.0]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hessviz.plots.style import power_label

MAX_CELLS = 400
"""Largest side (in cells) of a Hessian heatmap sent to the browser; larger matrices are reduced."""


def max_abs(H: np.ndarray) -> float:
    """``max |H|`` (0 when empty) without the temporary ``|H|``: on a dense term of P = 9,216 that
    copy was 680 MB of fresh pages and most of the Hessian map's figure (``benchmarks/APP.md``)."""
    H = np.asarray(H)
    return max(float(H.max()), -float(H.min())) if H.size else 0.0


def symlog_threshold(H: np.ndarray, decades: float = 4.0) -> float:
    """The linear threshold ``c``: ``max|H| · 10^(−decades)`` (1 when H is all zero)."""
    m = max_abs(H)
    return m * 10.0 ** (-decades) if m > 0 else 1.0


def symlog(H: np.ndarray, c: float) -> np.ndarray:
    """``sign(H) · log10(1 + |H|/c)``."""
    return np.sign(H) * np.log10(1.0 + np.abs(H) / c)


def symlog_ticks(max_abs: float, c: float) -> tuple[list[float], list[str]]:
    """Axis ticks at ``0, ±10^k`` (in symlog units) labelled with the true values, in powers of
    ten (``−10⁻², 0, 1``), the notation of every other log axis (:func:`hessviz.plots.style.power_label`)."""
    if max_abs <= 0:
        return [0.0], ["0"]
    hi = math.floor(math.log10(max_abs))
    lo = math.ceil(math.log10(c))
    powers = list(range(lo, hi + 1))
    if len(powers) > 5:
        step = math.ceil(len(powers) / 5)
        powers = powers[::-1][::step][::-1]
    vals, text = [0.0], ["0"]
    for p in powers:
        v = float(np.log10(1 + 10.0**p / c))
        vals = [-v, *vals, v]
        text = [power_label(-(10.0**p)), *text, power_label(10.0**p)]
    return vals, text


def reduction_factor(n: int, max_cells: int = MAX_CELLS) -> int:
    """Smallest tile size that brings ``n`` under ``max_cells``."""
    return max(1, math.ceil(n / max_cells))


def reduce_index(n: int, factor: int) -> list[slice]:
    """Tiles of ``factor`` consecutive indices covering ``range(n)`` (the last may be shorter)."""
    return [slice(i, min(i + factor, n)) for i in range(0, n, factor)]


def tile_extremes(M: np.ndarray, row_starts: Sequence[int], col_starts: Sequence[int]) -> np.ndarray:
    """``M`` reduced to one cell per tile, the tile's entry of largest magnitude.

    Tiles run from each start to the next one (the last to the end), rows and columns alike.
    """
    rs, cs = np.asarray(row_starts), np.asarray(col_starts)
    # along each row first (contiguous in memory), then down the few tile columns: faster than
    # rows first (benchmarks/APP.md)
    hi = np.maximum.reduceat(np.maximum.reduceat(M, cs, axis=1), rs, axis=0)
    lo = np.minimum.reduceat(np.minimum.reduceat(M, cs, axis=1), rs, axis=0)
    return np.where(np.abs(hi) >= np.abs(lo), hi, lo)


def reduce_blocks(H: np.ndarray, offsets: dict[str, slice], factor: int) -> tuple[np.ndarray, list]:
    """Reduce ``H`` tile by tile within each block, keeping the entry of largest magnitude.

    Returns the reduced matrix and, per reduced index, ``(block, first, last)`` (0-based,
    inclusive, inside the block): tiles never straddle a block boundary.
    """
    starts, labels = [], []
    for name, sl in offsets.items():
        for t in reduce_index(sl.stop - sl.start, factor):
            starts.append(sl.start + t.start)
            labels.append((name, t.start, t.stop - 1))
    if factor == 1:
        return np.asarray(H)[np.ix_(starts, starts)], labels
    return tile_extremes(H, starts, starts), labels


def reduce_segments(
    H: np.ndarray, segments: Sequence[tuple[str, np.ndarray]], factor: int
) -> tuple[np.ndarray, list]:
    """:func:`reduce_blocks` for segments that need not be contiguous: ``(label, indices)``
    pairs, the indices (into ``H``'s rows and columns) in the order drawn.

    Used to draw a weight head by head (``W_Q[0]``, ``W_Q[1]``, …) when a head's entries are
    spread through the weight's ``vec_r`` (the columns of ``W_Q``). Tiles of ``factor``
    consecutive drawn positions never straddle a segment; each keeps its entry of largest
    magnitude. Rows are gathered one segment at a time (at most ``|segment| × 2 P`` extra).
    """
    order = (
        np.concatenate([np.asarray(idx, dtype=np.int64) for _, idx in segments])
        if segments
        else np.zeros(0, dtype=np.int64)
    )
    starts, labels, pos = [], [], 0
    for label, idx in segments:
        for t in reduce_index(len(idx), factor):
            starts.append(pos + t.start)
            labels.append((label, t.start, t.stop - 1))
        pos += len(idx)
    if factor == 1:
        return np.asarray(H)[np.ix_(order, order)], labels
    out, pos = [], 0
    for _, idx in segments:
        n = len(idx)
        local = [s - pos for s in starts if pos <= s < pos + n]
        rows = np.asarray(H)[np.asarray(idx, dtype=np.int64)][:, order]
        out.append(tile_extremes(rows, local, starts))
        pos += n
    return np.concatenate(out, axis=0), labels
