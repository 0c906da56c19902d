r"""The linear algebra of a Lanczos basis, in torch on the products' device and dtype: what
:mod:`hessviz.matfree.lanczos`'s two entry points share.

* :func:`norm`: 2-norms summed in float64 (a float32 sum over millions of terms is off by 1e-5);
* :func:`orthogonalise_` (classical Gram–Schmidt against the whole basis, a second pass when the DGKS
  test asks) and :func:`partial_pass_` (only the coefficients above the round-off level, by runs of
  adjacent rows); :func:`three_term_`, the plain step ``w ← w − α q_j − β q_{j−1}``;
* :func:`combine_` (``Yᵀ Q`` in cache-sized column pieces, in place), :func:`apply_into` (a product
  written straight into a basis row), :func:`start_vector` (a caller's guess with seeded noise mixed
  in), :func:`symmetric` (``T``'s leading block from its upper triangle);
* :class:`Orthogonality`: Simon's estimates of the basis's drift from orthogonal, which say when a
  partial pass is due.

Shapes: a basis ``Q (m + 1, n)`` of rows, ``w (n,)``, ``T (m + 1, m + 1)`` float64 on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from hessviz.errors import ConfigError

Apply = Callable[[Tensor], Tensor]


def norm(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The 2-norm of ``x`` (along ``dim``), its sum of squares accumulated in float64, in ``x``'s dtype.

    On the CPU, ``vector_norm`` of a float32 tensor sums in float32, one term after another: on
    1.77 M positive terms that is 1.8e-5 relative, and the Lanczos ``β``s it gave put MiniLM's
    float32 top-5 5e-4 away from float64 (the bench's float32 row). In float64 the sum is
    4e-7 relative or better there, as on a GPU, whose reductions are trees.

    The float64 sum is taken over pieces of :data:`NORM_PIECE` entries: ``vector_norm(…,
    dtype=float64)`` of the whole makes a float64 copy of it first (at GPT-2 small's 85 M weights,
    0.68 GB for each norm of a Lanczos step, and ``k`` times that for ``k`` rows), and is slower."""
    if x.dtype == torch.float64:
        return torch.linalg.vector_norm(x, dim=dim, keepdim=keepdim)
    whole = x.reshape(-1) if dim is None else x
    axis = 0 if dim is None else dim
    squares = sum(
        torch.linalg.vector_norm(piece, dim=axis, keepdim=keepdim, dtype=torch.float64).square()
        for piece in whole.split(NORM_PIECE, dim=axis)
    )
    out = squares.sqrt().to(x.dtype)
    return out.reshape([1] * x.dim()) if dim is None and keepdim else out


NORM_PIECE = 1 << 20
"""Entries per piece of :func:`norm`'s float64 sum (8 MB of float64 at a time)."""


REPEAT_BELOW = 2**-0.5
"""DGKS criterion: project once more only if the projection removed more than ``1 − 1/√2``
of ``w``'s norm (then ``w`` was nearly in the basis and round-off may remain)."""


def orthogonalise_(w: Tensor, basis: Tensor, selective: bool = False) -> Tensor:
    """``w ← (I − Qᵀ Q) w`` in place for ``Q = basis (m, n)`` with orthonormal rows; returns the
    coefficients ``h = Q w`` (summed over passes), classical Gram–Schmidt with the DGKS test.

    The first pass (``mv``) reads the basis; so does the update (``addmv_``): these two reads are
    the memory-bound cost of a step, about one product's time on a 1.8 M-weight layer.
    ``selective``: the update subtracts only the coefficients with ``|h_i| > √ε β`` (``β`` the
    norm left, from ``‖w‖² − ‖h‖²``): the new vector stays orthogonal to ``√ε`` (semi-orthogonal,
    which keeps the Ritz values to working accuracy; Simon 1984), and where ``h`` has only the
    two Lanczos coefficients and a few restart couplings the second read shrinks to those rows.
    Every coefficient is still *measured* each step, so none can grow unseen. Heavy cancellation
    (``β < ‖w‖ / √2``) takes the full path."""
    norm0 = norm(w)
    h = torch.mv(basis, w)
    if selective:
        left2 = float(norm0) ** 2 - float(torch.dot(h, h))
        if left2 > 0.5 * float(norm0) ** 2:
            big = (h.abs() > torch.finfo(w.dtype).eps ** 0.5 * left2**0.5).nonzero().flatten()
            if 2 * big.numel() < h.numel():
                w.addmv_(basis[big].T, h[big], alpha=-1.0)
                return h
    w.addmv_(basis.T, h, alpha=-1.0)
    if norm(w) <= REPEAT_BELOW * norm0:  # much cancelled: once more
        c = torch.mv(basis, w)
        w.addmv_(basis.T, c, alpha=-1.0)
        h = h + c
    return h


