r"""The first- and second-order chain rule, written once.

For ``y = f(x)`` token by token, with Jacobian ``J_t`` and contracted second derivative
``Q_t(g)``, the loss curvature seen at ``x`` is

.. math::
    g_x = J^\top g_y, \qquad
    N_x^{\text{outer}} = J^\top N_y^{\text{outer}} J, \qquad
    N_x^{\text{functional}} = J^\top N_y^{\text{functional}} J + Q(g_y).

The outer part starts as the loss Hessian in ``Z`` and only ever travels through
Jacobians; every second derivative of the model lands in the functional part. This
is the Gauss–Newton split of ``MODEL.md`` carried token by token.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from hessviz.components.base import TokenMap


def compose(inner: TokenMap, outer: TokenMap) -> TokenMap:
    """``outer ∘ inner``: ``J = J_o J_i``, ``Q(g) = J_iᵀ Q_o(g) J_i + Q_i(J_oᵀ g)``."""
    Ji, Jo = inner.jac, outer.jac

    if inner.contract is None and outer.contract is None:
        return TokenMap(Jo @ Ji)

    def contract(g: Tensor) -> Tensor:
        total = 0
        if outer.contract is not None:
            total = Ji.transpose(-1, -2) @ outer.contract(g) @ Ji
        if inner.contract is not None:
            total = total + inner.contract(outer.vjp(g))
        return total

    return TokenMap(Jo @ Ji, contract)


@dataclass(frozen=True)
class TokenCurvature:
    """Gradient ``g (L, n)`` and curvature ``(L, n, n)`` split into outer and functional.

    ``functional = None`` stands for zero.
    """

    g: Tensor
    outer: Tensor
    functional: Tensor | None = None

    def pull(self, f: TokenMap) -> TokenCurvature:
        """The same loss seen one map earlier: ``y = f(x)``, ``self`` lives at ``y``."""
        J, Jt = f.jac, f.jac.transpose(-1, -2)
        functional = None if self.functional is None else Jt @ self.functional @ J
        if f.contract is not None:
            q = f.contract(self.g)
            functional = q if functional is None else functional + q
        return TokenCurvature(f.vjp(self.g), Jt @ self.outer @ J, functional)

    def select(self, outer: float, functional: float) -> Tensor:
        """``outer·N_outer + functional·N_functional``."""
        total = self.outer * outer if outer != 1.0 else self.outer
        if functional and self.functional is not None:
            total = total + functional * self.functional
        return total
