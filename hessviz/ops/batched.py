r"""Matrix products between unbatched primals and ``k`` tangents, without copying weight-sized operands.

Shapes: primals ``a (L, n)``, weights ``W (n, m)``; tangents carry a leading ``k``. Two kinds:

* activation-sized tangents ``A (k, L, n)`` times a primal weight: ``k`` folds into the rows of
  one GEMM (a reshape, no copy);
* per-head primals times tangents, ``X (H, a, b) @ Y (k, H, b, w)`` (the attention matrices
  ``A``, ``c S̄`` against ``V̇``, ``K̇``, ``Q̇``): ``k`` folds into the columns of one batched GEMM
  (:func:`primal_times_heads`) instead of broadcasting ``X`` to ``(k, H, a, b)``, a copy of ``k``
  attention-sized matrices;
* weight-sized tangents ``Ẇ (k, n, m)``: one GEMM per column ``j`` (the operands are large
  enough for BLAS to run at full speed, and folding ``k`` into a matrix side would copy
  ``Ẇ``). Results go straight into their destination (``out``, possibly a strided column
  block of a wider tensor), accumulated in place (``addmm_``), so no temporary of the
  weight's size is allocated. Where the ``k`` columns are the *last*, unit-stride index
  (:func:`columns_last`: the tangents are views of a C-contiguous ``(P', k)`` block, as
  ``torch.randn(P', k)`` makes it), ``Ẇ`` is already the ``(n, m·k)`` matrix ``[Ẇ_1 … Ẇ_k]``
  interleaved: ``a Ẇ_j`` for every ``j`` is one GEMM over it, and ``a Ẇ_jᵀ`` one batched GEMM over
  its ``n`` rows ``(m, k)``; only activation-sized results are permuted.
"""

from __future__ import annotations

import torch
from torch import Tensor

K_BLOCK = 64
"""Rows of a weight per GEMM in :func:`rows_times` (64 × 1536 float64 values: 0.8 MB, in the core's cache)."""

K_BLOCK_ROWS = 64
"""Up to this many activation rows :func:`rows_times` splits the weight: a skinny ``a W`` streams
the weight from memory, and MKL's kernel for it ran at 0.74× the speed of ``a Wᵀ`` on SmolLM2's
weights (16 rows, one thread, weights not in cache); blocks of 64 contiguous rows, accumulated,
took 0.74× / 0.82× / 0.84× the time of one GEMM for weights ``576 × 1536 / 1536 × 576 / 576 × 576``
at 16 rows and 0.79× / 0.91× / 1.0× at 64 (issue 47). Wider products are compute-bound: one GEMM."""


def rows_times(a: Tensor, W: Tensor, out: Tensor) -> Tensor:
    """``out = a W`` for ``a (r, n)``, ``W (n, m)`` into ``out (r, m)`` (a column block of a wider
    tensor is fine: unit stride), in :data:`K_BLOCK`-row blocks of ``W`` when ``r`` is small
    (:data:`K_BLOCK_ROWS`) on the CPU: the same sum, accumulated block by block."""
    n = W.shape[0]
    if a.shape[0] > K_BLOCK_ROWS or n <= K_BLOCK or a.device.type != "cpu":  # a GPU: one launch
        return torch.mm(a, W, out=out)
    torch.mm(a[:, :K_BLOCK], W[:K_BLOCK], out=out)
    for k in range(K_BLOCK, n, K_BLOCK):
        out.addmm_(a[:, k : k + K_BLOCK], W[k : k + K_BLOCK])
    return out


def tangent_times(A: Tensor, b: Tensor) -> Tensor:
    """``A_j b``: ``(k, L, n), (n, m) -> (k, L, m)`` (one GEMM over ``k L`` rows)."""
    k, L, n = A.shape
    return (A.reshape(k * L, n) @ b).reshape(k, L, b.shape[1])


