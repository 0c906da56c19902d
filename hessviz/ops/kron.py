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
from functools import cached_property
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
    """A per-token Jacobian ``(L, n_out, n1*n2)`` kept as a sum of :class:`KronTerm`, or, where it is
    no short sum of them (a key/value head read by several query heads, a rotated key, a node's
    tangent sweep), written out as ``whole (L, n_out, n1, n2)`` (then ``terms`` is empty): a block
    between two written-out Jacobians is one GEMM whose inner dimension is ``L·n_out``."""

    terms: tuple[KronTerm, ...] = ()
    whole: Tensor | None = None

    @cached_property
    def flat(self) -> Tensor:
        """The written-out Jacobian as ``(L, n_out, n1*n2)`` (one tensor, so caches keyed by it hit)."""
        assert self.whole is not None
        return self.whole.flatten(2)

    @cached_property
    def as_term(self) -> KronTerm:
        """The written-out Jacobian as one left term of a ``(1, n1*n2)`` weight: the vector is ``1``."""
        return KronTerm(LEFT, self.flat.new_ones(self.flat.shape[0], 1), self.flat)

    @property
    def shape(self) -> tuple[int, int]:
        if self.whole is not None:
            return (self.whole.shape[2], self.whole.shape[3])
        return self.terms[0].shape

    def lmul(self, M: Tensor) -> Factored:
        if self.whole is not None:
            return Factored(whole=(M @ self.flat).unflatten(2, self.shape))
        return Factored(tuple(t.lmul(M) for t in self.terms))

    def __add__(self, other: Factored) -> Factored:
        """The sum of two Jacobians of one weight: their terms side by side (written out if either is)."""
        if self.whole is None and other.whole is None:
            return Factored(self.terms + other.terms)
        return Factored.from_dense((self.dense() + other.dense()).unflatten(2, self.shape))

    @staticmethod
    def per_token(mat: Tensor, ones: Tensor) -> Factored:
        """A dense per-token Jacobian ``mat (L, n_out, n)`` of a vector parameter, seen as a
        ``(1, n)`` matrix: one left term with the vector ``ones (L, 1)``."""
        return Factored((KronTerm(LEFT, ones, mat),))

    @staticmethod
    def from_dense(J: Tensor) -> Factored:
        """A dense per-token Jacobian ``J (L, n_out, n1, n2)`` of a matrix weight, kept written out."""
        return Factored(whole=J)

    def compact(self) -> Factored:
        """The same Jacobian written out (:meth:`from_dense`) when it has more than ``min(n1, n2)``
        terms (a key/value head read by several query heads, a rotated key): each term pair of a
        block is one GEMM of inner dimension ``L``, so past that many terms one GEMM of inner
        dimension ``L·n_out`` over the written-out Jacobian costs less."""
        n1, n2 = self.shape
        if self.whole is not None or len(self.terms) <= min(n1, n2):
            return self
        L, n_out = self.terms[0].mat.shape[:2]
        return Factored.from_dense(self.dense().reshape(L, n_out, n1, n2))

    @cached_property
    def packed(self) -> Factored:
        """The form a block sandwich reads: written out (:meth:`from_dense`, once) when its ``k``
        terms would cost more than that, ``k² ≥ n_out`` (two such Jacobians meet in ``k²`` GEMMs of
        inner dimension ``L`` against one of ``L·n_out``), else itself."""
        k = len(self.terms)
        if self.whole is not None or k < 2:
            return self
        L, n_out = self.terms[0].mat.shape[:2]
        if k * k < n_out and k <= min(self.shape):
            return self
        return Factored.from_dense(self.dense().reshape(L, n_out, *self.shape))

    def dense(self) -> Tensor:
        """``(L, n_out, n1*n2)``."""
        if self.whole is not None:
            return self.flat
        first, *rest = self.terms
        out = torch.mul(*first._factors())  # (L, n_out, n1, n2), then each term added in place
        for term in rest:
            out.addcmul_(*term._factors())
        return out.flatten(2)

    def dense_into(self, out: Tensor) -> None:
        """Write the Jacobian into ``out``, a (strided) view of shape ``(L*n_out, n1, n2)``."""
        if self.whole is not None:
            out.unflatten(0, self.whole.shape[:2]).copy_(self.whole)
            return
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
    """A per-token middle matrix kept in factored form; it only forms ``Maᵀ N Mb``, and, summed over
    tokens, ``Σ_t Ma_tᵀ N_t Mb_t = Σ_k A_kᵀ B_k`` as GEMM operands (:meth:`gram`, optional: without
    it two written-out Jacobians meet through :meth:`sandwich`): ``A_k``'s columns are ``Ma``'s last
    index, its rows a flattening of tokens (and outputs)."""

    def sandwich(self, Ma: Tensor, Mb: Tensor) -> Tensor: ...

    def gram(self, Ma: Tensor, Mb: Tensor) -> list[tuple[Tensor, Tensor]]: ...


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


def _pair_key(a: KronTerm, b: KronTerm, whole_a: bool, whole_b: bool) -> tuple:
    """Two term pairs with the same kinds and the same vector tensors share one GEMM (a written-out
    Jacobian's vector is ``1``, the same for all)."""
    return (
        a.kind,
        "whole" if whole_a else id(a.vec),
        b.kind,
        "whole" if whole_b else id(b.vec),
        a.mat.shape[-1],
        b.mat.shape[-1],
    )


