"""The result of a Hessian computation: ``full``, ``outer`` and ``functional`` as views.

The three terms are three views of one computation: each is computed the first time
it is read and cached; a single block can be computed alone. A :class:`HessianResult` holds
operators: one :class:`~hessviz.dense.engine.DenseEngine` per term (the dense engine's:
:class:`~hessviz.dense.assembly.DenseHessian` for one block under a token-wise loss,
:class:`~hessviz.dense.stack.StackHessian` for stacks and coupling losses,
:class:`~hessviz.dense.autograd.AutogradHessian` for the autograd reference), whose ``dense()`` is
the term and whose ``block(a, b)`` a block; and the products' engine, whose operator
:meth:`HessianResult.operator` gives (matrix-free), with ``matvec``, ``linear_operator`` and
``block_operator`` over it written once (:class:`OperatorResult`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, final

import numpy as np
from torch import Tensor

from hessviz.block.config import BlockConfig, parse_name
from hessviz.block.terms import NAMES, check_term
from hessviz.dense.engine import DenseEngine
from hessviz.errors import ConfigError
from hessviz.products.hessian_operator import HessianOperator

if TYPE_CHECKING:
    from scipy.sparse.linalg import LinearOperator

    from hessviz.products.operator import MatrixFreeHessian


class OperatorResult(ABC):
    """A result that holds its products as an operator: :meth:`operator` is its one way in, and the
    conveniences of ``MODEL.md`` (``res.matvec``, ``res.linear_operator``, ``res.block_operator``) are
    written here, once, over it (:class:`HessianResult` and :class:`~hessviz.whole.hessian.ModelHessian`)."""

    @abstractmethod
    def operator(self, term: str = "full") -> HessianOperator:
        """``term`` over the result's names as a
        :class:`~hessviz.products.hessian_operator.HessianOperator`."""

    @final
    def matvec(
        self,
        v: Tensor | np.ndarray,
        term: str = "full",
        rows: Sequence[str] | str | None = None,
        cols: Sequence[str] | str | None = None,
    ) -> Tensor:
        """``H v`` for ``v (P',)`` or ``(P', k)`` (the same shape back), without forming ``H``;
        ``rows`` / ``cols`` restrict to a block ``H[rows, cols]`` (``P'`` of ``cols``).

        ``v`` is **cast** to the products' dtype and device (a float32 ``v`` on a float64 result is
        promoted, a float64 ``v`` on float32 products rounded, a CPU ``v`` copied to the GPU);
        anything but a floating-point tensor or array is refused. A ``(P', k)`` ``v`` in any
        memory layout is swept ``k`` columns at a time: F-contiguous as ``(k, P')`` rows (a view); on
        the CPU the closed-form engine takes a C-contiguous ``v`` of up to 8 columns as it is and copies
        a column slice or a wider block once in C order (``hessviz.products.columns``), other engines
        copy it once into rows; the result is ``(P', k)``."""
        op = self.operator(term)
        if rows is not None or cols is not None:
            op = op.block(op.rows if rows is None else rows, op.cols if cols is None else cols)
        return op @ v

    @final
    def linear_operator(self, term: str = "full") -> LinearOperator:
        """The ``(P', P')`` term as a float64 ``scipy.sparse.linalg.LinearOperator``."""
        return self.operator(term).to_scipy()

    @final
    def block_operator(
        self, a: Sequence[str] | str, b: Sequence[str] | str | None = None, term: str = "full"
    ) -> LinearOperator:
        """The block ``H[a, b]`` (``b`` defaults to ``a``: a diagonal block) as a float64
        ``LinearOperator`` (names or head slices covered by the result); ``(|a|, |b|)``,
        ``rmatvec`` is ``H[b, a]``."""
        return self.operator(term).block(a, b).to_scipy()


@final
class HessianResult(OperatorResult):
    """The Hessian of the loss in the weights ``names``; each term computed when first read.

    ``full``, ``outer`` and ``functional`` are ``(P', P')`` tensors with
    ``P' = Σ sizes of names``, rows and columns in θ order restricted to ``names``.
    ``engine`` is the dense engine (any of its terms): the result holds one sibling per term.
    """

    def __init__(
        self,
        cfg: BlockConfig,
        names: tuple[str, ...],
        engine: DenseEngine,
        *,
        method: str = "closed_form",
        products: MatrixFreeHessian | None = None,
    ):
        self.cfg = cfg
        self.dense_terms: dict[str, DenseEngine] = {term: engine.sibling(term) for term in NAMES}
        """The dense terms, one operator each (:class:`~hessviz.dense.engine.DenseEngine`): ``dense()``
        is the term, ``block(a, b)`` a block (computed alone where the engine can)."""
        self.products = products
        """Matrix-free products (:mod:`hessviz.matfree`); no dense term is needed for them."""
        self.names = names
        self.method = method

    def __repr__(self) -> str:
        return (
            f"HessianResult(method={self.method!r}, names={self.names}, P={self.size}, "
            f"computed={sorted(self.dense_terms['full'].formed)})"
        )

    @cached_property
    def offsets(self) -> dict[str, slice]:
        """``name -> slice`` of its rows/columns."""
        return self.cfg.offsets(self.names)

    @property
    def size(self) -> int:
        return sum(self.cfg.param_size(n) for n in self.names)

    def term(self, name: str) -> Tensor:
        """``"full"``, ``"outer"`` or ``"functional"``, computed once and cached.

        ``full`` is ``outer + functional`` when both are already cached.
        """
        return self.dense_terms[check_term(name)].dense()

    def terms(self) -> dict[str, Tensor]:
        """All three terms, computed in the cheapest order for the method."""
        for name in self.dense_terms["full"].order:
            self.term(name)
        return {name: self.term(name) for name in NAMES}

    @property
    def full(self) -> Tensor:
        return self.term("full")

    @property
    def outer(self) -> Tensor:
        return self.term("outer")

    @property
    def functional(self) -> Tensor:
        return self.term("functional")

    def block(self, a: str, b: str, term: str = "full") -> Tensor:
        """The ``(|a|, |b|)`` block of ``term``; ``a`` and ``b`` may be head slices (``"W_Q[1]"``)
        of covered weights. Computed alone (only those units) when the term is not cached."""
        full = self.dense_terms["full"]
        full.covered(a)
        full.covered(b)
        return self.dense_terms[check_term(term)].block(a, b).dense()

    # ------------------------------------------------------------------ matrix-free products

    def operator(self, term: str = "full") -> HessianOperator:
        """``term`` over :attr:`names` as a :class:`~hessviz.products.hessian_operator.HessianOperator`
        ``(P', P')`` of the products' engine (the closed form's
        :class:`~hessviz.products.operator.TapeOperator`, or the autograd reference's
        :class:`~hessviz.products.autograd.AutogradOperator`): ``op @ v``, ``op.block(a, b)`` (names or
        head slices of covered weights), ``op + op2``, ``c * op``, ``op.to_scipy()``, ``op.dense()``;
        the spectral tools of :mod:`hessviz.matfree` take it. No dense term is formed."""
        check_term(term)
        if self.products is None:
            raise ConfigError("this result has no matrix-free products; compute it with hv.hessian")
        mf = self.products
        return mf.engine(mf, term, self.names, self.names, self._covered, source=self)

    def _covered(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """``names`` checked: each a name of this result or a head slice of one (for a block)."""
        for name in names:  # a head slice of a covered weight is covered
            if parse_name(self.cfg.check_name(name)).base not in self.names:
                self.dense_terms["full"].covered(name)
        return names
