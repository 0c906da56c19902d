r"""Hessian products without the matrix: ``V ↦ H V`` for any term, weights and head slices.

:class:`MatrixFreeHessian` is the products' state at a point
(:class:`~hessviz.products.hessian_operator.Products`):
it runs the forward pass and the first-order reverse sweep once, when first asked
(:func:`hessviz.products.block.build`). :class:`TapeOperator`, the closed-form engine, makes each
product one tangent-forward and one tangent-reverse sweep (:func:`hessviz.products.tape.sweep`),
batched over the columns of ``V`` (:func:`sweep_in_batches`, the one batching loop of every engine).

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
with the tangent on ``b`` only and the product read on ``a`` only: ``op.block(a, b)``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Protocol, TypeVar, final

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.block.terms import check_term
from hessviz.errors import InputError
from hessviz.losses import Loss
from hessviz.ops.base import Maybe
from hessviz.products import graphs
from hessviz.products.block import build
from hessviz.products.columns import needs_copy, swept_chunks
from hessviz.products.hessian_operator import Names, ProductsOperator
from hessviz.products.layout import Layout
from hessviz.products.tape import Tape, sweep
from hessviz.runtime import pages

BATCH = 8
"""Product columns per sweep. On the bench layer (MiniLM, L = 24, 1 thread) 4 or 8 columns cost
≈ 0.8× a single product per column and 16 more than 8 (their weight tangents, 16 × 14 MiB, no
longer share the cache), so wider batches are swept 8 columns at a time."""

T = TypeVar("T")


class Sweep(Protocol):
    """One sweep of ``k`` product columns: ``(dparams, wanted, into) ↦ θ̄̇ of wanted`` (a tape's,
    a batch's in lockstep, a checkpointed batch's or autograd's, with the term and scale bound)."""

    def __call__(
        self, dparams: dict[str, Tensor], wanted: tuple[str, ...], into: dict[str, Tensor]
    ) -> dict[str, Maybe]: ...


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
    sweep: Sweep,
    alpha: float = 1.0,
    accumulate: bool = False,
    columns_last: bool = False,
    scratch: Tensor | None = None,
) -> Tensor:
    """``out (k, |rows|)`` from ``V (k, |cols|)``, ``BATCH`` rows of ``V`` at a time: each chunk's
    weight tangents scattered by ``cols``, swept by ``sweep(dparams, wanted, into)`` (the products of
    the ``wanted`` bases, a product written into its view of ``into`` where it can be), and gathered
    by ``rows`` into the chunk's rows of ``out`` (``alpha``, ``accumulate``: as the sweep applied them).
    The chunks are as even as ``BATCH`` allows (:func:`chunks`: 10 columns are 5 + 5, not 8 + 2).
    ``columns_last``: the sweep takes a chunk with its columns last
    (:func:`~hessviz.products.columns.swept_chunks`: a C-contiguous ``(P', k)`` block of at most ``BATCH``
    columns is swept as it is, other row-major blocks after one copy in C order into ``scratch``), else
    each chunk is made unit-stride rows."""
    bounds = chunks(V.shape[0])
    for (start, stop), chunk in zip(bounds, swept_chunks(V, bounds, columns_last, scratch), strict=True):
        part = out[start:stop]
        prods = sweep(cols.scatter(chunk), rows.bases, rows.destinations(part))
        rows.gather(prods, chunk.shape[0], chunk, part, alpha, accumulate)
    return out


def check_out(V: Tensor, rows: Layout, out: Tensor | None) -> Tensor:
    """``out`` checked (a ``(k, |rows|)`` tensor with unit-stride rows), or a fresh huge-page one."""
    if out is None:
        return pages.empty((V.shape[0], rows.size), V)
    if out.shape != (V.shape[0], rows.size) or out.stride(-1) != 1:
        raise InputError(
            f"out must be a ({V.shape[0]}, {rows.size}) tensor with unit-stride rows, got {tuple(out.shape)}"
        )
    return out


