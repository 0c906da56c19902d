r"""Hessian products without the matrix: ``V ↦ H V`` for any term, weights and head slices.

:class:`MatrixFreeHessian` runs the forward pass and the first-order reverse sweep once
(:func:`hessviz.products.block.build`); each product is then one tangent-forward and one
tangent-reverse sweep (:meth:`Tape.sweep`), batched over the columns of ``V``.

**State kept at the point.** Everything that does not depend on ``v`` is computed once, when
the tape is first built (a cached property of this object, so it is freed with the result): the
forward record (every activation), the attention weights ``A`` and their first-order adjoints
(``Ā``, ``S̄`` and the scaled factors ``c S̄``, ``c K``, ``c Q``), the LayerNorm factors (``1/σ``,
the normalised input, ``n̄``, ``mean(n ⊙ n̄)``), the loss gradient ``∇_Z ℓ`` and its curvature at
``Z`` (the softmax ``p`` for cross-entropy). Its size is that of one forward and one reverse pass,
``O(L d + H L² + L d_ff)`` per layer. A repeated product runs only the ``v``-dependent tangent and
tangent-reverse sweeps (``tests/test_lanczos.py`` checks repeats are bit-identical).

Memory per product column: the tangents of every activation, ``O(L d + H L² + L d_ff)``,
plus ``O(P)`` for the weight tangents. Nothing of size ``P × P`` or ``(L, d, d)`` is formed.

A block ``H[a, b]`` (rows ``a``, columns ``b``, each a tuple of names) is the same sweep
with the tangent on ``b`` only and the product read on ``a`` only: ``block_operator``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.block.terms import check_term
from hessviz.errors import InputError
from hessviz.products import graphs
from hessviz.products.autograd import AutogradProducts
from hessviz.products.block import build
from hessviz.products.columns import unit_rows
from hessviz.products.hessian_operator import ProductsOperator
from hessviz.products.layout import Layout
from hessviz.products.tape import Tape
from hessviz.runtime import pages

BATCH = 8
"""Product columns per sweep. On the bench layer (MiniLM, L = 24, 1 thread) 4 or 8 columns cost
≈ 0.8× a single product per column and 16 more than 8 (their weight tangents, 16 × 14 MiB, no
longer share the cache), so wider batches are swept 8 columns at a time."""


def chunks(k: int, batch: int = BATCH) -> list[tuple[int, int]]:
    """``[start, stop)`` of ``⌈k / batch⌉`` chunks of ``k`` columns, as even as can be (sizes differ by
    one at most): a lone narrow chunk (8 + 2) runs its sweep at a narrow chunk's higher cost a column."""
    n = -(-k // batch)
    return [(i * k // n, (i + 1) * k // n) for i in range(n)]


def sweep_in_batches(
    V: Tensor,
    out: Tensor,
    rows: Layout,
    cols: Layout,
    sweep: Callable[[dict[str, Tensor], tuple[str, ...], dict[str, Tensor]], dict[str, Tensor | None]],
    alpha: float = 1.0,
    accumulate: bool = False,
) -> Tensor:
    """``out (k, |rows|)`` from ``V (k, |cols|)``, ``BATCH`` rows of ``V`` at a time: each chunk's
    weight tangents scattered by ``cols``, swept by ``sweep(dparams, wanted, into)`` (the products of
    the ``wanted`` bases, a product written into its view of ``into`` where it can be), and gathered
    by ``rows`` into the chunk's rows of ``out`` (``alpha``, ``accumulate``: as the sweep applied them).
    The chunks are as even as ``BATCH`` allows (:func:`chunks`: 10 columns are 5 + 5, not 8 + 2)."""
    for start, stop in chunks(V.shape[0]):
        chunk = unit_rows(V[start:stop])  # (k, P') rows: unit-stride weight tangents
        part = out[start:stop]
        prods = sweep(cols.scatter(chunk), rows.bases, rows.destinations(part))
        rows.gather(prods, chunk.shape[0], chunk, part, alpha, accumulate)
    return out


class MatrixFreeHessian:
    """Products with the Hessian of ``cfg``'s loss in ``names`` (arguments validated by the API).

    ``method="closed_form"`` sweeps the hand-written tape; ``"autograd"`` answers the same
    calls with :class:`~hessviz.products.autograd.AutogradProducts` (the reference).
    """

    def __init__(
        self,
        cfg: BlockConfig,
        params: dict[str, Tensor],
        X: Tensor,
        Y: Tensor,
        names: tuple[str, ...],
        method: str = "closed_form",
    ):
        self.cfg, self.params, self.X, self.Y, self.names = cfg, params, X, Y, names
        self.method = method
        self.matvecs = 0
        """Product columns computed so far (what Lanczos and Hutchinson count)."""
        self.replay = True
        """On a GPU, replay repeated products as CUDA graphs (:mod:`hessviz.products.graphs`)."""

    @cached_property
    def tape(self) -> Tape | AutogradProducts:
        if self.method == "autograd":
            return AutogradProducts(self.cfg, self.params, self.X, self.Y)
        return build(self.cfg, self.params, self.X, self.Y)

    @cached_property
    def sweep_tape(self) -> Tape | AutogradProducts:
        """The tape the products sweep: :attr:`tape`, or, when the loss reads some tokens only (a
        ``[CLS]`` classifier's :class:`~hessviz.losses.CustomLoss`), the tape whose last layer
        runs on those tokens after its attention
        (:func:`~hessviz.products.block.build`, ``only_read_tokens``):
        the same products and gradients, for less work."""
        if self.method == "autograd" or getattr(self.Y, "read_tokens", None) is None:
            return self.tape
        return build(self.cfg, self.params, self.X, self.Y, only_read_tokens=True)

    def layout(self, names: Sequence[str] | None = None) -> Layout:
        names = self.names if names is None else self.cfg.sort_names(tuple(names))
        return Layout(self.cfg, names)

    def product(
        self,
        V: Tensor,
        term: str,
        rows: Layout,
        cols: Layout,
        out: Tensor | None = None,
        alpha: float = 1.0,
        accumulate: bool = False,
    ) -> Tensor:
        """``(k, |cols|) -> (k, |rows|)``: ``H[rows, cols] Vᵀ``, transposed, in sweeps of ``BATCH``.

        The result is allocated once (:func:`hessviz.runtime.pages.empty`), or is ``out`` (a
        ``(k, |rows|)`` tensor with unit-stride rows: a Lanczos basis row), and each whole
        weight's product is written straight into its columns (``Layout.destinations``): no
        weight-sized temporary, no gather copy, no concatenation of the sweeps. ``alpha``,
        ``accumulate`` (``out`` required): ``out ← (out if accumulate else 0) + alpha · H V``, the
        weights' products added by their GEMMs in place (a batch's sequences summed into one
        vector). On a GPU, a product repeated at this point is replayed as a CUDA graph
        (:mod:`hessviz.products.graphs`) and then scaled and added."""
        if out is not None and (out.shape != (V.shape[0], rows.size) or out.stride(-1) != 1):
            raise InputError(
                f"out must be a ({V.shape[0]}, {rows.size}) tensor with unit-stride rows, "
                f"got {tuple(out.shape)}"
            )
        scaled = alpha != 1.0 or accumulate
        if scaled and out is None:
            raise InputError("a scaled or accumulated product needs out")
        if self.replay and self.method == "closed_form" and graphs.enabled(V):
            got = self._replays(
                (term, rows.names, cols.names),
                V,
                lambda W: self._sweep(W, term, rows, cols),
                None if scaled else out,
            )
            if scaled:
                got = out.add_(got, alpha=alpha) if accumulate else torch.mul(got, alpha, out=out)
            out = got
        else:
            out = self._sweep(V, term, rows, cols, out, alpha, accumulate)
        self.matvecs += V.shape[0]
        return out

    @cached_property
    def _replays(self) -> graphs.Replays:
        return graphs.Replays()

    def _sweep(
        self,
        V: Tensor,
        term: str,
        rows: Layout,
        cols: Layout,
        out: Tensor | None = None,
        alpha: float = 1.0,
        accumulate: bool = False,
    ) -> Tensor:
        """:meth:`product`, swept: ``BATCH`` columns at a time through :attr:`sweep_tape`."""
        if out is None:
            out = pages.empty((V.shape[0], rows.size), V)

        def sweep(dparams: dict[str, Tensor], wanted: tuple[str, ...], into: dict[str, Tensor]) -> dict:
            return self.sweep_tape.sweep(dparams, term, wanted, into, alpha, accumulate)

        return sweep_in_batches(V, out, rows, cols, sweep, alpha, accumulate)

    def operator(
        self, term: str = "full", rows: Sequence[str] | None = None, cols: Sequence[str] | None = None
    ) -> ProductsOperator:
        """``H[rows, cols]`` of ``term`` as a :class:`~hessviz.products.hessian_operator.HessianOperator`
        (names as ``cfg`` spells them; default: every name of this object)."""
        check_term(term)
        rows = self.names if rows is None else tuple(rows)
        return ProductsOperator(self, term, rows, rows if cols is None else tuple(cols))

    def matvec(
        self,
        v: Tensor | np.ndarray,
        term: str = "full",
        rows: Sequence[str] | None = None,
        cols: Sequence[str] | None = None,
    ) -> Tensor:
        """``H v`` for ``v (P',)`` or ``(P', k)`` (same shape back; ``P'`` of ``cols``).

        ``v`` is **cast** to the products' dtype and device (a float32 ``v`` on a float64 result is
        promoted, a float64 ``v`` on float32 products rounded, a CPU ``v`` copied to the GPU);
        anything but a floating-point tensor or array is refused. A ``(P', k)`` ``v`` in either
        memory layout is swept ``k`` columns at a time as contiguous ``(k, P')`` rows (a
        C-contiguous ``v`` is copied once into that layout); the result is ``(P', k)``, F-contiguous."""
        return self.operator(term, rows, cols) @ v

    def linear_operator(
        self, term: str = "full", rows: Sequence[str] | None = None, cols: Sequence[str] | None = None
    ) -> LinearOperator:
        """``H[rows, cols]`` as a float64 scipy ``LinearOperator`` (``rmatvec`` is ``H[cols, rows]``)."""
        return self.operator(term, rows, cols).to_scipy()
