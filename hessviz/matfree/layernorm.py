r"""Row LayerNorm ``y = γ ⊙ n + β``, ``n = (z − mean z)/σ``, ``σ = √(var z + ε)``, per token.

All rules apply ``J = (Π − n nᵀ/d)/σ`` (symmetric) and its derivative to rows; no
``(d, d)`` matrix is formed. With ``a = mean(n ⊙ ż)`` (so ``σ̇ = a``):

.. math::
    \dot n = (\dot z − \overline{\dot z} − n a)/σ, \qquad
    \dot y = γ\dot n + \dot γ n + \dot β,

    \bar n = γ \bar y,\quad \bar z = J \bar n = (\bar n − \overline{\bar n} − n m)/σ,\
    m = \text{mean}(n \bar n),\quad \bar γ = \textstyle\sum_t \bar y_t n_t,\ \bar β = \sum_t \bar y_t,

    \dot{\bar n} = γ \dot{\bar y} + [\dot γ \bar y], \quad
    \dot{\bar z} = J \dot{\bar n} + [−(a/σ) \bar z − (\dot n\, m + n\, \text{mean}(\dot n \bar n))/σ],

    \dot{\bar γ} = \textstyle\sum_t \dot{\bar y}_t n_t + [\bar y_t \dot n_t], \quad
    \dot{\bar β} = \sum_t \dot{\bar y}_t .

The forward value (and the zero-variance check for ``ε = 0``) is the component's.
"""

from __future__ import annotations

from torch import Tensor

from hessviz.components import layernorm as stock
from hessviz.matfree.tape import Maybe, Node, add


def _mean(t: Tensor) -> Tensor:
    return t.mean(-1, keepdim=True)


class LayerNorm(Node):
    """``output = LN(input)``, affine with ``gamma``/``beta`` names when given."""

    def __init__(self, output: str, input: str, z: Tensor, eps: float,
                 gamma: tuple[str, Tensor] | None, beta: tuple[str, Tensor] | None, where: str):
        self.output, self.inputs = output, (input,)
        n, state = stock.value(z, eps, where=where)
        self.n, self.inv_sigma = n, 1.0 / state.sigma
        self.gamma = None if gamma is None else gamma[1]
        self.params = tuple(p[0] for p in (gamma, beta) if p is not None)
        self.has_beta = beta is not None
        y = n if self.gamma is None else self.gamma * n
        self.y = y if beta is None else y + beta[1]

    def _split(self, dp: list[Maybe]) -> tuple[Maybe, Maybe]:
        if self.gamma is None:
            return None, (dp[0] if self.has_beta else None)
        return dp[0], (dp[1] if self.has_beta else None)

    def _jvp_n(self, dz: Tensor) -> tuple[Tensor, Tensor]:
        """``(ṅ, a)`` for ``ż (k, L, d)``."""
        a = _mean(self.n * dz)
        return (dz - _mean(dz) - self.n * a) * self.inv_sigma, a

    def _jac(self, g: Tensor) -> Tensor:
        """``J g`` row by row."""
        return (g - _mean(g) - self.n * _mean(self.n * g)) * self.inv_sigma

    def _scale(self, t: Tensor) -> Tensor:
        return t if self.gamma is None else self.gamma * t

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        dgamma, dbeta = self._split(dp)
        out = None if dx[0] is None else self._scale(self._jvp_n(dx[0])[0])
        if dgamma is not None:
            out = add(out, dgamma[:, None, :] * self.n)
        if dbeta is not None:
            out = add(out, dbeta[:, None, :].expand(-1, self.n.shape[0], -1))
        return out

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        self.gy = gy
        self.gn = self._scale(gy)                                      # n̄ = γ ȳ
        self.gz = self._jac(self.gn)
        self.m = _mean(self.n * self.gn)
        grads = ([(gy * self.n).sum(0)] if self.gamma is not None else []) + \
                ([gy.sum(0)] if self.has_beta else [])
        return [self.gz], grads

    def adjoint_tangent(self, dgy: Maybe, dx: list[Maybe], dp: list[Maybe], second: bool,
                        need_x: list[bool], need_p: list[bool]) -> tuple[list[Maybe], list[Maybe]]:
        dgamma, _ = self._split(dp)
        dn = None
        if second and dx[0] is not None:
            dn, a = self._jvp_n(dx[0])
        dgz = None
        if need_x[0]:
            dgn = None if dgy is None else self._scale(dgy)            # γ ȳ̇
            if second and dgamma is not None:
                dgn = add(dgn, dgamma[:, None, :] * self.gy)           # γ̇ ȳ
            dgz = None if dgn is None else self._jac(dgn)
            if dn is not None:                                         # (∂J[ż]) n̄
                dgz = add(dgz, -a * self.inv_sigma * self.gz
                          - (dn * self.m + self.n * _mean(dn * self.gn)) * self.inv_sigma)
        dgp: list[Maybe] = []
        if self.gamma is not None:
            dgg = None
            if need_p[0]:
                dgg = None if dgy is None else (dgy * self.n).sum(-2)
                if dn is not None:
                    dgg = add(dgg, (self.gy * dn).sum(-2))
            dgp.append(dgg)
        if self.has_beta:
            dgp.append(None if dgy is None or not need_p[-1] else dgy.sum(-2))
        return [dgz], dgp