@final
class MatrixFreeHessian:
    """The products' state at the point ``(params, X, Y)`` of ``cfg``'s loss, in ``names``
    (arguments validated by the API): a :class:`~hessviz.products.hessian_operator.Products`.

    ``engine`` is the :class:`~hessviz.products.hessian_operator.ProductsOperator` class whose
    products :meth:`operator` gives (:class:`TapeOperator`, the closed form, by default); the tape
    and whatever an engine keeps at the point (:meth:`kept`) are built when first asked."""

    def __init__(
        self,
        cfg: BlockConfig,
        params: dict[str, Tensor],
        X: Tensor,
        Y: Loss,
        names: Names,
        engine: type[ProductsOperator] | None = None,
    ):
        self.cfg, self.params, self.X, self.Y, self.names = cfg, params, X, Y, names
        self.engine: type[ProductsOperator] = TapeOperator if engine is None else engine
        self.matvecs = 0
        """Product columns computed so far (what Lanczos and Hutchinson count)."""
        self.replay = True
        """On a GPU, replay repeated products as CUDA graphs (:mod:`hessviz.products.graphs`)."""
        self._kept: dict[Hashable, object] = {}
        self._scratch: list[Tensor] = []

    @cached_property
    def tape(self) -> Tape:
        """The closed-form tape at the point (every token): the dense engines fold over it."""
        return build(self.cfg, self.params, self.X, self.Y)

    @cached_property
    def sweep_tape(self) -> Tape:
        """The tape the products sweep: :attr:`tape`, or, when the loss reads some tokens only (a
        ``[CLS]`` classifier's :class:`~hessviz.losses.CustomLoss`), the tape whose last layer
        runs on those tokens after its attention
        (:func:`~hessviz.products.block.build`, ``only_read_tokens``):
        the same products and gradients, for less work."""
        if getattr(self.Y, "read_tokens", None) is None:
            return self.tape
        return build(self.cfg, self.params, self.X, self.Y, only_read_tokens=True)

    def kept(self, key: Hashable, make: Callable[[], T]) -> T:
        """What an engine keeps at this point under ``key`` (made by ``make()`` when first asked,
        then the same object: an autograd engine's retained graph, a replay's recorded graphs)."""
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]  # type: ignore[return-value]

    @contextmanager
    def scratch(self, numel: int, like: Tensor) -> Iterator[Tensor]:
        """A flat buffer of at least ``numel`` elements like ``like`` for the copy of a product block
        (:func:`~hessviz.products.columns.sweepable`), lent for one call and kept for the next: a fresh
        buffer's page faults cost as much as the copy. Each call in flight borrows its own (the list's
        ``pop`` and ``append`` are atomic), and the largest asked for is kept."""
        buffer = self._scratch.pop() if self._scratch else None
        if (
            buffer is None
            or buffer.numel() < numel
            or buffer.dtype != like.dtype
            or buffer.device != like.device
        ):
            buffer = pages.empty((numel,), like)
        try:
            yield buffer
        finally:
            self._scratch.append(buffer)

    def layout(self, names: Sequence[str] | None = None) -> Layout:
        names = self.names if names is None else self.cfg.sort_names(tuple(names))
        return Layout(self.cfg, names)

    def operator(
        self, term: str = "full", rows: Names | None = None, cols: Names | None = None
    ) -> ProductsOperator:
        """``H[rows, cols]`` of ``term`` as this point's engine (names as ``cfg`` spells them;
        default: every name of this object)."""
        check_term(term)
        rows = self.names if rows is None else tuple(rows)
        return self.engine(self, term, rows, rows if cols is None else tuple(cols))


@final
class TapeOperator(ProductsOperator):
    """The closed-form engine: ``H[rows, cols] Vᵀ``, transposed, swept ``BATCH`` columns at a time
    through the tape (:func:`sweep_in_batches`, :func:`hessviz.products.tape.sweep`).

    The result is allocated once (:func:`hessviz.runtime.pages.empty`), or is ``out`` (a
    ``(k, |rows|)`` tensor with unit-stride rows: a Lanczos basis row), and each whole weight's
    product is written straight into its columns (``Layout.destinations``): no weight-sized
    temporary, no gather copy, no concatenation of the sweeps. On a GPU, a product repeated at
    this point is replayed as a CUDA graph (:mod:`hessviz.products.graphs`)."""

    products: MatrixFreeHessian
    row_layout: Layout
    col_layout: Layout
    columns_last = True
    """On the CPU the tape's GEMMs take a C-contiguous ``(P', k)`` block as it is
    (:func:`hessviz.ops.batched.columns_last`)."""

    def _matmat(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        return self.scaled(V, out)

    def scaled(
        self, V: Tensor, out: Tensor | None = None, alpha: float = 1.0, accumulate: bool = False
    ) -> Tensor:
        """:meth:`_matmat` with ``out ← (out if accumulate else 0) + alpha · H V`` (``out`` required
        when ``alpha ≠ 1`` or ``accumulate``): the weights' products added by their GEMMs in place
        (a batch's sequences summed into one vector, :class:`~hessviz.whole.hessian.BatchOperator`).
        A replayed product is scaled and added after its replay. Counts nothing: :meth:`apply` does."""
        point, rows, cols = self.products, self.row_layout, self.col_layout
        if out is not None:
            check_out(V, rows, out)
        scaled = alpha != 1.0 or accumulate
        if scaled and out is None:
            raise InputError("a scaled or accumulated product needs out")
        if point.replay and graphs.enabled(V):
            replays = point.kept(graphs.Replays, graphs.Replays)
            got = replays((self.term, rows.names, cols.names), V, self._sweep, None if scaled else out)
            if scaled:
                assert out is not None
                return out.add_(got, alpha=alpha) if accumulate else torch.mul(got, alpha, out=out)
            return got
        return self._sweep(V, out, alpha, accumulate)

    def _sweep(
        self, V: Tensor, out: Tensor | None = None, alpha: float = 1.0, accumulate: bool = False
    ) -> Tensor:
        tape, term = self.products.sweep_tape, self.term

        def swept(dparams: dict[str, Tensor], wanted: tuple[str, ...], into: dict[str, Tensor]) -> dict:
            return sweep([tape], dparams, term, wanted, into, alpha, accumulate)

        out = check_out(V, self.row_layout, out)
        if not needs_copy(V, self.columns_last, chunks(V.shape[0])):
            return sweep_in_batches(V, out, self.row_layout, self.col_layout, swept, alpha, accumulate, True)
        with self.products.scratch(V.numel(), V) as buffer:
            return sweep_in_batches(
                V, out, self.row_layout, self.col_layout, swept, alpha, accumulate, True, buffer
            )
