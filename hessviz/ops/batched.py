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
  weight's size is allocated.
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


def add_primal_times_(out: Tensor, a: Tensor, B: Tensor) -> Tensor:
    """``out_j += a B_j``: ``(k, L, m) += (L, n) @ (k, n, m)``; ``out`` may be a column block."""
    for o, b in zip(out, B):
        o.addmm_(a, b)
    return out


def add_primal_times_T_(out: Tensor, a: Tensor, B: Tensor) -> Tensor:
    """``out_j += a B_jᵀ``: ``(k, L, n) += (L, m) @ (k, n, m)ᵀ``; ``a`` may be a column block."""
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
    ``out (k, n, m)`` is written once (``beta = 0``: its contents are not read)."""
    pairs = [(lf, r) for lf, r in zip(left, right) if lf is not None and r is not None]
    for j in range(k):
        lhs = [lf if lf.ndim == 2 else lf[j] for lf, _ in pairs]
        rhs = [r if r.ndim == 2 else r[j] for _, r in pairs]
        a, b = (lhs[0].T, rhs[0]) if len(pairs) == 1 else (torch.cat(lhs).T, torch.cat(rhs))
        if alpha == 1.0 and beta == 0.0:
            torch.mm(a, b, out=out[j])
        else:
            torch.addmm(out[j], a, b, beta=beta, alpha=alpha, out=out[j])
    return out
