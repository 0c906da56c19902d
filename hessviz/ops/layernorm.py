r"""Row LayerNorm ``y = γ ⊙ n + β``, ``n = c / σ`` with ``c = z - mean(z)``,
``σ = sqrt(mean(c²) + ε)`` over the last dimension of size ``d``; ``γ, β`` when affine.
RMSNorm is the same operation without the centring: ``c = z``, ``σ = sqrt(mean(z²) + ε)``,
``y = γ ⊙ z/σ`` (no ``β``). Every formula below holds for both with ``Π`` the centring
projector ``I − 11ᵀ/d`` (LayerNorm) or ``I`` (RMSNorm); the flag ``centre`` of
:func:`value` (kept in :class:`LayerNormState`) picks it, and nothing else differs.

Dense face. With the centering projector ``Π = I - 11ᵀ/d`` (``I`` for RMSNorm):

.. math::
    J = \frac{1}{σ}\Big(Π - \frac{c c^\top}{n σ^2}\Big),

    Q(g) = -\frac{(Πg) c^\top + c (Πg)^\top + (g^\top c)\, Π}{n σ^3}
           + \frac{3 (g^\top c)\, c c^\top}{n^2 σ^5}.

The affine map on top is :func:`stage`. With ``ε = 0`` a row of zero variance has no
derivative: :func:`value` refuses it.

Node face (:class:`LayerNorm`, :class:`RMSNorm`): every rule applies ``J = (Π − n nᵀ/d)/σ``
(symmetric, one row rule :func:`_apply_jacobian_rows` shared with :func:`vjp`) and its
derivative to rows; no ``(d, d)`` matrix is formed. With ``a = mean(n ⊙ ż)`` (so ``σ̇ = a``,
for both: ``n`` is centred in a LayerNorm) and ``\overline{u}`` the row mean (``0`` for RMSNorm):

.. math::
    \dot n = (\dot z − \overline{\dot z} − n a)/σ, \qquad
    \dot y = γ\dot n + \dot γ n + \dot β,

    \bar n = γ \bar y,\quad \bar z = J \bar n = (\bar n − \overline{\bar n} − n m)/σ,\
    m = \text{mean}(n \bar n),\quad \bar γ = \textstyle\sum_t \bar y_t n_t,\ \bar β = \sum_t \bar y_t,

    \dot{\bar n} = γ \dot{\bar y} + [\dot γ \bar y], \quad
    \dot{\bar z} = J \dot{\bar n} + [−(a/σ) \bar z − (\dot n\, m + n\, \text{mean}(\dot n \bar n))/σ],

    \dot{\bar γ} = \textstyle\sum_t \dot{\bar y}_t n_t + [\bar y_t \dot n_t], \quad
    \dot{\bar β} = \sum_t \dot{\bar y}_t .

Other row norms (a per-head RMSNorm on ``q`` and ``k``, Qwen3's ``qk_norm``): every function
here works on rows ``(..., n)`` of any leading shape, and :class:`RMSNorm` on primals
``(R, n)`` with tangents ``(k, R, n)``, ``γ``'s gradient summed over all ``R`` rows. A norm
over each head's ``d_k`` features with one ``γ (d_k,)`` shared by the heads is therefore this
node on the view ``(L·H, d_k)`` of ``(L, H·d_k)`` (``q.reshape(L * H, d_k)``; row
``t·H + h`` is head ``h`` of token ``t``), reshaped back after: the sum over rows is the sum
over tokens and heads that a shared ``γ`` needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch
from torch import Tensor

from hessviz.errors import InputError
from hessviz.ops.base import Along, Lazy, Maybe, Node, Stage, TokenMap, add, eye, ones, plain
from hessviz.ops.kron import Factored


@dataclass(frozen=True)
class LayerNormState:
    """What the derivatives need from the forward pass: ``c (..., n)``, ``σ (..., 1)``, and whether
    ``c`` is centred (LayerNorm, ``c = Π z``) or not (RMSNorm, ``c = z``)."""

    centered: Tensor
    sigma: Tensor
    centre: bool = True

    @property
    def n(self) -> int:
        return self.centered.shape[-1]

    @cached_property
    def output(self) -> Tensor:
        """``y = c / σ``, ``(..., n)``."""
        return self.centered / self.sigma


def refuse_undefined(var: Tensor, where: str, centre: bool = True) -> None:
    """Raise :class:`~hessviz.errors.InputError` naming ``where`` and the rows (of ``var (..., 1)``,
    the variance, or for RMSNorm the mean square, of each row) where a norm with ``ε = 0`` divides by
    zero: ``σ = 0`` there, so the output and every derivative are undefined, never a NaN."""
    tiny = torch.finfo(var.dtype).tiny
    if bool(var.min() <= tiny):
        rows = torch.nonzero(var.squeeze(-1) <= tiny).flatten().tolist()
        what, fix = ("zero variance", "not constant") if centre else ("only zeros", "not zero")
        raise InputError(
            f"ln_eps = 0 but the {where} has {what} in row(s) {rows[:8]}: "
            f"{'LayerNorm' if centre else 'RMSNorm'} is not differentiable there; use an input whose "
            f"rows are {fix}, or set ln_eps > 0"
        )


def value(
    z: Tensor, eps: float, *, where: str = "LayerNorm input", centre: bool = True
) -> tuple[Tensor, LayerNormState]:
    """``(..., n) -> (..., n)`` and the state for the derivatives: ``(z − mean z)/σ`` (LayerNorm),
    or ``z/√(mean(z²) + ε)`` with ``centre=False`` (RMSNorm).

    Raises :class:`~hessviz.errors.InputError` for a zero-variance (RMSNorm: zero) row when ``eps = 0``.
    """
    if centre:
        var, mean = torch.var_mean(z, dim=-1, correction=0, keepdim=True)
        c = z - mean
    else:
        var, c = (z * z).mean(-1, keepdim=True), z
    if eps == 0:
        refuse_undefined(var, where, centre)
    st = LayerNormState(c, torch.sqrt(var + eps) if eps else torch.sqrt(var), centre)
    return st.output, st


@lru_cache(maxsize=32)
def _projector_for(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.eye(n, dtype=dtype, device=device) - 1.0 / n


def _projector(n: int, like: Tensor, centre: bool = True) -> Tensor:
    """``Π = I - 11ᵀ/n``, or ``I`` without the centring (cached per size, dtype and device; never
    written to)."""
    return _projector_for(n, like.dtype, like.device) if centre else eye(n, like)


def _centred(t: Tensor, centre: bool, dim: int = -1) -> Tensor:
    """``Π t`` along ``dim``: ``t − mean(t)``, or ``t`` itself without the centring."""
    return t - t.mean(dim, keepdim=True) if centre else t


def jacobian(st: LayerNormState) -> Tensor:
    """``(..., n, n)``: ``(Π - c cᵀ/(n σ²)) / σ = (Π - y yᵀ/n) / σ`` with ``y = c/σ`` the output."""
    y, n = st.output, st.n
    P = _projector(n, y, st.centre)
    return (P - y.unsqueeze(-1) * (y / n).unsqueeze(-2)) / st.sigma.unsqueeze(-1)


def apply_jacobian(st: LayerNormState, M: Tensor) -> Tensor:
    """``J M`` for ``M (..., n, k)`` -> ``(..., n, k)`` without forming ``J``."""
    c, s, n = st.centered.unsqueeze(-1), st.sigma.unsqueeze(-1), st.n
    return (_centred(M, st.centre, -2) - c * (c.transpose(-1, -2) @ M) / (n * s * s)) / s


def _mean(t: Tensor) -> Tensor:
    return t.mean(-1, keepdim=True)


def _apply_jacobian_rows(y: Tensor, inv_sigma: Tensor, g: Tensor, yg: Tensor, centre: bool = True) -> Tensor:
    """``J g = (Π g − y·mean(y ⊙ g))/σ`` row by row, given ``yg = mean(y ⊙ g)``;
    ``y = c/σ`` the normalised rows. ``J`` is symmetric: this is the JVP and the VJP."""
    return (_centred(g, centre) - y * yg) * inv_sigma


def vjp(st: LayerNormState, g: Tensor) -> Tensor:
    """``Jᵀ g = J g``: ``(..., n) -> (..., n)`` (J is symmetric)."""
    y = st.output
    return _apply_jacobian_rows(y, 1.0 / st.sigma, g, _mean(y * g), st.centre)


def contract_hessian(st: LayerNormState, g: Tensor) -> Tensor:
    """``Σ_i g_i ∇² y_i``: ``(..., n) -> (..., n, n)``, symmetric."""
    c, n = st.centered, st.n
    s = st.sigma.unsqueeze(-1)
    gc = (g * c).sum(-1, keepdim=True).unsqueeze(-1)  # gᵀc, (..., 1, 1)
    pg = _centred(g, st.centre)  # Π g
    cross = pg.unsqueeze(-1) * c.unsqueeze(-2)  # (Πg) cᵀ
    ccT = c.unsqueeze(-1) * c.unsqueeze(-2)
    return -(cross + cross.transpose(-1, -2) + gc * _projector(n, c, st.centre)) / (
        n * s**3
    ) + 3.0 * gc * ccT / (n * n * s**5)


def token_map(st: LayerNormState) -> TokenMap:
    """The LayerNorm as a token-wise map for the chain rule."""
    return TokenMap(jacobian(st), lambda g: contract_hessian(st, g))


def stage(st: LayerNormState, name: str, gamma: Tensor | None = None, beta: Tensor | None = None) -> Stage:
    r"""The LayerNorm (or RMSNorm) as a stage of the chain rule, ``y = γ ⊙ n + β`` with ``n = c/σ``;
    ``γ, β`` (local names ``gamma``, ``beta``) when it is affine (``β`` absent for RMSNorm).

    .. math::
        \frac{∂y}{∂z} = \operatorname{diag}(γ) J_n, \quad Q_y(g) = Q_n(γ ⊙ g), \quad
        \frac{∂y}{∂γ} = \operatorname{diag}(n), \quad \frac{∂y}{∂β} = I, \quad
        \frac{∂^2 (g^\top y)}{∂z_i ∂γ_k} = (J_n)_{ki}\, g_k,

    and ``y`` is linear in ``(γ, β)``, so there is no weight–weight term.
    """
    if gamma is None:
        return plain(token_map(st))
    Jn = jacobian(st)
    makers = {(name, "gamma", None): lambda: _gamma_jacobian(st)}
    if beta is not None:
        makers[(name, "beta", None)] = lambda: _beta_jacobian(st)
    jacobians = Lazy(makers)

    def mixed(g: Tensor) -> dict:
        return {(name, "gamma", None): Factored.per_token(Jn * g.unsqueeze(-2), ones(st.output.shape[0], g))}

    tmap = TokenMap(Jn * gamma.unsqueeze(-1), lambda g: contract_hessian(st, g * gamma))
    return Stage(tmap, jacobians, mixed, lambda g: [])


def _gamma_jacobian(st: LayerNormState) -> Factored:
    """``∂y_t/∂γ = diag(n_t)``, ``(L, n, n)`` per token."""
    y = st.output
    return Factored.per_token(torch.diag_embed(y), ones(y.shape[0], y))


def _beta_jacobian(st: LayerNormState) -> Factored:
    """``∂y_t/∂β = I``."""
    y = st.output
    return Factored.per_token(eye(st.n, y, y.shape[0]), ones(y.shape[0], y))


class LayerNorm(Node):
    """``output = LN(input)`` (node face), affine with ``gamma``/``beta`` names when given;
    ``centre=False`` is RMSNorm (then pass ``beta=None``)."""

    def __init__(
        self,
        output: str,
        input: str,
        z: Tensor,
        eps: float,
        gamma: tuple[str, Tensor] | None,
        beta: tuple[str, Tensor] | None,
        where: str,
        centre: bool = True,
    ):
        self.output, self.inputs = output, (input,)
        n, self.state = value(z, eps, where=where, centre=centre)
        self.n, self.inv_sigma, self.centre = n, 1.0 / self.state.sigma, centre
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
        """``(ṅ, a)`` for ``ż (k, L, d)``; kept from the forward sweep for the reverse one (same ``ż``)."""
        kept = getattr(self, "_fwd", None)
        if kept is not None and kept[0] is dz:
            return kept[1], kept[2]
        a = _mean(self.n * dz)
        dn = torch.addcmul(_centred(dz, self.centre), self.n, a, value=-1.0).mul_(self.inv_sigma)
        self._fwd = (dz, dn, a)
        return dn, a

    def _jac(self, g: Tensor) -> Tensor:
        """``J g`` row by row."""
        return _apply_jacobian_rows(self.n, self.inv_sigma, g, _mean(self.n * g), self.centre)

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
        self.gn = self._scale(gy)  # n̄ = γ ȳ
        self.m = _mean(self.n * self.gn)
        self.gz = _apply_jacobian_rows(self.n, self.inv_sigma, self.gn, self.m, self.centre)
        grads = ([(gy * self.n).sum(0)] if self.gamma is not None else []) + (
            [gy.sum(0)] if self.has_beta else []
        )
        return [self.gz], grads

    def _adjoint_rows(self, dgn: Maybe, dn: Maybe, a: Maybe) -> Maybe:
        """``J n̄̇ + (∂J[ż]) n̄`` in one pass over the rows:
        ``(Π n̄̇ − n (mean(n ⊙ n̄̇) + mean(ṅ ⊙ n̄)) − m ṅ − a z̄) / σ`` with ``m = mean(n ⊙ n̄)``,
        ``a = mean(n ⊙ ż)``, ``z̄ = J n̄`` (either part ``None``: zero)."""
        if dgn is None and dn is None:
            return None
        coef = None if dgn is None else _mean(self.n * dgn)
        if dn is not None:
            coef = add(coef, _mean(dn * self.gn))
        if dgn is None:
            out = torch.mul(self.n, coef).neg_()
        else:
            out = torch.addcmul(_centred(dgn, self.centre), self.n, coef, value=-1.0)
        if dn is not None:
            out.addcmul_(dn, self.m, value=-1.0).addcmul_(self.gz, a, value=-1.0)
        return out.mul_(self.inv_sigma)

    def adjoint_tangent(self, along: Along) -> tuple[list[Maybe], list[Maybe]]:
        dgy, need_p = along.dgy, along.need_p
        dgamma, _ = self._split(along.dp)
        dn = None
        if along.second_dx is not None:
            dn, a = self._jvp_n(along.second_dx)
        self._fwd = None  # the forward sweep's, done with
        dgz = None
        if along.need_x[0]:
            dgn = None if dgy is None else self._scale(dgy)  # γ ȳ̇
            if along.second and dgamma is not None:
                dgn = add(dgn, dgamma[:, None, :] * self.gy)  # γ̇ ȳ
            dgz = self._adjoint_rows(dgn, dn, a if dn is not None else None)
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


class RMSNorm(LayerNorm):
    """``output = γ ⊙ z/√(mean(z²) + ε)`` row by row (node face), ``gamma`` optional: the
    :class:`LayerNorm` node without the centring and without ``β``. For a per-head norm with a
    ``γ (d_k,)`` shared by the heads, give it the ``(L·H, d_k)`` view (see the module docstring)."""

    def __init__(
        self, output: str, input: str, z: Tensor, eps: float, gamma: tuple[str, Tensor] | None, where: str
    ):
        super().__init__(output, input, z, eps, gamma, None, where, centre=False)
