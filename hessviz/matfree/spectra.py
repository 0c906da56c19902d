r"""Spectra and norms of Hessian terms.

* :func:`eigenvalues`: all eigenvalues (dense ``eigvalsh``) or, for large matrices, the
  ``k`` largest and ``k`` smallest by Lanczos (the torch core of :mod:`hessviz.matfree.lanczos`,
  on ``H``'s device), saying which it used.
  Given ``rank`` (a bound on the rank of a positive semi-definite ``H``, e.g. ``L·d`` for
  the outer term ``JᵀAJ`` with ``J (L d, P)``), a large ``H`` gets all its eigenvalues
  from :func:`low_rank_eigenvalues` instead: Lanczos crawls on the smallest eigenvalues
  of a singular matrix (the zero eigenvalue has multiplicity ``P − rank``).
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


def low_rank_eigenvalues(H: Tensor, rank: int, *, oversample: int = 10, seed: int = 0) -> Spectrum:
    r"""All eigenvalues of a symmetric ``H (n, n)`` of rank at most ``rank``, exactly (round-off aside).

    With a Gaussian ``Ω (n, m)``, ``m = rank + oversample``, the range of ``Y = HΩ`` is the
    range of ``H`` (almost surely), so with ``Q`` an orthonormal basis of ``Y``
    (``Q (n, m)``, ``H = Q QᵀHQ Qᵀ``) the eigenvalues of ``H`` are those of the small
    ``B = QᵀHQ (m, m)`` plus ``n − m`` zeros. Cost ``≈ 4 n² m`` flops instead of ``n³``.

    >>> J = torch.randn(6, 40, dtype=torch.float64)
    >>> H = J.T @ J
    >>> got = low_rank_eigenvalues(H, 6).values
    >>> bool(np.allclose(got, torch.linalg.eigvalsh(H).numpy(), atol=1e-10))
    True
    """
    n = H.shape[0]
    m = min(n, int(rank) + oversample)
    A = H.detach().to(torch.float64)
    gen = torch.Generator(device=A.device).manual_seed(seed)
    omega = torch.randn(n, m, generator=gen, dtype=torch.float64, device=A.device)
    Q, _ = torch.linalg.qr(A @ omega)
    B = Q.T @ (A @ Q)
    small = torch.linalg.eigvalsh(0.5 * (B + B.T)).cpu().numpy()
    vals = np.sort(np.concatenate([small, np.zeros(n - m)]))
    return Spectrum(vals, False, n, f"range of H (rank ≤ {rank:,}) and a {m} × {m} eigvalsh")


def eigenvalues(
    H: Tensor, *, k: int = 64, dense_limit: int = DENSE_LIMIT, rank: int | None = None, tol: float = 1e-10
) -> Spectrum:
    """Eigenvalues of the symmetric ``H (n, n)``: dense up to ``dense_limit``; past it all of them
    from the range when ``rank`` bounds the rank well below ``n``, else the Lanczos extremes
    (:func:`hessviz.matfree.lanczos.extremes` on ``H``'s device, residuals ``≤ tol · |λ|``)."""
    n = H.shape[0]
    if rank is not None and n > dense_limit and 2 * (rank + 10) <= n:
        return low_rank_eigenvalues(H, rank)
    if n <= dense_limit or 2 * k >= n - 1:
        sym = 0.5 * (H + H.T)
        vals = torch.linalg.eigvalsh(sym.to(torch.float64)).cpu().numpy()
        return Spectrum(vals, False, n, "dense eigvalsh")
    from hessviz.matfree.lanczos import extremes

    A = H.detach().to(torch.float64)
    ends = [
        extremes(lambda V: V @ A, n, k, which, tol=tol, like=A, check=False).values.numpy()
        for which in ("top", "bottom")
    ]
    vals = np.unique(np.concatenate(ends))
    return Spectrum(np.sort(vals), True, n, f"thick-restart Lanczos, {k} largest and {k} smallest")


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


LANCZOS_NORM_MIN = 256
"""Smallest side from which :func:`matrix_norm` finds the spectral norm of a CPU matrix by Lanczos
(ARPACK, one eigenvalue) instead of a dense eigendecomposition: the norm needs one eigenvalue,
``eigvalsh`` computes all ``n`` of them; on the LayerNorm-collapse terms (``n`` = 1,536) the two agree
to 4e-15 relative (their times: ``benchmarks/COST.md``)."""


def _lanczos_norm(apply, n: int, which: str) -> float | None:
    """``|λ|`` of the eigenvalue of largest magnitude (``which="LM"``) or of the largest (``"LA"``) of the
    symmetric ``n × n`` operator ``apply`` (a float64 tensor ``(n,)`` to one ``(n,)``) by ARPACK to
    machine precision (``tol=0``); None when ARPACK fails (no convergence, a breakdown on a zero
    matrix): the caller falls back to the dense route."""
    import scipy.sparse.linalg as sla

    from hessviz.products.hessian_operator import scipy_view

    like = torch.empty(0, dtype=torch.float64)
    op = scipy_view((n, n), lambda V: torch.stack([apply(v) for v in V]), like)  # torch's threads, not BLAS's
    start = np.random.default_rng(0).standard_normal(n)  # not ones: often a null vector of LayerNorm's
    try:
        vals = sla.eigsh(op, k=1, which=which, v0=start, tol=0, return_eigenvectors=False)
    except sla.ArpackError:
        return None
    return float(abs(vals[0]))


def matrix_norm(M: Tensor, kind: str = "spectral", *, symmetric: bool = False) -> float:
    """``‖M‖₂`` (largest singular value) or ``‖M‖_F``.

    The spectral norm is ``max |λ(M)|`` when ``symmetric``, else ``sqrt(λ_max(MᵀM))`` of the smaller
    Gram matrix (about twice as fast as an SVD, and as accurate for the largest singular value).
    A CPU matrix whose smaller side is at least :data:`LANCZOS_NORM_MIN` gets that one eigenvalue
    by Lanczos (products with ``M`` and ``Mᵀ``, never the Gram matrix), the others a dense
    ``eigvalsh``.
    """
    if kind == "fro":
        return float(torch.linalg.matrix_norm(M.to(torch.float64), ord="fro"))
    if kind != "spectral":
        raise ValueError(f"kind must be 'spectral' or 'fro', got {kind!r}")
    if M.numel() == 0:
        return 0.0
    M = M.to(torch.float64)
    if M.device.type == "cpu" and min(M.shape) >= LANCZOS_NORM_MIN:
        A = M.detach().contiguous()  # a block of a term is a strided view: copied once, not per product
        if symmetric:  # symmetric to round-off (a Hessian term): no symmetrised copy
            got = _lanczos_norm(lambda v: A @ v, A.shape[0], "LM")
        else:
            ata = (lambda v: A.T @ (A @ v)) if A.shape[1] <= A.shape[0] else (lambda v: A @ (A.T @ v))
            got = _lanczos_norm(ata, min(A.shape), "LA")
            got = None if got is None else float(np.sqrt(got))
        if got is not None:
            return got
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
