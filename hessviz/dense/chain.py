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

from hessviz.ops.base import Lazy, Stage, TokenMap
from hessviz.ops.contributions import Piece, Ref, Sandwich
from hessviz.ops.kron import Factored
from hessviz.ops.residual import residual


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


def residual_stage(branch: Stage) -> Stage:
    """``x ↦ x + b(x; θ)``: the identity path adds ``I`` to the Jacobian and nothing else."""
    return Stage(residual(branch.map), branch.jacobians, branch.mixed, branch.functional)


def compose_stages(inner: Stage, outer: Stage) -> Stage:
    r"""``outer ∘ inner``, with ``g_mid = J_oᵀ g`` the gradient between them:

    .. math::
        \frac{∂y}{∂θ_i} = J_o \frac{∂m}{∂θ_i}, \quad
        \text{mixed}_{θ_i}(g) = J_i^\top Q_o(g) \frac{∂m}{∂θ_i} + \text{mixed}^{in}_{θ_i}(g_{mid}),
        \quad \text{mixed}_{θ_o}(g) = J_i^\top \text{mixed}^{out}_{θ_o}(g),

        ∂^2_{θ_i θ_i'} = \frac{∂m}{∂θ_i}^\top Q_o(g) \frac{∂m}{∂θ_i'} + ∂^2_{in}(g_{mid}), \quad
        ∂^2_{θ_i θ_o} = \frac{∂m}{∂θ_i}^\top \text{mixed}^{out}_{θ_o}(g), \quad
        ∂^2_{θ_o θ_o'} = ∂^2_{out}(g).
    """
    Ji, Jo = inner.map.jac, outer.map.jac
    inner_refs = list(inner.jacobians)
    jacobians = Lazy(
        {r: (lambda r=r: inner.jacobians[r].lmul(Jo)) for r in inner_refs}
        | {r: (lambda r=r: outer.jacobians[r]) for r in outer.jacobians}
    )

    def outer_curvature(g: Tensor) -> Tensor | None:
        return outer.map.contract(g) if outer.map.contract is not None and inner_refs else None

    def mixed(g: Tensor) -> dict[Ref, Factored]:
        out = {r: F.lmul(Ji.transpose(-1, -2)) for r, F in outer.mixed(g).items()}
        Qo = outer_curvature(g)
        from_inner = inner.mixed(outer.map.vjp(g)) if inner_refs else {}
        for r in inner_refs:
            parts = []
            if Qo is not None:
                parts.append(inner.jacobians[r].lmul(Ji.transpose(-1, -2) @ Qo))
            if r in from_inner:
                parts.append(from_inner[r])
            if parts:
                out[r] = sum(parts[1:], parts[0])
        return out

    def functional(g: Tensor) -> list[Piece]:
        pieces = outer.functional(g)
        if not inner_refs:
            return pieces
        pieces += inner.functional(outer.map.vjp(g))
        Qo = outer_curvature(g)
        if Qo is not None:
            pieces += [
                Sandwich(a, b, inner.jacobians[a], Qo, inner.jacobians[b])
                for k, a in enumerate(inner_refs)
                for b in inner_refs[k:]
            ]
        pieces += [
            Sandwich(a, b, inner.jacobians[a], None, Mb)
            for b, Mb in outer.mixed(g).items()
            for a in inner_refs
        ]
        return pieces

    return Stage(compose(inner.map, outer.map), jacobians, mixed, functional)
