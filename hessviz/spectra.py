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


def matrix_norm(M: Tensor, kind: str = "spectral") -> float:
    """``‖M‖₂`` (largest singular value) or ``‖M‖_F``."""
    if kind == "spectral":
        return float(torch.linalg.matrix_norm(M.to(torch.float64), ord=2)) if M.numel() else 0.0
    if kind == "fro":
        return float(torch.linalg.matrix_norm(M.to(torch.float64), ord="fro"))
    raise ValueError(f"kind must be 'spectral' or 'fro', got {kind!r}")


def block_norms(result, term: str = "full", kind: str = "spectral") -> np.ndarray:
    """``(n, n)`` array of block norms over ``result.names`` (a HessianResult)."""
    names = result.names
    H = result.term(term)
    out = np.zeros((len(names), len(names)))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if j < i:
                out[i, j] = out[j, i]
                continue
            out[i, j] = matrix_norm(H[result.offsets[a], result.offsets[b]], kind)
    return out