RUN_GAP = 2
"""Rows of the basis subtracted at a partial pass are taken in runs of adjacent rows (each one
``addmv_`` on a view: no copy); runs this close are joined, since a separate run costs a read and a
write of ``w``, about two rows."""


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Sorted row indices as half-open runs ``[a, b)``, runs at most :data:`RUN_GAP` rows apart
    joined.

    >>> _runs([1, 2, 3, 5, 9, 10])
    [(1, 6), (9, 11)]
    """
    out: list[list[int]] = []
    for i in rows:
        if out and i - out[-1][1] <= RUN_GAP:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return [(a, b) for a, b in out]


def partial_pass_(w: Tensor, basis: Tensor, level: float) -> Tensor:
    """The pass of partial reorthogonalisation, in place: the coefficients ``h = Q w`` measured on
    the whole ``basis`` (one read), and only those with ``|h_i| > level · ‖w‖`` subtracted, by runs
    of adjacent rows (:func:`_runs`). Returns the drift left, ``|q_iᵀ w| / ‖w‖`` per row after the
    pass: measured for the rows kept, ``0`` (round-off) for those subtracted.

    A semi-orthogonal basis loses its orthogonality along the converged Ritz vectors (Paige 1976),
    so the large coefficients sit on a few rows, which alone are read again (:func:`orthogonalise_`
    would read them all). The core passes ``level = ε₁ = ε √n``, the round-off floor of Simon's
    estimates (:class:`Orthogonality`): the rows left are no larger than what a fresh vector carries
    anyway, far below the ``√ε`` at which the next pass falls due. A looser level (PROPACK's
    ``ε^{3/4}``; Larsen 1998) made the next passes fall due sooner on the test of
    ``tests/test_lanczos.py`` (30 passes against 27). Heavy cancellation (``‖w‖`` down by ``1/√2``)
    takes a full second pass, as in :func:`orthogonalise_`."""
    norm0 = norm(w)
    h = torch.mv(basis, w)
    big = (h.abs() > level * norm0).nonzero().flatten().tolist()
    for a, b in _runs(big):
        w.addmv_(basis[a:b].T, h[a:b], alpha=-1.0)
    after = norm(w)
    if after <= REPEAT_BELOW * norm0:  # much cancelled: once more, fully
        orthogonalise_(w, basis)
        return torch.zeros_like(h)
    h[big] = 0.0
    return h.abs() / after


START_MIX = 1e-2
"""The weight of the seeded random vector in a start vector given by the caller (relative, both
unit): enough that every eigenvector has a share of the start, little enough to keep the guess."""


def start_vector(start: Tensor | None, noise: Tensor) -> Tensor:
    """The start of a Lanczos run: the seeded ``noise (n,)`` alone, or the caller's guess ``start (n,)``
    with ``noise`` mixed in at :data:`START_MIX` of its norm (both made unit first), so that no
    eigenvector is missing from it; a zero ``start`` is no guess. Not normalised; in ``noise``'s
    dtype and device. ``start`` of another shape, or not finite: :class:`ConfigError`."""
    if start is None:
        return noise
    start = torch.as_tensor(start)
    if start.shape != noise.shape or not bool(torch.isfinite(start).all()):
        raise ConfigError(
            f"start must be a finite vector of shape {tuple(noise.shape)}, got {tuple(start.shape)}"
        )
    size = norm(start)
    if size == 0:
        return noise
    return start.to(noise) / size + noise * (START_MIX / norm(noise))


COLUMNS = 1 << 14
"""Columns per piece in :func:`combine_`: ``(r, m) @ (m, n)`` with ``m, r ≈ 20`` and ``n`` in the
millions runs at a fifth of the memory speed as one GEMM on the CPU, at full speed in cache-sized
pieces."""


def combine_(Y: Tensor, Q: Tensor, out: Tensor) -> Tensor:
    """``out = Yᵀ Q`` for ``Y (m, r)``, ``Q (m, n)``, ``out (r, n)``, column piece by column piece;
    ``out`` may be the first ``r`` rows of ``Q`` itself (each piece is read before it is written)."""
    Yt = Y.T.contiguous()
    for c in range(0, Q.shape[1], COLUMNS):
        out[:, c : c + COLUMNS] = Yt @ Q[:, c : c + COLUMNS]
    return out


def apply_into(apply: Apply, V: Tensor, out: Tensor) -> Tensor:
    """``out ← H V``: written in place by an ``apply`` marked ``takes_out`` (the products are), so
    that a new basis row is the product's own buffer, with no fresh allocation to fault in and no
    copy; else ``apply(V)`` copied into ``out``."""
    if getattr(apply, "takes_out", False):
        apply(V, out=out)
        return out
    return out.copy_(apply(V))


def three_term_(w: Tensor, Q: Tensor, j: int, alpha: float, beta: float) -> Tensor:
    """``w ← w − α q_j − β q_{j−1}`` in place (``q_j`` alone for ``j = 0``), one pass over ``w`` and
    the two rows (``addmv_`` on ``Q[j − 1 : j + 1]``) instead of two ``add_``s."""
    if j == 0:
        return w.add_(Q[0], alpha=-alpha)
    return w.addmv_(Q[j - 1 : j + 1].T, w.new_tensor([beta, alpha]), alpha=-1.0)


def symmetric(T: Tensor, a: int, b: int) -> Tensor:
    """``T[a:b, a:b]`` with its upper triangle mirrored (``T`` keeps only the upper one)."""
    S = torch.triu(T[a:b, a:b])
    return S + torch.triu(S, 1).T


class Orthogonality:
    r"""Simon's estimates of how far a Lanczos basis has drifted from orthogonal, and when to restore it
    (*partial reorthogonalisation*; Simon, Math. Comp. 42, 1984; as in Larsen's PROPACK).

    In floating point the plain three-term step loses orthogonality as Ritz pairs converge. With
    ``ω_{j,i} ≈ q_jᵀ q_i``, the step ``β_j q_{j+1} = H q_j − α_j q_j − β_{j−1} q_{j−1}`` gives,
    multiplied by ``q_i`` and with ``H q_i = Σ_l T_{li} q_l`` (``T`` symmetric tridiagonal),

    .. math::
        β_j ω_{j+1,i} = Σ_l T_{li} ω_{j,l} − α_j ω_{j,i} − β_{j−1} ω_{j−1,i} ± ε_1 ‖T‖,
        \qquad ω_{j+1,j} = ε_1 ‖T‖ / β_j,\ ω_{j+1,j+1} = 1,

    with the round-off term ``ε_1 = ε √n`` taken at its worst sign: ``O(j)`` scalars a step, no
    vector read. When some ``|ω_{j+1,i}| > √ε``, ``q_{j+1}``'s coefficients on the whole basis are
    measured and those above ``ε_1`` subtracted (:func:`partial_pass_`), and so for the next vector
    (its predecessor had drifted too), after which both rows of estimates restart at ``ε_1``, or at
    the measured drift left where larger. The basis stays **semi-orthogonal** (``|q_jᵀ q_i| ≤ √ε``), which
    is enough for the Ritz values of ``T`` to be those of ``H``'s projection on the basis to
    ``O(ε ‖H‖)`` (Simon's theorem), while a step reads the basis only at those events: on MiniLM's
    layer 3 (top-5), 10 of 54 steps. ``T`` keeps only ``α, β``; the small coefficients the
    occasional pass removes (``≤ √ε β``) are not added to it."""

    def __init__(self, m: int, n: int, eps: float):
        self.eps1, self.level = eps * math.sqrt(n), eps**0.5
        self.previous = torch.zeros(m + 1, dtype=torch.float64)  # ω_{j−1, ·}
        self.current = torch.zeros(m + 1, dtype=torch.float64)  # ω_{j, ·}
        self.current[0] = 1.0
        self.norm, self.again = 0.0, False

    def advance(self, T: Tensor, j: int, beta: float) -> bool:
        """Step the estimates to ``ω_{j+1, ·}`` from ``T``'s leading ``(j + 1) × (j + 1)`` (upper
        triangle: ``α`` on the diagonal, ``β`` above it) and ``β_j = beta``; whether ``q_{j+1}`` is
        to be orthogonalised against ``q_0 … q_j``. ``beta > 0``: at ``β = 0`` (or at round-off) the
        Krylov space is invariant and there is no ``q_{j+1}`` to estimate; the callers stop or restart
        there first."""
        if not beta > 0:
            raise ValueError(
                f"Orthogonality.advance needs beta > 0 (an invariant space has no next vector), got {beta!r}"
            )
        S = symmetric(T, 0, j + 1)
        alpha, before = float(S[j, j]), float(S[j - 1, j]) if j else 0.0
        self.norm = max(self.norm, abs(alpha) + beta + before)
        new = torch.zeros_like(self.current)
        floor = self.eps1 * self.norm
        if j:
            s = self.current[: j + 1] @ S[:, :j] - alpha * self.current[:j] - before * self.previous[:j]
            new[:j] = (s + torch.where(s < 0, -floor, floor)) / beta
        new[j] = floor / beta
        new[j + 1] = 1.0
        self.previous, self.current = self.current, new
        drifted = float(new[: j + 1].abs().max()) > self.level
        due = drifted or self.again
        self.again = drifted and not self.again
        return due

    def orthogonalised(self, j: int, left: Tensor | None = None) -> None:
        """``q_{j+1}`` was orthogonalised against ``q_0 … q_j``: its estimates drop to round-off, or to
        the drift ``left (j + 1,)`` that :func:`partial_pass_` measured and left, where larger."""
        self.current[: j + 1] = self.eps1 if left is None else left.to(self.current).clamp_min(self.eps1)
