"""Pieces of a Hessian block, each written into place by the assembler.

A Hessian block ``(a, b)`` (rows: parameter ``a``, columns: parameter ``b``) is a sum of

* :class:`Sandwich`: ``Σ_t Ja_tᵀ N_t Jb_t`` from factored Jacobians (GEMMs over tokens);
* :class:`Diagonal`: a term that is non-zero only where two indices of the 4-d block
  ``(α, β, α', β')`` coincide, e.g. ``C[i, i'] δ_{mm'}``; it is added on that diagonal
  directly, without ever forming the zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from hessviz.kron import Factored, Middle


@dataclass(frozen=True)
class Sandwich:
    """``Σ_t Ja_tᵀ N_t Jb_t`` for the block ``(a, b)``; ``N`` a :data:`~hessviz.kron.Middle`."""

    a: str
    b: str
    Ja: Factored
    N: Middle
    Jb: Factored

    dense = True


@dataclass(frozen=True)
class Diagonal:
    """Adds ``values`` on the diagonal of dims ``dims`` of the 4-d block view.

    ``values`` has the shape of ``view.diagonal(dim1=dims[0], dim2=dims[1])``: the two
    remaining dims in order, then the diagonal.
    """

    a: str
    b: str
    shape4: tuple[int, int, int, int]
    dims: tuple[int, int]
    values: Tensor

    dense = False

    def add_to(self, block: Tensor, mirror: Tensor | None = None) -> None:
        """Add the values on the diagonal of ``block`` (and of its transpose ``mirror``)."""
        targets = [(block, self.shape4, self.dims, self.values)]
        if mirror is not None:
            # in the mirror (α', β', α, β) every dim k moves to (k + 2) % 4
            moved = [(k + 2) % 4 for k in range(4)]
            rest = [k for k in range(4) if k not in self.dims]
            order = sorted(range(2), key=lambda r: moved[rest[r]])
            shape = tuple(self.shape4[k] for k in (2, 3, 0, 1))
            dims = (moved[self.dims[0]], moved[self.dims[1]])
            targets.append((mirror, shape, dims, self.values.permute(*order, 2)))
        for target, shape, dims, values in targets:
            target.view(shape).diagonal(dim1=dims[0], dim2=dims[1]).add_(values)
