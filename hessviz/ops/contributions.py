"""Pieces of a Hessian block, each written into place by the assembler.

A piece belongs to the block ``(a, b)`` of two parameter units (a unit is a weight, or
one head of it, addressed by its component's reference ``(component, local, head)``) and
adds to the 4-d view ``(α, β, α', β')`` of that block, ``(α, β)`` indexing ``a`` as a
matrix and ``(α', β')`` indexing ``b``. A vector parameter is a ``(1, n)`` matrix.

* :class:`Sandwich`: ``Σ_t Ja_tᵀ N_t Jb_t`` from factored Jacobians (GEMMs over tokens);
* :class:`Diagonal`: a term that is non-zero only where two indices of the 4-d block
  coincide, e.g. ``C[i, i'] δ_{mm'}``; it is added on that diagonal directly, without
  ever forming the zeros;
* :class:`Dense`: a small block given entry by entry (a LayerNorm scale before the
  attention against one head's weights).

Every piece has :meth:`transposed`, the same piece seen from the block ``(b, a)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from hessviz.ops.kron import Factored, Middle

Ref = tuple[str, str, int | None]
"""A parameter unit as its component knows it: ``(component, local name, head)``,
e.g. ``("attention", "query.weight", 3)`` or ``("ffn", "fc1.bias", None)``."""


@dataclass(frozen=True)
class Sandwich:
    """``Σ_t Ja_tᵀ N_t Jb_t`` for the block ``(a, b)``; ``N`` a :data:`~hessviz.ops.kron.Middle`."""

    a: Ref
    b: Ref
    Ja: Factored
    N: Middle
    Jb: Factored

    dense = True

    def transposed(self) -> Sandwich:
        N = self.N
        if isinstance(N, Tensor):
            N = N.transpose(-1, -2)
        elif N is not None and not getattr(N, "symmetric", False):
            raise TypeError(f"cannot transpose the structured middle {type(N).__name__}")
        return Sandwich(self.b, self.a, self.Jb, N, self.Ja)


@dataclass(frozen=True)
class Diagonal:
    """Adds ``values`` on the diagonal of dims ``dims`` of the 4-d block view.

    ``values`` has the shape of ``view.diagonal(dim1=dims[0], dim2=dims[1])``: the two
    remaining dims in order, then the diagonal.
    """

    a: Ref
    b: Ref
    dims: tuple[int, int]
    values: Tensor

    dense = False

    def transposed(self) -> Diagonal:
        # in the transposed block (α', β', α, β) every dim k moves to (k + 2) % 4
        moved = [(k + 2) % 4 for k in range(4)]
        rest = [k for k in range(4) if k not in self.dims]
        order = sorted(range(2), key=lambda r: moved[rest[r]])
        dims = sorted((moved[self.dims[0]], moved[self.dims[1]]))
        return Diagonal(self.b, self.a, (dims[0], dims[1]), self.values.permute(*order, 2))

    def add_to(self, block: Tensor, mirror: Tensor | None = None) -> None:
        """Add the values on the diagonal of the 4-d ``block`` (and of its transpose ``mirror``)."""
        for target in (block, None if mirror is None else mirror.permute(2, 3, 0, 1)):
            if target is not None:
                target.diagonal(dim1=self.dims[0], dim2=self.dims[1]).add_(self.values)


@dataclass(frozen=True)
class Dense:
    """Adds ``values (α, β, α', β')`` to the whole block."""

    a: Ref
    b: Ref
    values: Tensor

    dense = False

    def transposed(self) -> Dense:
        return Dense(self.b, self.a, self.values.permute(2, 3, 0, 1))

    def add_to(self, block: Tensor, mirror: Tensor | None = None) -> None:
        block.add_(self.values)
        if mirror is not None:
            mirror.add_(self.values.permute(2, 3, 0, 1))


Piece = Sandwich | Diagonal | Dense
