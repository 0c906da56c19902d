r"""Spectra and norms of Hessian terms.

* :func:`eigenvalues`: all eigenvalues (dense ``eigvalsh``) or, for large matrices, the
  ``k`` largest and ``k`` smallest by Lanczos (scipy ``eigsh``), saying which it used.
* :func:`negative_summary`: count, share and mass ``Σ_{λ<0} |λ| / Σ |λ|`` of negative
  eigenvalues, with a tolerance relative to ``max |λ|`` so round-off is not counted.
* :func:`block_norms`: the spectral or Frobenius norm of every parameter block pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

DENSE_LIMIT = 4096
"""Largest size for which :func:`eigenvalues` uses the dense eigendecomposition by default."""


@dataclass(frozen=True)
class Spectrum:
    values: np.ndarray
    """Eigenvalues in ascending order (all of them, or the extremes when ``partial``)."""
    partial: bool
    """True when only the ``k`` smallest and ``k`` largest were computed."""
    size: int
    method: str

    @property
    def max_abs(self) -> float:
        return float(np.max(np.abs(self.values))) if self.values.size else 0.0


def eigenvalues(H: Tensor, *, k: int = 64, dense_limit: int = DENSE_LIMIT) -> Spectrum:
    """Eigenvalues of the symmetric ``H (n, n)``; Lanczos extremes when ``n > dense_limit``."""
    n = H.shape[0]
    if n <= dense_limit or 2 * k >= n - 1:
        sym = 0.5 * (H + H.T)
        vals = torch.linalg.eigvalsh(sym.to(torch.float64)).cpu().numpy()
        return Spectrum(vals, False, n, "dense eigvalsh")
    from scipy.sparse.linalg import eigsh

    A = H.detach().to(torch.float64).cpu().numpy()
    top = eigsh(A, k=k, which="LA", return_eigenvectors=False)
    bottom = eigsh(A, k=k, which="SA", return_eigenvectors=False)
    vals = np.unique(np.concatenate([bottom, top]))
    return Spectrum(np.sort(vals), True, n, f"scipy eigsh, {k} largest and {k} smallest")


@dataclass(frozen=True)
class NegativeSummary:
    count: int
    share: float
    """``count / size``."""
    mass: float
    """``Σ_{λ<0} |λ| / Σ |λ|`` over the computed eigenvalues."""
    min_eigenvalue: float
    max_eigenvalue: float
    tolerance: float


def negative_summary(spec: Spectrum, rtol: float = 1e-10) -> NegativeSummary:
    """Negative eigenvalues below ``-rtol · max|λ|`` (round-off is not curvature)."""
    v = spec.values
    tol = rtol * spec.max_abs
    neg = v < -tol
    total = float(np.abs(v).sum())
    return NegativeSummary(
        count=int(neg.sum()),
        share=float(neg.sum() / spec.size) if spec.size else 0.0,
        mass=float(np.abs(v[neg]).sum() / total) if total > 0 else 0.0,
        min_eigenvalue=float(v.min()) if v.size else 0.0,
        max_eigenvalue=float(v.max()) if v.size else 0.0,
        tolerance=tol,
    )


def matrix_norm(M: Tensor, kind: str = "spectral", *, symmetric: bool = False) -> float:
    """``‖M‖₂`` (largest singular value) or ``‖M‖_F``.

    The spectral norm comes from the smaller Gram matrix, ``sqrt(λ_max(MᵀM))`` (or
    ``max |λ|`` when ``symmetric``): about twice as fast as an SVD, and as accurate for
    the largest singular value.
    """
    if kind == "fro":
        return float(torch.linalg.matrix_norm(M.to(torch.float64), ord="fro"))
    if kind != "spectral":
        raise ValueError(f"kind must be 'spectral' or 'fro', got {kind!r}")
    if M.numel() == 0:
        return 0.0
    M = M.to(torch.float64)
    if symmetric:
        return float(torch.linalg.eigvalsh(0.5 * (M + M.T)).abs().max())
    gram = M.T @ M if M.shape[1] <= M.shape[0] else M @ M.T
    return float(torch.linalg.eigvalsh(gram)[-1].clamp_min(0).sqrt())


def block_norm_matrix(H: Tensor, offsets: dict[str, slice], kind: str = "spectral") -> np.ndarray:
    """``(n, n)`` norms of the blocks ``H[offsets[a], offsets[b]]`` of a symmetric ``H``."""
    names = list(offsets)
    out = np.zeros((len(names), len(names)))
    for i, a in enumerate(names):
        for j in range(i, len(names)):
            block = H[offsets[a], offsets[names[j]]]
            out[i, j] = out[j, i] = matrix_norm(block, kind, symmetric=i == j)
    return out


def block_norms(result, term: str = "full", kind: str = "spectral") -> np.ndarray:
    """``(n, n)`` block norms of one term of a :class:`~hessviz.result.HessianResult`."""
    return block_norm_matrix(result.term(term), result.offsets, kind)