class _TermPair:
    """``Σ_t (u ⊗ u')_t P_t`` for one pair of vectors and the sum of their middle factors,
    ready to produce any range of block rows α.

    A written-out Jacobian enters as one left term of a ``(1, n1·n2)`` weight (:attr:`Factored.as_term`);
    ``split_a = n2`` (``a`` written out: block rows ``α`` are ``P``'s first index, ``n2`` at a time) and
    ``shape_b = (n1', n2')`` (``b`` written out) give the block its 4-d shape back."""

    def __init__(
        self, a: KronTerm, b: KronTerm, P: Tensor, split_a: int = 0, shape_b: tuple[int, int] | None = None
    ):
        L = P.shape[0]
        # u ⊗ u' per token: (L, n_va * n_vb)
        uu = (a.vec[:, :, None] * b.vec[:, None, :]).reshape(L, -1)
        vectors_first, self.perm = _LAYOUT[(a.kind, b.kind)]
        shape_uu, shape_P = (a.vec.shape[1], b.vec.shape[1]), (P.shape[1], P.shape[2])
        self.lhs, self.rhs = (uu, P.reshape(L, -1)) if vectors_first else (P.reshape(L, -1), uu)
        self.lhs_shape, self.rhs_shape = (shape_uu, shape_P) if vectors_first else (shape_P, shape_uu)
        self.vectors_first, self.split_a, self.shape_b = vectors_first, split_a, shape_b

    def rows(self, start: int, stop: int) -> Tensor:
        """Block rows ``α ∈ [start, stop)`` as a 4-d view ``(stop − start, β, α', β')``.

        One GEMM over tokens (inner dimension ``L``) on the slice of the side that holds α.
        """
        (l0, l1), (r0, r1) = self.lhs_shape, self.rhs_shape
        if self.split_a:  # α·n2 + β is P's first index, on the side vectors_first says
            s, e = start * self.split_a, stop * self.split_a
            if self.vectors_first:
                G = (self.lhs.T @ self.rhs[:, s * r1 : e * r1]).view(l0, l1, e - s, r1)
            else:
                G = (self.lhs[:, s * l1 : e * l1].T @ self.rhs).view(e - s, l1, r0, r1)
            G = G.permute(*self.perm)  # (1, e − s, α', β')
            G = G.reshape(stop - start, self.split_a, *G.shape[2:])
        elif self.perm[0] == 0:  # α is the GEMM's first row index
            G = (self.lhs[:, start * l1 : stop * l1].T @ self.rhs).view(stop - start, l1, r0, r1)
            G = G.permute(*self.perm)
        else:  # α is the GEMM's first column index
            G = (self.lhs.T @ self.rhs[:, start * r1 : stop * r1]).view(l0, l1, stop - start, r1)
            G = G.permute(*self.perm)
        if self.shape_b is not None:  # (α, β, 1, n1'·n2') -> (α, β, n1', n2')
            G = G.unflatten(3, self.shape_b).squeeze(2)
        return G


class _WholePair:
    """``Σ_t Ja_tᵀ N_t Jb_t`` of two written-out Jacobians: ``Σ_k A_kᵀ B_k`` with inner dimension
    ``L·n_out`` (:meth:`Structured.gram`), one GEMM per operand pair on the rows asked for; the result
    is already in the block's layout ``(α, β, α', β')``."""

    def __init__(self, Ja: Factored, N: Tensor | Structured | None, Jb: Factored, cache: MiddleCache | None):
        Ma, Mb = Ja.flat, Jb.flat
        if N is None:
            self.operands = [(Ma.flatten(0, 1), Mb.flatten(0, 1))]
        elif isinstance(N, Tensor):
            NMb = N @ Mb if cache is None else cache.apply(N, Mb)
            self.operands = [(Ma.flatten(0, 1), NMb.flatten(0, 1))]
        else:
            self.operands = N.gram(Ma, Mb)
        self.n2a, self.shape_b = Ja.shape[1], Jb.shape

    def rows(self, start: int, stop: int) -> Tensor:
        s, e = start * self.n2a, stop * self.n2a
        out = None
        for A, B in self.operands:
            out = A[:, s:e].T @ B if out is None else out.addmm_(A[:, s:e].T, B)
        return out.view(stop - start, self.n2a, *self.shape_b)


def _gram_pair(N: Middle) -> bool:
    """Whether two written-out Jacobians around ``N`` make a :class:`_WholePair`."""
    return N is None or isinstance(N, Tensor) or hasattr(N, "gram")


def term_pairs(
    products: list[tuple[Factored, Middle, Factored]], cache: MiddleCache | None = None
) -> list[_TermPair | _WholePair]:
    """Every pair of terms of ``Σ_k Σ_t Ja_tᵀ N_t Jb_t``, with the middle factors
    ``P_t = M_aᵀ N_t M_b`` of pairs that share both vectors summed first (one GEMM each); two
    written-out Jacobians make one :class:`_WholePair`."""
    groups: dict[tuple, tuple[KronTerm, KronTerm, Tensor, int, tuple[int, int] | None]] = {}
    whole: list[_TermPair | _WholePair] = []
    for Ja, N, Jb in products:
        Ja, Jb = Ja.packed, Jb.packed
        wa, wb = Ja.whole is not None, Jb.whole is not None
        if wa and wb and _gram_pair(N):
            whole.append(_WholePair(Ja, N, Jb, cache))
            continue
        split_a, shape_b = Ja.shape[1] if wa else 0, Jb.shape if wb else None
        for a in (Ja.as_term,) if wa else Ja.terms:
            for b in (Jb.as_term,) if wb else Jb.terms:
                key = _pair_key(a, b, wa, wb)
                P = _middle(a.mat, N, b.mat, cache)  # (L, n_ma, n_mb)
                if key in groups:
                    ga, gb, total, _, _ = groups[key]
                    groups[key] = (ga, gb, total + P, split_a, shape_b)
                else:
                    groups[key] = (a, b, P, split_a, shape_b)
    return whole + [_TermPair(*group) for group in groups.values()]


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
