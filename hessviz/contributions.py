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

from hessviz.kron import Factored, sandwich_into


@dataclass(frozen=True)
class Sandwich:
    a: str
    b: str
    Ja: Factored
    N: Tensor | None
    Jb: Factored

    dense = True

    def write(self, block: Tensor, accumulate: bool) -> None:
        sandwich_into(block, self.Ja, self.N, self.Jb, accumulate=accumulate)


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

    def write(self, block: Tensor, accumulate: bool) -> None:
        if not accumulate:
            block.zero_()
        block.view(self.shape4).diagonal(dim1=self.dims[0], dim2=self.dims[1]).add_(self.values)
