r"""Kronecker-factored per-token Jacobians, and the sums over tokens built from them.

A token's output (a vector of size ``n_out``) depends on a weight matrix ``W (n1, n2)``
through factors of Kronecker form. Indexing ``vec_r(W)`` by ``(α, β)``:

* ``left`` term:  ``J_t[o, (α, β)] = u_t[α] · M_t[o, β]``, e.g. ``∂(x_t W)/∂W = x_t ⊗ I``;
* ``right`` term: ``J_t[o, (α, β)] = M_t[o, α] · v_t[β]``, e.g. the score row ``S_t`` in ``W_K``:
  ``∂S_tr/∂W_K[i, m] = X[r, i] · q_t[m] / sqrt(d_k)``.

A :class:`Factored` Jacobian is a sum of such terms. It never forms the dense
``(L·n_out, n1·n2)`` matrix. The Hessian blocks are sums over tokens

.. math::
    B = \sum_t J^{a\top}_t N_t J^{b}_t,

which, for one pair of terms, is a single GEMM whose inner dimension is the number
of tokens ``L``: the two vectors form an outer product per token, the three small
matrices ``P_t = M^{a\top}_t N_t M^b_t`` are formed per token, and the product
``Σ_t (u ⊗ u')_t P_t`` is one matrix multiplication of shapes
``(n_u n_u', L) @ (L, n_p n_p')``. Its cost is ``2 L`` flops per entry of the block,
against ``2 L n_out`` for the dense ``JᵀNJ``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

LEFT, RIGHT = "left", "right"


@dataclass(frozen=True)
class KronTerm:
    """One term: ``kind`` in {left, right}; ``vec (L, n_v)``; ``mat (L, n_out, n_m)``.

    ``left``:  ``J_t[o, (α, β)] = vec[t, α] · mat[t, o, β]``, ``W`` has shape ``(n_v, n_m)``.
    ``right``: ``J_t[o, (α, β)] = mat[t, o, α] · vec[t, β]``, ``W`` has shape ``(n_m, n_v)``.
    """

    kind: str
    vec: Tensor
    mat: Tensor

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of the weight matrix the term differentiates with respect to."""
        nv, nm = self.vec.shape[-1], self.mat.shape[-1]
        return (nv, nm) if self.kind == LEFT else (nm, nv)

    def lmul(self, M: Tensor) -> KronTerm:
        """Chain rule on the output side: ``M_t J_t`` for ``M (L, n_new, n_out)``."""
        return KronTerm(self.kind, self.vec, M @ self.mat)

    def _factors(self) -> tuple[Tensor, Tensor]:
        """Two tensors whose broadcast product is the term, ``(L, n_out, n1, n2)``."""
        if self.kind == LEFT:
            return self.vec[:, None, :, None], self.mat[:, :, None, :]
        return self.mat[:, :, :, None], self.vec[:, None, None, :]

    def dense(self) -> Tensor:
        """``(L, n_out, n1*n2)``: the term written out."""
        return torch.mul(*self._factors()).reshape(*self.mat.shape[:2], -1)


