"""The result of a Hessian computation: ``full``, ``outer`` and ``functional`` as views.

The three terms are three views of one computation: each is computed the first time
it is read and cached; a single block can be computed alone. The computing is an
*engine*'s (:class:`Engine`): :class:`~hessviz.dense.assembly.DenseHessian` (one block, token-wise
loss), :class:`~hessviz.dense.stack.StackHessian` (stacks, coupling losses) or
:class:`~hessviz.reference.AutogradHessian`; the products are the operator of the products' engine
(:meth:`HessianResult.operator`), with ``matvec``, ``linear_operator`` and ``block_operator`` over it
written once (:class:`OperatorResult`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Protocol, final

import numpy as np
import torch
from torch import Tensor

from hessviz.block.config import BlockConfig, parse_name
from hessviz.block.terms import NAMES, check_term
from hessviz.errors import ConfigError
from hessviz.products.hessian_operator import HessianOperator
from hessviz.runtime import pages
from hessviz.runtime.memory import check_fits

if TYPE_CHECKING:
    from scipy.sparse.linalg import LinearOperator

    from hessviz.products.operator import MatrixFreeHessian

SIZE_ADVICE = "lower seq_len, d_model, d_k or d_ff, or pass fewer names in wrt"
"""What to do when a dense result is over the memory limit."""


class Engine(Protocol):
    """What computes the dense terms and blocks of a :class:`HessianResult`."""

    order: tuple[str, ...]
    """The cheapest order in which to compute all three terms."""

    def term(self, names: tuple[str, ...], term: str) -> Tensor:
        """The ``(P', P')`` term for ``names`` (checked, in θ order)."""

    def block(self, a: str, b: str, term: str) -> Tensor | None:
        """The ``(|a|, |b|)`` block of two names or head slices alone; ``None``: read it from the term."""


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
        anything but a floating-point tensor or array is refused. A ``(P', k)`` ``v`` in either
        memory layout is swept ``k`` columns at a time as contiguous ``(k, P')`` rows (a
        C-contiguous ``v`` is copied once into that layout); the result is ``(P', k)``."""
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
    """

    def __init__(
        self,
        cfg: BlockConfig,
        names: tuple[str, ...],
        engine: Engine,
        *,
        method: str = "closed_form",
        products: MatrixFreeHessian | None = None,
        dense_bytes: int = 0,
        device: torch.device | str = "cpu",
    ):
        self.cfg = cfg
        self.engine = engine
        """Computes the dense terms and blocks: ``engine.term(names, term)``, ``engine.block(a, b, term)``."""
        self.products = products
        """Matrix-free products (:mod:`hessviz.matfree`); no dense term is needed for them."""
        self.names = names
        self.method = method
        self.dense_bytes = dense_bytes
        """Estimated peak bytes of one dense term, checked against the memory limit before one is computed."""
        self._device = device
        self._terms: dict[str, Tensor] = {}

    def __repr__(self) -> str:
        return (
            f"HessianResult(method={self.method!r}, names={self.names}, P={self.size}, "
            f"computed={sorted(self._terms)})"
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
        check_term(name)
        if name not in self._terms:
            if name == "full" and {"outer", "functional"} <= self._terms.keys():
                outer, functional = self._terms["outer"], self._terms["functional"]
                self._terms[name] = torch.add(outer, functional, out=pages.empty(tuple(outer.shape), outer))
            else:
                check_fits(
                    f"a dense Hessian term ({self.size} x {self.size}, {self.method})",
                    self.dense_bytes,
                    self._device,
                    SIZE_ADVICE,
                )
                self._terms[name] = self.engine.term(self.names, name)
        return self._terms[name]

    def terms(self) -> dict[str, Tensor]:
        """All three terms, computed in the cheapest order for the method."""
        for name in self.engine.order:
            self.term(name)
        return {name: self._terms[name] for name in NAMES}

    @property
    def full(self) -> Tensor:
        return self.term("full")

    @property
    def outer(self) -> Tensor:
        return self.term("outer")

    @property
    def functional(self) -> Tensor:
        return self.term("functional")

    def _check_covered(self, name: str) -> str:
        """``name`` if it is one of ``names`` or a head slice of one of them."""
        base = parse_name(self.cfg.check_name(name)).base
        if name not in self.names and base not in self.names:
            raise ConfigError(
                f"parameter {name!r} is not in this result's names {self.names}; "
                "compute the Hessian with it (or its whole weight) in wrt"
            )
        return name

    def _index(self, name: str) -> slice | Tensor:
        """Rows of ``name`` in the terms: its slice, or a head's entries inside its whole weight."""
        if name in self.offsets:
            return self.offsets[name]
        whole = self.offsets[parse_name(name).base]
        return self.cfg.head_indices(name) + whole.start

    def block(self, a: str, b: str, term: str = "full") -> Tensor:
        """The ``(|a|, |b|)`` block of ``term``; ``a`` and ``b`` may be head slices (``"W_Q[1]"``)
        of covered weights. Computed alone (only those units) when the term is not cached."""
        self._check_covered(a)
        self._check_covered(b)
        check_term(term)
        alone = None if term in self._terms else self.engine.block(a, b, term)
        if alone is not None:
            return alone
        rows, cols = self._index(a), self._index(b)
        matrix = self.term(term)
        return matrix[rows][:, cols] if isinstance(cols, Tensor) else matrix[rows, cols]

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
                self._check_covered(name)
        return names