def primal_times_heads(X: Tensor, Y: Tensor) -> Tensor:
    """``X Y_j`` for every ``j``: ``(H, a, b), (k, H, b, w) -> (k, H, a, w)``, one batched GEMM over
    ``H`` with ``k w`` columns (``Y`` regrouped, a copy of the small tangent; the result a view)."""
    if Y.dim() != X.dim() + 1:
        return X @ Y
    k, H, b, w = Y.shape
    if k == 1:
        return (X @ Y[0])[None]
    out = X @ Y.permute(1, 2, 0, 3).reshape(H, b, k * w)  # (H, a, k w)
    return out.unflatten(-1, (k, w)).permute(2, 0, 1, 3)


def columns_last(B: Tensor) -> bool:
    """Whether the tangents ``B (k, n, m)``, ``k > 1``, are a C-contiguous ``(n, m, k)`` block seen
    with ``k`` first (``B.permute(1, 2, 0)`` is contiguous): the ``k`` columns interleaved."""
    return B.shape[0] > 1 and B.permute(1, 2, 0).is_contiguous()


def add_primal_times_(out: Tensor, a: Tensor, B: Tensor) -> Tensor:
    """``out_j += a B_j``: ``(k, L, m) += (L, n) @ (k, n, m)``; ``out`` may be a column block.
    Columns last (:func:`columns_last`): ``a [B_1 … B_k]``, one GEMM ``(L, n) @ (n, m·k)``."""
    if columns_last(B):
        k, n, m = B.shape
        out += (a @ B.permute(1, 2, 0).reshape(n, m * k)).view(-1, m, k).permute(2, 0, 1)
        return out
    for o, b in zip(out, B):
        o.addmm_(a, b)
    return out


def add_primal_times_T_(out: Tensor, a: Tensor, B: Tensor) -> Tensor:
    """``out_j += a B_jᵀ``: ``(k, L, n) += (L, m) @ (k, n, m)ᵀ``; ``a`` may be a column block.
    Columns last (:func:`columns_last`): one batched GEMM over the ``n`` rows of ``B``,
    ``a (L, m) @ B[α] (m, k)``, read in place."""
    if columns_last(B):
        out += (a @ B.permute(1, 2, 0)).permute(2, 1, 0)  # (n, L, k) -> (k, L, n)
        return out
    for o, b in zip(out, B):
        o.addmm_(a, b.T)
    return out


def stacked_T_times(
    left: list[Tensor | None],
    right: list[Tensor | None],
    k: int,
    out: Tensor,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> Tensor:
    r"""``out_j = beta out_j + alpha Σ_i left_iᵀ right_i`` for pairs whose members are ``(L, ·)``
    primals or ``(k, L, ·)`` tangents (``None`` pairs skipped): one GEMM per ``j`` over the
    stacked rows, ``[l_1; l_2]ᵀ [r_1; r_2] = l_1ᵀ r_1 + l_2ᵀ r_2``, so the weight-sized
    ``out (k, n, m)`` is written once (``beta = 0``: its contents are not read). The rows of all
    ``k`` columns are stacked by two copies (:func:`_stack_rows`), not ``2k`` concatenations."""
    pairs = [(lf, r) for lf, r in zip(left, right) if lf is not None and r is not None]
    if len(pairs) == 1:
        lhs, rhs = pairs[0]
    else:  # every column's stacked rows in two copies, not 2 k concatenations
        lhs, rhs = (_stack_rows([p[side] for p in pairs], k) for side in (0, 1))
    for j in range(k):
        a = (lhs if lhs.ndim == 2 else lhs[j]).T
        b = rhs if rhs.ndim == 2 else rhs[j]
        if alpha == 1.0 and beta == 0.0:
            torch.mm(a, b, out=out[j])
        else:
            torch.addmm(out[j], a, b, beta=beta, alpha=alpha, out=out[j])
    return out


def _stack_rows(parts: list[Tensor], k: int) -> Tensor:
    """``[p_1; p_2; …]`` stacked along the rows for every column: ``(k, Σ rows, w)`` from ``(rows, w)``
    primals (repeated) and ``(k, rows, w)`` tangents; ``(Σ rows, w)`` once when all are primals."""
    if all(p.ndim == 2 for p in parts):
        return torch.cat(parts)
    rows = sum(p.shape[-2] for p in parts)
    out = parts[0].new_empty(k, rows, parts[0].shape[-1])
    start = 0
    for p in parts:
        out[:, start : start + p.shape[-2]] = p
        start += p.shape[-2]
    return out
