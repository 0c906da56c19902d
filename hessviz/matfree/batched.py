r"""Matrix products between an unbatched primal and ``k`` tangents, as single GEMMs.

``torch.matmul`` of ``(L, n)`` with ``(k, n, m)`` runs a batched kernel that is several times
slower on the CPU than one plain matrix product; these helpers fold ``k`` into a matrix side.
Shapes: ``a (L, n)`` primal, ``B (k, ·, ·)`` tangents. ``acc`` (same shape as the result, or
``None``) is added inside the GEMM (``addmm``), saving a pass over the result.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _mm(a: Tensor, b: Tensor, acc: Tensor | None) -> Tensor:
    return a @ b if acc is None else torch.addmm(acc, a, b)


def primal_times(a: Tensor, B: Tensor, acc: Tensor | None = None) -> Tensor:
    """``a B_j (+ acc_j)`` for every ``j``: ``(L, n), (k, n, m) -> (k, L, m)``."""
    k, n, m = B.shape
    if k == 1:
        return _mm(a, B[0], None if acc is None else acc[0])[None]
    out = (a @ B.transpose(0, 1).reshape(n, k * m)).reshape(-1, k, m).transpose(0, 1)
    return out if acc is None else out + acc


def primal_times_T(a: Tensor, B: Tensor, acc: Tensor | None = None) -> Tensor:
    """``a B_jᵀ (+ acc_j)``: ``(L, m), (k, n, m) -> (k, L, n)``."""
    k, n, m = B.shape
    if k == 1:
        return _mm(a, B[0].T, None if acc is None else acc[0])[None]
    out = (a @ B.reshape(k * n, m).T).reshape(-1, k, n).transpose(0, 1)
    return out if acc is None else out + acc


def primal_T_times(a: Tensor, B: Tensor, acc: Tensor | None = None) -> Tensor:
    """``aᵀ B_j (+ acc_j)``: ``(L, n), (k, L, m) -> (k, n, m)``."""
    k, L, m = B.shape
    if k == 1:
        return _mm(a.T, B[0], None if acc is None else acc[0])[None]
    out = (a.T @ B.transpose(0, 1).reshape(L, k * m)).reshape(-1, k, m).transpose(0, 1)
    return out if acc is None else out + acc


def tangent_T_times(A: Tensor, b: Tensor, acc: Tensor | None = None) -> Tensor:
    """``A_jᵀ b (+ acc_j)``: ``(k, L, n), (L, m) -> (k, n, m)``."""
    k, L, n = A.shape
    m = b.shape[1]
    if k == 1:
        return _mm(A[0].T, b, None if acc is None else acc[0])[None]
    flat = None if acc is None else acc.reshape(k * n, m)
    return _mm(A.transpose(-1, -2).reshape(k * n, L), b, flat).reshape(k, n, m)


def tangent_times(A: Tensor, b: Tensor, acc: Tensor | None = None) -> Tensor:
    """``A_j b (+ acc_j)``: ``(k, L, n), (n, m) -> (k, L, m)`` (one GEMM over ``k L`` rows)."""
    k, L, n = A.shape
    m = b.shape[1]
    return _mm(A.reshape(k * L, n), b, None if acc is None else acc.reshape(k * L, m)).reshape(k, L, m)
