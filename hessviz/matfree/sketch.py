r"""Hutch++ at the cost of its products: an orthonormal sketch from its Gram matrix, one batched product.

Hutch++ (Meyer, Musco, Musco and Woodruff 2021) splits ``m`` products three ways: ``s = m/3``
sketch the top of ``H`` (``Y = H S``, ``S`` Rademacher), ``Q = orth(Y)`` (``r ≤ s`` orthonormal
rows), ``tr(Q H Qᵀ)`` is exact, and ``g = m − 2s`` Rademacher probes estimate the rest,

    ``tr H ≈ tr(T) + (1/g) Σ_i [g_iᵀ H g_i − 2 (Q g_i)ᵀ (H Q g_i) + (Q g_i)ᵀ T (Q g_i)]``,
    ``T = Q H Qᵀ  (r × r)``,

which is ``g_iᵀ (I − QᵀQ) H (I − QᵀQ) g_i`` expanded (``H`` symmetric): the probes need not be
projected first, so ``H Q`` and ``H G`` are **one** product call of ``r + g`` columns, and every
dense term comes from two skinny GEMMs over the rows ``X = [G; Q]`` already in memory.

All vectors are rows, ``(k, n)`` with unit stride (the products' own layout), and nothing of size
``n × n`` or a Householder QR of the ``n × s`` sketch (level-2 LAPACK: 0.36 s on MiniLM's
``1.77 M × 10``, issue 47) is formed. :func:`orthonormal_rows` orthonormalises ``Y`` from its
``s × s`` Gram matrix (SVQB, Stathopoulos and Wu 2002): ``Y Yᵀ = U Λ Uᵀ``, ``Q = Λ^{-1/2} Uᵀ Y``
over the eigenvalues above round-off (a rank-deficient or zero sketch simply has fewer rows, so no
norm is divided by zero), and a second pass on ``Q`` when the first one's loss of orthogonality,
about ``ε κ(YYᵀ)``, could exceed :data:`ORTHOGONAL` (CholQR2's rule: twice is enough).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hessviz.matfree.probes import rademacher
from hessviz.runtime import pages

ORTHOGONAL = 1e-13
"""A first pass whose expected loss of orthogonality ``ε · κ(Y Yᵀ)`` is above this is followed by a
second pass (then ``‖Q Qᵀ − I‖ ≈ ε``)."""


def _svqb(Y: Tensor, out: Tensor | None) -> tuple[Tensor, float]:
    """One pass: ``(Q, loss)``, ``Q = Λ^{-1/2} Uᵀ Y`` over the Gram eigenvalues above ``s ε λ_max``
    (into ``out[:r]`` when given) and ``loss = ε λ_max / λ_min`` over those kept."""
    gram = (Y @ Y.T).to(torch.float64)
    w, U = torch.linalg.eigh(gram)
    eps = torch.finfo(Y.dtype).eps
    top = float(w[-1]) if w.numel() else 0.0
    keep = w > max(Y.shape[0], 1) * eps * top if top > 0 else torch.zeros_like(w, dtype=torch.bool)
    r = int(keep.sum())
    C = (U[:, keep] / w[keep].sqrt()).T.flip(0).to(Y.dtype)  # (r, s), the largest direction first
    target = pages.empty((r, Y.shape[1]), Y) if out is None else out[:r]
    torch.mm(C, Y, out=target)
    loss = eps * top / float(w[keep].min()) if r else 0.0
    return target, loss


def orthonormal_rows(Y: Tensor, out: Tensor | None = None) -> Tensor:
    """``(r, n)`` orthonormal rows spanning the rows of ``Y (s, n)`` (``r ≤ s``: directions at
    round-off are left out), written into ``out[:r]`` when given (``out`` not overlapping ``Y``)."""
    Q, loss = _svqb(Y, None)
    if loss <= ORTHOGONAL:
        return Q if out is None else out[: Q.shape[0]].copy_(Q)
    return _svqb(Q, out)[0]


def hutchpp(ops, n: int, samples: int, gen: torch.Generator, like: Tensor) -> tuple[float, float]:
    """``(estimate, stderr)`` of ``tr H`` from ``samples`` products ``ops (k, n) -> (k, n)`` of a
    symmetric ``H``: ``s = samples // 3`` sketch products, then the ``r`` basis rows and
    ``g = samples − 2s`` probes in one call (``s + r + g`` products: ``samples`` unless the sketch is
    rank-deficient). The draws are those of ``torch.Generator`` ``gen``: ``S`` then ``G``."""
    s = samples // 3
    g = samples - 2 * s
    S = rademacher(n, s, gen, like)
    X = pages.empty((g + s, n), like)  # rows [G; Q]: one product call, one GEMM operand
    rademacher(n, g, gen, like, out=X[:g])
    Q = orthonormal_rows(ops(S), out=X[g:])
    r = Q.shape[0]
    X = X[: g + r]
    HX = ops(X)
    HG, HQ = HX[:g], HX[g:]
    K = HQ @ X.T  # (r, g + r): [H Q Gᵀ, T]
    T = K[:, g:]
    QG = Q @ X[:g].T  # (r, g)
    quad = torch.einsum("ij,ij->i", HG, X[:g])  # g_iᵀ H g_i
    quad = quad - 2 * (QG * K[:, :g]).sum(0) + (QG * (T @ QG)).sum(0)
    exact = torch.trace(T)
    stderr = float(quad.std() / math.sqrt(g)) if g > 1 else float("nan")
    return float(exact + quad.mean()), stderr
