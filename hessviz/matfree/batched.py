r"""Matrix products between an unbatched primal and ``k`` tangents, as single GEMMs.

``torch.matmul`` of ``(L, n)`` with ``(k, n, m)`` runs a batched kernel that is several times
slower on the CPU than one plain matrix product; these helpers fold ``k`` into a matrix side.
Shapes: ``a (L, n)`` primal, ``B (k, ·, ·)`` tangents.
"""

from __future__ import annotations

from torch import Tensor


def primal_times(a: Tensor, B: Tensor) -> Tensor:
    """``a B_j`` for every ``j``: ``(L, n), (k, n, m) -> (k, L, m)``."""
    k, n, m = B.shape
    if k == 1:
        return (a @ B[0])[None]
    return (a @ B.transpose(0, 1).reshape(n, k * m)).reshape(-1, k, m).transpose(0, 1)


def primal_times_T(a: Tensor, B: Tensor) -> Tensor:
    """``a B_jᵀ``: ``(L, m), (k, n, m) -> (k, L, n)``."""
    k, n, m = B.shape
    return (a @ B.reshape(k * n, m).T).reshape(-1, k, n).transpose(0, 1)


def primal_T_times(a: Tensor, B: Tensor) -> Tensor:
    """``aᵀ B_j``: ``(L, n), (k, L, m) -> (k, n, m)``."""
    k, L, m = B.shape
    if k == 1:
        return (a.T @ B[0])[None]
    return (a.T @ B.transpose(0, 1).reshape(L, k * m)).reshape(-1, k, m).transpose(0, 1)


def tangent_T_times(A: Tensor, b: Tensor) -> Tensor:
    """``A_jᵀ b``: ``(k, L, n), (L, m) -> (k, n, m)``."""
    k, L, n = A.shape
    return (A.transpose(-1, -2).reshape(k * n, L) @ b).reshape(k, n, -1)


def tangent_times(A: Tensor, b: Tensor) -> Tensor:
    """``A_j b``: ``(k, L, n), (n, m) -> (k, L, m)`` (one GEMM over ``k L`` rows)."""
    k, L, n = A.shape
    return (A.reshape(k * L, n) @ b).reshape(k, L, -1)
