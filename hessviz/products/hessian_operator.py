r"""One operator type for every Hessian: ``op @ v``, blocks, sums, scipy and curvlinops views.

A :class:`HessianOperator` is the linear map ``θ'_cols → θ'_rows`` of one term of a Hessian
(``H``, or a block ``H[a, b]`` of it), with ``shape == (|rows|, |cols|)``. An *engine* is one
subclass with one method, :meth:`HessianOperator._matmat`: ``V (k, n) ↦ (k, m)``, the products of
``k`` vectors given as the **rows** of ``V`` (each row unit-stride: the layout every sweep works in,
so a Lanczos basis row can be a product's own buffer), and :meth:`HessianOperator.dense`, the
matrix (:func:`swept` from products, or the formed term). Everything else is written once, here:
``op @ v`` for ``v (n,)`` or ``(n, k)``, :meth:`~HessianOperator.block`, ``op + op2``, ``c * op``,
``op.T``, :meth:`~HessianOperator.to_scipy`, :meth:`~HessianOperator.to_curvlinops`; and
:mod:`hessviz.matfree`'s spectral tools take any operator.

Every class is abstract or final (as equinox has it): no class overrides a concrete method of
its parent. :class:`HessianOperator` is abstract; :class:`ProductsOperator` is the abstract engine
over a point's :class:`Products` (names, layouts, blocks and transposes written once: an engine
writes its ``_matmat`` and nothing else); the rest are final:

* :class:`~hessviz.products.operator.TapeOperator`: the closed-form products, one tangent-forward
  and one tangent-reverse sweep of the tape per column (``hv.hessian``);
* :class:`~hessviz.products.autograd.AutogradOperator`: the autograd reference (double backward on a
  kept graph; ``hv.hessian(..., method="autograd")``);
* :class:`~hessviz.whole.hessian.BatchOperator`: a whole model's ``(1/B) Σ_β H_β V``
  (``hv.model_hessian``);
* :class:`DenseOperator`: a ``(m, n)`` matrix already formed (a block of a dense term), ``V ↦ V Mᵀ``;
* the dense engines, :class:`~hessviz.dense.engine.DenseEngine`'s final subclasses: one formed term of a
  result, ``dense()`` the term (formed once), ``block`` computed alone where it can;
* :class:`SumOperator` and :class:`ScaledOperator`: ``Σ_i op_i`` and ``c · op``.

A block of a products engine is the same sweep with the tangent on ``b`` and the product read on
``a``: ``O(|a| + |b|)`` work beyond the sweep, nothing of size ``P × P``.

>>> import torch, hessviz as hv
>>> cfg = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=6, n_heads=2, out_proj=True)
>>> res = hv.hessian(cfg, hv.init_params(cfg, seed=0), *hv.sample_inputs(cfg, seed=0), wrt=("W_Q", "W_V"))
>>> op = res.operator()
>>> op.shape, op.block("W_Q[1]", "W_V").shape
((32, 32), (8, 16))
>>> v = torch.ones(32, dtype=torch.float64)
>>> bool(torch.allclose(op @ v, (res.operator("outer") + res.operator("functional")) @ v, atol=1e-12))
True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any, Protocol, final

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator
from torch import Tensor

from hessviz.errors import ConfigError, InputError
from hessviz.products.columns import unit_rows
from hessviz.runtime import memory as host_memory
from hessviz.runtime import pages

Names = tuple[str, ...]

DENSE_COLUMNS = 64
"""Columns per product when :meth:`HessianOperator.dense` builds the matrix (each engine sweeps
them in its own batches)."""


def as_columns(
    v: Tensor | np.ndarray, size: int, like: Tensor, field: str = "v", columns_last: bool = False
) -> tuple[Tensor, bool]:
    """``v (size,)`` or ``(size, k)`` as a ``(k, size)`` tensor like ``like`` with unit-stride rows; and
    whether it was 1-D. A ``v`` whose columns are already unit-stride (F-contiguous, the transpose of a
    ``(k, size)`` tensor) is a view; any other layout is copied once, in tiles
    (:func:`hessviz.products.columns.unit_rows`, at the cost of a plain copy). ``columns_last`` (an
    engine that sweeps any layout, :attr:`HessianOperator.columns_last`): on the CPU, ``v``'s transpose
    itself, whatever its layout (:func:`hessviz.products.columns.sweepable` takes it from there), or,
    in another dtype, cast into a C-contiguous block (the same sweep as the cast ``v`` would get)."""
    if isinstance(v, np.ndarray):
        v = torch.from_numpy(np.ascontiguousarray(v))
    if not isinstance(v, Tensor):
        raise InputError(
            f"{field} must be a torch.Tensor or numpy array of shape ({size},) or ({size}, k), "
            f"got {type(v).__name__}"
        )
    if v.ndim not in (1, 2) or v.shape[0] != size:
        raise InputError(f"{field} must have shape ({size},) or ({size}, k), got {tuple(v.shape)}")
    if not v.is_floating_point():
        raise InputError(f"{field} must be a floating-point tensor, got {v.dtype}")
    vector = v.ndim == 1
    V = v.to(device=like.device).reshape(size, -1).T  # a view on the CPU: (k, P) rows, any strides
    if V.dtype == like.dtype and (V.stride(1) == 1 or V.shape[1] <= 1):
        return V, vector  # F-contiguous, a (k, P) tensor's transpose, or one column: no copy
    if columns_last and V.device.type == "cpu" and V.shape[0] > 1 and V.stride(1) != 1:
        if V.dtype == like.dtype:
            return V, vector  # C-contiguous or a column slice: the engine's sweep takes it as it is
        # another dtype: cast in one streaming pass into C order, swept as a C-contiguous v would be
        return pages.empty(tuple(V.T.shape), like).copy_(V.T).T, vector
    # C-contiguous (P, k), a column slice, another dtype: one tiled copy (and cast) into (k, P) rows
    return unit_rows(V, pages.empty(tuple(V.shape), like)), vector


def scipy_view(
    shape: tuple[int, int],
    forward: Callable[[Tensor], Tensor],
    like: Tensor,
    backward: Callable[[Tensor], Tensor] | None = None,
) -> LinearOperator:
    """The float64 scipy ``LinearOperator`` of shape ``(m, n)`` over row products: ``forward`` maps
    ``(k, n)`` rows like ``like`` to ``(k, m)``, ``backward`` (default ``forward``: a symmetric operator)
    maps ``(k, m)`` to ``(k, n)`` for ``rmatvec``. The one place a scipy view is built
    (:meth:`HessianOperator.to_scipy`; the spectral tools' counted products)."""

    def face(apply: Callable[[Tensor], Tensor], n: int) -> Callable[[np.ndarray], np.ndarray]:
        def f(x: np.ndarray) -> np.ndarray:
            V, _ = as_columns(np.asarray(x, dtype=np.float64).reshape(n, -1), n, like)
            return apply(V).T.to(torch.float64).cpu().numpy()

        return f

    m, n = shape
    right = face(forward, n)
    left = right if backward is None else face(backward, m)
    return LinearOperator(shape, matvec=right, matmat=right, rmatvec=left, rmatmat=left, dtype=np.float64)


def _names(x: str | Sequence[str]) -> Names:
    return (x,) if isinstance(x, str) else tuple(x)


def swept(op: HessianOperator) -> Tensor:
    """``op``'s ``(m, n)`` matrix from ``n`` products in sweeps of :data:`DENSE_COLUMNS` columns, under
    the memory guard (``hessviz.set_memory_limit``): the ``dense`` of every operator that has no
    matrix formed (a products engine, a sum, a scaling)."""
    m, n = op.shape
    size = op.like.element_size()
    host_memory.check_fits(
        f"a dense operator ({m} x {n})",
        (m * n + DENSE_COLUMNS * (m + n)) * size,
        op.device,
        "take blocks with op.block(a, b), or products with op @ v",
    )
    out = pages.empty((n, m), op.like)
    eye = torch.eye(n, dtype=op.dtype, device=op.device)
    for first in range(0, n, DENSE_COLUMNS):
        op.apply(eye[first : first + DENSE_COLUMNS], out=out[first : first + DENSE_COLUMNS])
    return out.T


class Tally(Protocol):
    """What counts product columns (a point's :class:`Products`: what Lanczos and Hutchinson count)."""

    matvecs: int


class HessianOperator(ABC):
    """The ``(m, n)`` operator of one Hessian term (or block) on ``θ'``; an engine writes :meth:`_matmat`.

    ``rows`` and ``cols`` are the names along each side (in the result's own spelling, in θ order);
    ``term`` says what it is (``"full"``, ``"outer"``, ``"functional"`` or an expression of them);
    ``tally``, when given, counts the product columns :meth:`apply` computes.
    """

    columns_last: bool = False
    """Whether :meth:`_matmat` takes, on the CPU, ``V (k, n)`` as the transpose of a C-contiguous or
    row-major ``(n, k)`` block (``op @ v`` then hands ``v`` over without a copy: :func:`as_columns`)."""

    def __init__(
        self,
        rows: Names,
        cols: Names,
        shape: tuple[int, int],
        dtype: torch.dtype,
        device: torch.device | str,
        term: str,
        tally: Tally | None = None,
    ):
        self.rows, self.cols, self.term = rows, cols, term
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype, self.device = dtype, torch.device(device)
        self.tally = tally

    # ------------------------------------------------------------------ what a subclass writes

    @abstractmethod
    def _matmat(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        """``V (k, n) ↦ (k, m)``: the product of each row of ``V`` (``V`` has this operator's dtype
        and device, unit-stride rows). ``out``, when given, is a ``(k, m)`` tensor with unit-stride
        rows the engine may write the result into (and return); an engine may also ignore it."""

    @abstractmethod
    def _block(self, rows: Names, cols: Names) -> HessianOperator:
        """The sub-operator of names ``rows × cols``."""

    @abstractmethod
    def _transpose(self) -> HessianOperator:
        """``opᵀ``. A Hessian is symmetric: a diagonal operator is its own transpose, and an
        off-diagonal block ``H[a, b]`` transposes to ``H[b, a]``."""

    @abstractmethod
    def block_names(self, by_head: bool = True) -> Names:
        """The diagonal blocks a per-block table reads (:func:`hessviz.matfree.block_table`): each
        name of :attr:`rows` (an engine with heads splits each headed weight into its heads)."""

    # ------------------------------------------------------------------ written once for all

    @final
    def apply(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        """``V (k, n) ↦ (k, m)`` in the rows layout, written into ``out`` when given (what the
        spectral tools call; ``op @ v`` is the column-vector face of the same product)."""
        result = self._matmat(V, out)
        if self.tally is not None:
            self.tally.matvecs += V.shape[0]
        if out is not None and result is not out:
            return out.copy_(result)
        return result

    @property
    def like(self) -> Tensor:
        """An empty tensor of this operator's dtype and device."""
        return torch.empty(0, dtype=self.dtype, device=self.device)

    def __matmul__(self, v: Tensor | np.ndarray) -> Tensor:
        """``op @ v`` for ``v (n,)`` or ``(n, k)`` (the same shape back, ``m`` rows); ``v`` is cast
        to the operator's dtype and device."""
        V, vector = as_columns(v, self.shape[1], self.like, columns_last=self.columns_last)
        out = self.apply(V).T
        return out.reshape(-1) if vector else out

    def block(self, a: str | Sequence[str], b: str | Sequence[str] | None = None) -> HessianOperator:
        """The sub-operator ``H[a, b]`` of names (or head slices) ``a`` × ``b``; ``b`` defaults to
        ``a`` (a diagonal block). ``(|a|, |b|)``; its transpose is ``H[b, a]``."""
        rows = _names(a)
        cols = rows if b is None else _names(b)
        if not rows or not cols:
            raise ConfigError("block needs at least one name on each side, e.g. op.block('W_Q', 'W_V')")
        return self._block(rows, cols)

    @property
    def T(self) -> HessianOperator:  # noqa: N802 - the name every linear-algebra library uses
        return self._transpose()

    def __add__(self, other: object) -> HessianOperator:
        if not isinstance(other, HessianOperator):
            return NotImplemented
        if other.shape != self.shape or (other.rows, other.cols) != (self.rows, self.cols):
            raise ConfigError(
                f"cannot add operators over different names: {self.rows} × {self.cols} "
                f"{self.shape} and {other.rows} × {other.cols} {other.shape}"
            )
        if (other.dtype, other.device) != (self.dtype, self.device):
            raise ConfigError(
                f"cannot add operators of {self.dtype} on {self.device} and {other.dtype} on {other.device}"
            )
        return SumOperator((self, other))

    def __mul__(self, c: object) -> HessianOperator:
        if isinstance(c, Tensor) and c.numel() == 1:
            c = c.item()
        if isinstance(c, bool) or not isinstance(c, Real) or not np.isfinite(float(c)):
            return NotImplemented
        return ScaledOperator(self, float(c))

    __rmul__ = __mul__

    def __neg__(self) -> HessianOperator:
        return ScaledOperator(self, -1.0)

    def __sub__(self, other: object) -> HessianOperator:
        if not isinstance(other, HessianOperator):
            return NotImplemented
        return self + (-other)

    def to_scipy(self) -> LinearOperator:
        """A float64 ``scipy.sparse.linalg.LinearOperator`` of this shape; ``rmatvec`` is ``opᵀ``
        (float64 on the CPU whatever the products' dtype and device)."""
        backward = None if self.rows == self.cols else self.T.apply
        return scipy_view(self.shape, self.apply, self.like, backward)

    def to_curvlinops(self):
        """This operator as a curvlinops ``PyTorchLinearOperator`` (curvlinops ≥ 3, the ``bench``
        extra), so its estimators (``hutchinson_trace``, ``hutchpp_trace``, ``hutchinson_diag``, …)
        run on hessviz's exact products. One flat tensor on each side: ``[(n,)] → [(m,)]``."""
        try:
            from curvlinops._torch_base import PyTorchLinearOperator
        except ImportError as e:
            raise ImportError(
                "to_curvlinops needs curvlinops >= 3: pip install 'hessviz[bench]' "
                "(curvlinops-for-pytorch, installed with --no-deps)"
            ) from e
        return _curvlinops_view(PyTorchLinearOperator, self)

    @abstractmethod
    def dense(self) -> Tensor:
        """The ``(m, n)`` matrix, under the memory guard (``hessviz.set_memory_limit``): a products
        engine's from ``n`` products (:func:`swept`), a dense engine's the term it forms once."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.term!r}, rows={self.rows}, cols={self.cols}, "
            f"shape={self.shape}, {self.dtype}, {self.device})"
        )


class Columns(Protocol):
    """The columns of ``θ'`` for some names (a :class:`~hessviz.products.layout.Layout`, or a whole
    model's :class:`~hessviz.whole.hessian.WholeLayout`): the names in order and the entries in all."""

    names: Names
    size: int


class Products(Protocol):
    """The products' state at one point (the typed interface every engine reads): a block's
    :class:`~hessviz.products.operator.MatrixFreeHessian` or a whole model's
    :class:`~hessviz.whole.hessian.BatchProducts`. ``cfg`` spells the names; ``names`` are those
    covered; ``X`` gives the dtype and device; ``matvecs`` counts product columns; ``engine`` is
    the :class:`ProductsOperator` class its products are (the engine is chosen by its class);
    ``layout(names)`` the columns of some of the names (default: all), as the engine reads them."""

    cfg: Any
    names: Names
    X: Tensor
    matvecs: int
    engine: type[ProductsOperator]

    def layout(self, names: Sequence[str] | None = None) -> Any: ...


class ProductsOperator(HessianOperator):
    """The abstract engine: ``term`` of the products at the point ``products`` on the layouts of
    ``rows`` × ``cols``. A subclass writes :meth:`_matmat`, reading :attr:`products` (its state at
    the point), :attr:`term`, :attr:`row_layout` and :attr:`col_layout`; its blocks, transposes,
    per-head block names and the count of products are written here, once.

    ``resolve`` turns names as the result spells them into the products' own spelling, checked
    (a one-layer model's ``l0.W_Q`` is the block's ``W_Q``), and ``spell`` turns them back: the
    operator's ``rows`` and ``cols`` are the result's names in θ order. ``source``, the result,
    lends its ``cfg`` and ``names`` to :func:`hessviz.matfree.block_names`."""

    def __init__(
        self,
        products: Products,
        term: str,
        rows: Names,
        cols: Names,
        resolve: Callable[[Names], Names] = tuple,
        spell: Callable[[str], str] = str,
        source: object = None,
    ):
        self.products, self.resolve, self.spell, self.source = products, resolve, spell, source
        self.row_layout = products.layout(resolve(rows))
        self.col_layout = self.row_layout if cols == rows else products.layout(resolve(cols))
        like = products.X
        super().__init__(
            tuple(map(spell, self.row_layout.names)),
            tuple(map(spell, self.col_layout.names)),
            (self.row_layout.size, self.col_layout.size),
            like.dtype,
            like.device,
            term,
            products,
        )

    @final
    def block_names(self, by_head: bool = True) -> Names:
        inner = head_blocks(self.products.cfg, self.row_layout.names, by_head)
        return tuple(map(self.spell, inner))

    @final
    def _block(self, rows: Names, cols: Names) -> HessianOperator:
        return type(self)(self.products, self.term, rows, cols, self.resolve, self.spell, self.source)

    @final
    def dense(self) -> Tensor:
        return swept(self)

    @final
    def _transpose(self) -> HessianOperator:
        if self.rows == self.cols:
            return self
        return type(self)(
            self.products, self.term, self.cols, self.rows, self.resolve, self.spell, self.source
        )


@final
class DenseOperator(HessianOperator):
    """A formed ``(m, n)`` matrix ``M`` (a dense term) as an operator: ``V ↦ V Mᵀ``. Its blocks are
    the matrix's own rows and columns, by ``rows`` and ``cols`` (whole names only)."""

    def __init__(
        self,
        matrix: Tensor,
        rows: Names,
        cols: Names | None = None,
        sizes: dict[str, int] | None = None,
        term: str = "full",
    ):
        cols = rows if cols is None else cols
        if matrix.ndim != 2:
            raise InputError(f"matrix must be 2-D, got shape {tuple(matrix.shape)}")
        self.matrix, self.sizes = matrix, sizes
        super().__init__(rows, cols, (matrix.shape[0], matrix.shape[1]), matrix.dtype, matrix.device, term)

    def _matmat(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        return torch.matmul(V, self.matrix.T, out=out)

    def dense(self) -> Tensor:
        """The matrix itself (no product is taken)."""
        return self.matrix

    def block_names(self, by_head: bool = True) -> Names:
        return self.rows

    def _block(self, rows: Names, cols: Names) -> HessianOperator:
        if self.sizes is None:
            raise ConfigError("this DenseOperator was made without sizes: it has no named blocks")
        return DenseOperator(
            self.matrix[self._index(self.rows, rows)][:, self._index(self.cols, cols)],
            rows,
            cols,
            self.sizes,
            self.term,
        )

    def _index(self, side: Names, names: Names) -> Tensor:
        sizes = self.sizes
        assert sizes is not None  # _block refuses an operator without sizes
        starts, at = {}, 0
        for name in side:
            starts[name] = at
            at += sizes[name]
        unknown = [n for n in names if n not in starts]
        if unknown:
            raise ConfigError(f"name {unknown[0]!r} is not among this operator's names {side}")
        return torch.cat([torch.arange(starts[n], starts[n] + sizes[n]) for n in names]).to(self.device)

    def _transpose(self) -> HessianOperator:
        if self.rows == self.cols:
            return self
        return DenseOperator(self.matrix.T, self.cols, self.rows, self.sizes, self.term)


def head_blocks(cfg, names: Names, by_head: bool = True) -> Names:
    """``names`` (as ``cfg`` spells them) with each headed weight split into its heads when
    ``by_head`` and ``cfg`` has more than one; head slices and other weights stay as they are."""
    out: list[str] = []
    for name in names:
        if by_head and "[" not in name and cfg.is_headed(name) and cfg.n_heads > 1:
            out.extend(cfg.head_names(name))
        else:
            out.append(name)
    return tuple(out)


@final
class SumOperator(HessianOperator):
    """``Σ_i op_i`` of operators over the same names: each part's product, summed in order."""

    def __init__(self, parts: Sequence[HessianOperator]):
        flat = tuple(q for p in parts for q in (p.parts if isinstance(p, SumOperator) else (p,)))
        self.parts: tuple[HessianOperator, ...] = flat
        first = flat[0]
        super().__init__(
            first.rows, first.cols, first.shape, first.dtype, first.device, " + ".join(p.term for p in flat)
        )

    def _matmat(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        total = self.parts[0].apply(V, out)
        for part in self.parts[1:]:
            total.add_(part.apply(V))
        return total

    def _block(self, rows: Names, cols: Names) -> HessianOperator:
        return SumOperator([p.block(rows, cols) for p in self.parts])

    def dense(self) -> Tensor:
        return swept(self)

    def block_names(self, by_head: bool = True) -> Names:
        return self.parts[0].block_names(by_head)

    def _transpose(self) -> HessianOperator:
        return self if self.rows == self.cols else SumOperator([p.T for p in self.parts])


@final
class ScaledOperator(HessianOperator):
    """``c · op``."""

    def __init__(self, op: HessianOperator, c: float):
        self.op, self.c = op, c
        super().__init__(op.rows, op.cols, op.shape, op.dtype, op.device, f"{c:g} * ({op.term})")

    def _matmat(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        return self.op.apply(V, out).mul_(self.c)

    def _block(self, rows: Names, cols: Names) -> HessianOperator:
        return ScaledOperator(self.op.block(rows, cols), self.c)

    def dense(self) -> Tensor:
        return swept(self)

    def block_names(self, by_head: bool = True) -> Names:
        return self.op.block_names(by_head)

    def _transpose(self) -> HessianOperator:
        return self if self.rows == self.cols else ScaledOperator(self.op.T, self.c)


def _curvlinops_view(base: type, op: HessianOperator):
    """``op`` as an instance of a subclass of curvlinops' ``PyTorchLinearOperator`` ``base``
    (made here so that curvlinops stays an optional dependency)."""

    class CurvlinopsView(base):
        SELF_ADJOINT = op.rows == op.cols

        def __init__(self, inner: HessianOperator):
            super().__init__([(inner.shape[1],)], [(inner.shape[0],)])
            self.inner = inner

        @property
        def dtype(self) -> torch.dtype:
            return self.inner.dtype

        @property
        def device(self) -> torch.device:
            return self.inner.device

        def _matmat(self, X: list[Tensor]) -> list[Tensor]:  # [(n, K)] -> [(m, K)]
            (M,) = X
            return [self.inner.apply(unit_rows(M.T)).T]

        def _adjoint(self):
            return _curvlinops_view(base, self.inner.T)

    return CurvlinopsView(op)
