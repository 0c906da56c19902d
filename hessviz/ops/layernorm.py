r"""Row LayerNorm ``y = γ ⊙ n + β``, ``n = c / σ`` with ``c = z - mean(z)``,
``σ = sqrt(mean(c²) + ε)`` over the last dimension of size ``d``; ``γ, β`` when affine.

Dense face. With the centering projector ``Π = I - 11ᵀ/d``:

.. math::
    J = \frac{1}{σ}\Big(Π - \frac{c c^\top}{n σ^2}\Big),

    Q(g) = -\frac{(Πg) c^\top + c (Πg)^\top + (g^\top c)\, Π}{n σ^3}
           + \frac{3 (g^\top c)\, c c^\top}{n^2 σ^5}.

The affine map on top is :func:`stage`. With ``ε = 0`` a row of zero variance has no
derivative: :func:`value` refuses it.

Node face (:class:`LayerNorm`): every rule applies ``J = (Π − n nᵀ/d)/σ`` (symmetric, one
row rule :func:`_apply_jacobian_rows` shared with :func:`vjp`) and its derivative to rows; no
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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch
from torch import Tensor

from hessviz.chain import Stage, plain
from hessviz.errors import InputError
from hessviz.kron import Factored
from hessviz.ops.base import Maybe, Node, TokenMap, add, eye, ones


@dataclass(frozen=True)
class LayerNormState:
    """What the derivatives need from the forward pass: ``c (..., n)``, ``σ (..., 1)``."""

    centered: Tensor
    sigma: Tensor

    @property
    def n(self) -> int:
        return self.centered.shape[-1]

    @cached_property
    def output(self) -> Tensor:
        """``y = c / σ``, ``(..., n)``."""
        return self.centered / self.sigma


def value(z: Tensor, eps: float, *, where: str = "LayerNorm input") -> tuple[Tensor, LayerNormState]:
    """``(..., n) -> (..., n)`` and the state for the derivatives.

    Raises :class:`~hessviz.errors.InputError` for a zero-variance row when ``eps = 0``.
    """
    var, mean = torch.var_mean(z, dim=-1, correction=0, keepdim=True)
    if eps == 0 and bool(var.min() <= torch.finfo(z.dtype).tiny):
        rows = torch.nonzero(var.squeeze(-1) <= torch.finfo(z.dtype).tiny).flatten().tolist()
        raise InputError(
            f"ln_eps = 0 but the {where} has zero variance in row(s) {rows[:8]}: "
            "LayerNorm is not differentiable there; use an input whose rows are not "
            "constant, or set ln_eps > 0"
        )
    st = LayerNormState(z - mean, torch.sqrt(var + eps) if eps else torch.sqrt(var))
    return st.output, st


@lru_cache(maxsize=32)
def _projector_for(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.eye(n, dtype=dtype, device=device) - 1.0 / n


def _projector(n: int, like: Tensor) -> Tensor:
    """``Π = I - 11ᵀ/n`` (cached per size, dtype and device; never written to)."""
    return _projector_for(n, like.dtype, like.device)


def jacobian(st: LayerNormState) -> Tensor:
    """``(..., n, n)``: ``(Π - c cᵀ/(n σ²)) / σ = (Π - y yᵀ/n) / σ`` with ``y = c/σ`` the output."""
    y, n = st.output, st.n
    return (_projector(n, y) - y.unsqueeze(-1) * (y / n).unsqueeze(-2)) / st.sigma.unsqueeze(-1)


def apply_jacobian(st: LayerNormState, M: Tensor) -> Tensor:
    """``J M`` for ``M (..., n, k)`` -> ``(..., n, k)`` without forming ``J``."""
    c, s, n = st.centered.unsqueeze(-1), st.sigma.unsqueeze(-1), st.n
    centered = M - M.mean(-2, keepdim=True)
    return (centered - c * (c.transpose(-1, -2) @ M) / (n * s * s)) / s


def _mean(t: Tensor) -> Tensor:
    return t.mean(-1, keepdim=True)


def _apply_jacobian_rows(y: Tensor, inv_sigma: Tensor, g: Tensor, yg: Tensor) -> Tensor:
    """``J g = (g − mean g − y·mean(y ⊙ g))/σ`` row by row, given ``yg = mean(y ⊙ g)``;
    ``y = c/σ`` the normalised rows. ``J`` is symmetric: this is the JVP and the VJP."""
    return (g - _mean(g) - y * yg) * inv_sigma


def vjp(st: LayerNormState, g: Tensor) -> Tensor:
    """``Jᵀ g = J g``: ``(..., n) -> (..., n)`` (J is symmetric)."""
    y = st.output
    return _apply_jacobian_rows(y, 1.0 / st.sigma, g, _mean(y * g))


def contract_hessian(st: LayerNormState, g: Tensor) -> Tensor:
    """``Σ_i g_i ∇² y_i``: ``(..., n) -> (..., n, n)``, symmetric."""
    c, n = st.centered, st.n
    s = st.sigma.unsqueeze(-1)
    gc = (g * c).sum(-1, keepdim=True).unsqueeze(-1)          # gᵀc, (..., 1, 1)
    pg = g - g.mean(-1, keepdim=True)                           # Π g
    cross = pg.unsqueeze(-1) * c.unsqueeze(-2)                  # (Πg) cᵀ
    ccT = c.unsqueeze(-1) * c.unsqueeze(-2)
    return (-(cross + cross.transpose(-1, -2) + gc * _projector(n, c)) / (n * s**3)
            + 3.0 * gc * ccT / (n * n * s**5))


def token_map(st: LayerNormState) -> TokenMap:
    """The LayerNorm as a token-wise map for the chain rule."""
    return TokenMap(jacobian(st), lambda g: contract_hessian(st, g))


def stage(st: LayerNormState, name: str, gamma: Tensor | None = None,
          beta: Tensor | None = None) -> Stage:
    r"""The LayerNorm as a stage of the chain rule, ``y = γ ⊙ n + β`` with ``n = c/σ``;
    ``γ, β`` (local names ``gamma``, ``beta``) when it is affine.

    .. math::
        \frac{∂y}{∂z} = \operatorname{diag}(γ) J_n, \quad Q_y(g) = Q_n(γ ⊙ g), \quad
        \frac{∂y}{∂γ} = \operatorname{diag}(n), \quad \frac{∂y}{∂β} = I, \quad
        \frac{∂^2 (g^\top y)}{∂z_i ∂γ_k} = (J_n)_{ki}\, g_k,

    and ``y`` is linear in ``(γ, β)``, so there is no weight–weight term.
    """
    if gamma is None:
        return plain(token_map(st))
    Jn = jacobian(st)
    y, L, n = st.output, st.output.shape[0], st.n
    one = ones(L, y)
    jacobians = {(name, "gamma", None): Factored.per_token(torch.diag_embed(y), one),
                 (name, "beta", None): Factored.per_token(eye(n, y, L), one)}

    def mixed(g: Tensor) -> dict:
        return {(name, "gamma", None): Factored.per_token(Jn * g.unsqueeze(-2), one)}

    tmap = TokenMap(Jn * gamma.unsqueeze(-1), lambda g: contract_hessian(st, g * gamma))
    return Stage(tmap, jacobians, mixed, lambda g: [])


class LayerNorm(Node):
    """``output = LN(input)`` (node face), affine with ``gamma``/``beta`` names when given."""

    def __init__(self, output: str, input: str, z: Tensor, eps: float,
                 gamma: tuple[str, Tensor] | None, beta: tuple[str, Tensor] | None, where: str):
        self.output, self.inputs = output, (input,)
        n, state = value(z, eps, where=where)
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
        return _apply_jacobian_rows(self.n, self.inv_sigma, dz, a), a

    def _jac(self, g: Tensor) -> Tensor:
        """``J g`` row by row."""
        return _apply_jacobian_rows(self.n, self.inv_sigma, g, _mean(self.n * g))

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
        self.m = _mean(self.n * self.gn)
        self.gz = _apply_jacobian_rows(self.n, self.inv_sigma, self.gn, self.m)
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