@dataclass(frozen=True)
class Factored:
    """A per-token Jacobian ``(L, n_out, n1*n2)`` kept as a sum of :class:`KronTerm`."""

    terms: tuple[KronTerm, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return self.terms[0].shape

    def lmul(self, M: Tensor) -> Factored:
        return Factored(tuple(t.lmul(M) for t in self.terms))

    def __add__(self, other: Factored) -> Factored:
        """The sum of two Jacobians of one weight: their terms side by side."""
        return Factored(self.terms + other.terms)

    @staticmethod
    def per_token(mat: Tensor, ones: Tensor) -> Factored:
        """A dense per-token Jacobian ``mat (L, n_out, n)`` of a vector parameter, seen as a
        ``(1, n)`` matrix: one left term with the vector ``ones (L, 1)``."""
        return Factored((KronTerm(LEFT, ones, mat),))

    @staticmethod
    def from_dense(J: Tensor) -> Factored:
        """A dense per-token Jacobian ``J (L, n_out, n1, n2)`` of a matrix weight as a sum of
        ``min(n1, n2)`` terms, one per row (left terms, the vector the unit row ``e_α``) or per
        column (right terms, ``e_β``)."""
        L, _, n1, n2 = J.shape
        kind, n = (LEFT, n1) if n1 <= n2 else (RIGHT, n2)
        unit = torch.eye(n, dtype=J.dtype, device=J.device)
        pick = (lambda k: J[:, :, k, :]) if kind == LEFT else (lambda k: J[:, :, :, k])  # noqa: E731
        return Factored(tuple(KronTerm(kind, unit[k].expand(L, n), pick(k)) for k in range(n)))

    def compact(self) -> Factored:
        """The same Jacobian in at most ``min(n1, n2)`` terms (:meth:`from_dense`) when it has more
        (a key/value head read by several query heads, a rotated key): each term pair of a block
        is one GEMM, so fewer terms are fewer GEMMs."""
        n1, n2 = self.shape
        if len(self.terms) <= min(n1, n2):
            return self
        L, n_out = self.terms[0].mat.shape[:2]
        return Factored.from_dense(self.dense().reshape(L, n_out, n1, n2))

    def dense(self) -> Tensor:
        """``(L, n_out, n1*n2)``."""
        return sum(t.dense() for t in self.terms)

    def dense_into(self, out: Tensor) -> None:
        """Write the Jacobian into ``out``, a (strided) view of shape ``(L*n_out, n1, n2)``."""
        L, n_out = self.terms[0].mat.shape[:2]
        view = out.unflatten(0, (L, n_out))
        torch.mul(*self.terms[0]._factors(), out=view)
        for term in self.terms[1:]:
            view.addcmul_(*term._factors())


# For a pair of terms the GEMM puts the two vectors' indices (i, j) on one side and
# P_t's (p, q) on the other. The side is chosen so that the block's last index β' is
# the GEMM's last (contiguous) one, then a permutation gives the order (α, β, α', β').
# kinds -> (vectors first?, permutation)
_LAYOUT = {
    (LEFT, LEFT): (True, (0, 2, 1, 3)),  # G[i,j,p,q] = [α, α', β, β']
    (RIGHT, LEFT): (True, (2, 0, 1, 3)),  # G[i,j,p,q] = [β, α', α, β']
    (LEFT, RIGHT): (False, (2, 0, 1, 3)),  # G[p,q,i,j] = [β, α', α, β']
    (RIGHT, RIGHT): (False, (0, 2, 1, 3)),  # G[p,q,i,j] = [α, α', β, β']
}

CHUNK_BYTES = 1 << 22
"""Blocks are produced in slices of rows of about this size: every term of a slice is
summed in place while it is in cache, then copied into the mirror image."""


class Structured(Protocol):
    """A per-token middle matrix kept in factored form; it only forms ``Maᵀ N Mb``."""

    def sandwich(self, Ma: Tensor, Mb: Tensor) -> Tensor: ...


Middle = Tensor | Structured | None
"""``N_t`` between two Jacobians: dense ``(L, n_a, n_b)``, structured, or ``None`` (identity)."""


class MiddleCache:
    """``N_t M_b`` per (middle, Jacobian factor), kept for one assembly: a unit's factor meets
    the same middle in every block of its row, and is multiplied by it once."""

    def __init__(self):
        self._products: dict[tuple[int, int], tuple[Tensor, Tensor, Tensor]] = {}

    def apply(self, N: Tensor, Mb: Tensor) -> Tensor:
        key = (id(N), id(Mb))
        if key not in self._products:  # the operands are kept, so ids stay unique
            self._products[key] = (N, Mb, N @ Mb)
        return self._products[key][2]


def _middle(Ma: Tensor, N: Middle, Mb: Tensor, cache: MiddleCache | None = None) -> Tensor:
    """``Maᵀ N Mb`` per token, ``(L, n_ma, n_mb)``."""
    if N is None:
        return Ma.transpose(-1, -2) @ Mb
    if isinstance(N, Tensor):
        return Ma.transpose(-1, -2) @ (N @ Mb if cache is None else cache.apply(N, Mb))
    return N.sandwich(Ma, Mb)


def _pair_key(a: KronTerm, b: KronTerm) -> tuple:
    """Two term pairs with the same kinds and the same vector tensors share one GEMM."""
    return (a.kind, id(a.vec), b.kind, id(b.vec), a.mat.shape[-1], b.mat.shape[-1])


class _TermPair:
    """``Σ_t (u ⊗ u')_t P_t`` for one pair of vectors and the sum of their middle factors,
    ready to produce any range of block rows α."""

    def __init__(self, a: KronTerm, b: KronTerm, P: Tensor):
        L = P.shape[0]
        # u ⊗ u' per token: (L, n_va * n_vb)
        uu = (a.vec[:, :, None] * b.vec[:, None, :]).reshape(L, -1)
        vectors_first, self.perm = _LAYOUT[(a.kind, b.kind)]
        shape_uu, shape_P = (a.vec.shape[1], b.vec.shape[1]), (P.shape[1], P.shape[2])
        self.lhs, self.rhs = (uu, P.reshape(L, -1)) if vectors_first else (P.reshape(L, -1), uu)
        self.lhs_shape, self.rhs_shape = (shape_uu, shape_P) if vectors_first else (shape_P, shape_uu)

    def rows(self, start: int, stop: int) -> Tensor:
        """Block rows ``α ∈ [start, stop)`` as a 4-d view ``(stop − start, β, α', β')``.

        One GEMM over tokens (inner dimension ``L``) on the slice of the side that holds α.
        """
        (l0, l1), (r0, r1) = self.lhs_shape, self.rhs_shape
        if self.perm[0] == 0:  # α is the GEMM's first row index
            G = (self.lhs[:, start * l1 : stop * l1].T @ self.rhs).view(stop - start, l1, r0, r1)
        else:  # α is the GEMM's first column index
            G = (self.lhs.T @ self.rhs[:, start * r1 : stop * r1]).view(l0, l1, stop - start, r1)
        return G.permute(*self.perm)


def term_pairs(
    products: list[tuple[Factored, Middle, Factored]], cache: MiddleCache | None = None
) -> list[_TermPair]:
    """Every pair of terms of ``Σ_k Σ_t Ja_tᵀ N_t Jb_t``, with the middle factors
    ``P_t = M_aᵀ N_t M_b`` of pairs that share both vectors summed first (one GEMM each)."""
    groups: dict[tuple, tuple[KronTerm, KronTerm, Tensor]] = {}
    for Ja, N, Jb in products:
        for a in Ja.terms:
            for b in Jb.terms:
                key = _pair_key(a, b)
                P = _middle(a.mat, N, b.mat, cache)  # (L, n_ma, n_mb)
                if key in groups:
                    ga, gb, total = groups[key]
                    groups[key] = (ga, gb, total + P)
                else:
                    groups[key] = (a, b, P)
    return [_TermPair(a, b, P) for a, b, P in groups.values()]


def sandwich_into(
    out: Tensor,
    products: list[tuple[Factored, Middle, Factored]],
    mirror: Tensor | None = None,
    cache: MiddleCache | None = None,
) -> None:
    """Write ``Σ_k Σ_t Ja_tᵀ N_t Jb_t`` over ``products = [(Ja, N, Jb), ...]`` into the 4-d
    view ``out (n1a, n2a, n1b, n2b)`` and its transpose into ``mirror (n1b, n2b, n1a, n2a)``.

    ``N`` is a :data:`Middle`: ``(L, n_out_a, n_out_b)``, structured, or ``None``. Both views
    may be strided (one head's slice inside a whole weight's block). Rows are produced in
    cache-sized slices: every term of a slice is summed in place while the slice is in
    cache, and the finished slice is copied, transposed, into ``mirror``.
    """
    na, nb, nc, nd = out.shape
    pairs = term_pairs(products, cache)
    step = max(1, CHUNK_BYTES // (nb * nc * nd * out.element_size()))
    for start in range(0, na, step):
        stop = min(start + step, na)
        view = out[start:stop]
        for k, pair in enumerate(pairs):
            if k == 0:
                view.copy_(pair.rows(start, stop))
            else:
                view.add_(pair.rows(start, stop))
        if mirror is not None:
            _copy_transposed(mirror[:, :, start:stop], view)


def _copy_transposed(target: Tensor, source: Tensor) -> None:
    """``target (c, d, a, b) = source (a, b, c, d)`` transposed; as a matrix transpose (torch's
    blocked 2-d path) when both are plain matrix regions, else as a 4-d permutation."""
    a, b, c, d = source.shape
    try:
        target.view(c * d, a * b).copy_(source.view(a * b, c * d).T)
    except RuntimeError:  # a head's strided view inside a whole weight
        target.copy_(source.permute(2, 3, 0, 1))
