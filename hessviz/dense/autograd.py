"""The autograd reference's dense terms as a dense engine: ``hv.hessian(..., method="autograd")``.

``full`` and ``outer`` by ``torch.func`` (:func:`hessviz.reference.full_hessian`,
:func:`hessviz.reference.outer_hessian`), ``functional = full − outer``; a block is read from its
term (autograd has nothing cheaper).
"""

from __future__ import annotations

from typing import final

from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.dense.engine import DenseEngine, memo
from hessviz.losses import Loss
from hessviz.reference import full_hessian, outer_hessian


@final
class AutogradHessian(DenseEngine):
    """The term :attr:`term` in ``names`` by autograd at ``(params, X)`` under the loss ``Y``; the
    ``full`` and ``outer`` that ``functional`` is made of are kept for the siblings
    (:func:`~hessviz.dense.engine.memo`)."""

    order = ("full", "outer", "functional")
    """full and outer are computed, functional is their difference."""
    label = "autograd"

    def __init__(
        self,
        cfg: BlockConfig,
        names: tuple[str, ...],
        params: dict[str, Tensor],
        X: Tensor,
        Y: Tensor | Loss,
        needed: int,
        term: str = "full",
    ):
        super().__init__(cfg, names, X, needed, term)
        self.params, self.X, self.Y = params, X, Y

    @memo
    def part(self, term: str) -> Tensor:
        """``full`` or ``outer`` by ``torch.func``, ``(P', P')``."""
        compute = full_hessian if term == "full" else outer_hessian
        return compute(self.cfg, self.params, self.X, self.Y, self.names)

    def _form(self) -> Tensor:
        if self.term == "functional":
            return self.part("full") - self.part("outer")
        return self.part(self.term)

    def _alone(self, a: str, b: str) -> None:
        """``None``: autograd has no cheaper block than the term it is read from."""
        return None
