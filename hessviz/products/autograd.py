r"""The autograd reference for products (tests and benchmarks only, never the closed form).

PyHessian's way, the fastest plain-autograd HVP: the weights are per-weight leaf tensors,
``g = ∇ℓ`` is taken once with ``create_graph=True``, and each product is one more
backward pass, ``H v = ∇(gᵀ v)``. The Gauss–Newton product is a JVP (the double-VJP trick:
``J v = ∂/∂u (Jᵀ u)ᵀ v``) followed by ``∇²_Z ℓ`` and a VJP, all on the retained graph;
``functional = full − outer``.

:class:`AutogradProducts` is that state at a point, kept by the point
(:meth:`~hessviz.products.operator.MatrixFreeHessian.kept`) and answering the same ``sweep`` as
:class:`~hessviz.products.tape.Tape`; :class:`AutogradOperator` is the engine: one subclass of
:class:`~hessviz.products.hessian_operator.ProductsOperator` with one ``_matmat``, batched by the
same loop as the closed form (:func:`~hessviz.products.operator.sweep_in_batches`). It is what
``hv.hessian(..., method="autograd")`` gives as ``res.operator()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import torch
from torch import Tensor

from hessviz import reference
from hessviz.block.config import BlockConfig
from hessviz.losses import Loss, block_loss
from hessviz.products.hessian_operator import ProductsOperator
from hessviz.products.layout import Layout
from hessviz.products.operator import MatrixFreeHessian, check_out, sweep_in_batches


class AutogradProducts:
    """Autograd Hessian products over the whole weights of ``cfg`` (float64 reference)."""

    def __init__(self, cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor | Loss):
        self.names = cfg.param_names
        with torch.enable_grad():
            self.leaves = [params[n].detach().clone().requires_grad_() for n in self.names]
            self.Z = reference.torch_forward(cfg, dict(zip(self.names, self.leaves)), X)
            loss = reference.torch_loss(cfg, self.Z, Y)
            self.grads = torch.autograd.grad(loss, self.leaves, create_graph=True)
        self.loss_hvp = block_loss(cfg.loss, Y).at(self.Z.detach()).product
        self._u: tuple[Tensor, tuple[Tensor, ...]] | None = None

    def _tangents(self, dparams: dict[str, Tensor], j: int) -> list[Tensor]:
        return [
            dparams[n][j] if n in dparams else torch.zeros_like(w) for n, w in zip(self.names, self.leaves)
        ]

    def hvp(self, v: list[Tensor]) -> tuple[Tensor, ...]:
        """``H v`` by double backward (``v`` per leaf)."""
        return torch.autograd.grad(self.grads, self.leaves, grad_outputs=v, retain_graph=True)

    def ggn_vp(self, v: list[Tensor]) -> tuple[Tensor, ...]:
        """``Jᵀ ∇²_Z ℓ J v``: JVP by the double-VJP trick, then a VJP."""
        with torch.enable_grad():
            if self._u is None:
                u = torch.zeros_like(self.Z, requires_grad=True)
                self._u = (u, torch.autograd.grad(self.Z, self.leaves, u, create_graph=True))
            u, JTu = self._u
            Jv = torch.autograd.grad(JTu, u, grad_outputs=v, retain_graph=True)[0]
        HJv = self.loss_hvp(Jv[None])[0]
        return torch.autograd.grad(self.Z, self.leaves, grad_outputs=HJv, retain_graph=True)

    def sweep(self, dparams: dict[str, Tensor], term: str, wanted: Sequence[str]) -> dict[str, Tensor]:
        """``name -> (k, *shape)`` products of ``term`` for the ``wanted`` parameters, the tangents
        ``dparams (k, *shape)`` (as :func:`hessviz.products.tape.sweep`, but with no ``into``: the
        products are gathered, scaled and added by the layout)."""
        k = next(iter(dparams.values())).shape[0]
        cols = []
        for j in range(k):
            v = self._tangents(dparams, j)
            if term == "full":
                cols.append(self.hvp(v))
            elif term == "outer":
                cols.append(self.ggn_vp(v))
            else:
                cols.append(tuple(a - b for a, b in zip(self.hvp(v), self.ggn_vp(v))))
        return {n: torch.stack([c[i] for c in cols]) for i, n in enumerate(self.names) if n in wanted}


@final
class AutogradOperator(ProductsOperator):
    """The autograd engine: the products of :class:`AutogradProducts`, kept at the point, swept
    ``BATCH`` columns at a time and gathered by the layouts like the closed form's."""

    products: MatrixFreeHessian
    row_layout: Layout
    col_layout: Layout

    def _matmat(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        p = self.products
        graph = p.kept(AutogradProducts, lambda: AutogradProducts(p.cfg, p.params, p.X, p.Y))
        term = self.term

        def sweep(dparams: dict[str, Tensor], wanted: tuple[str, ...], into: dict[str, Tensor]) -> dict:
            return graph.sweep(dparams, term, wanted)

        return sweep_in_batches(
            V, check_out(V, self.row_layout, out), self.row_layout, self.col_layout, sweep
        )
