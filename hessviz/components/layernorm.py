r"""Row LayerNorm without affine parameters, ``y = c / σ`` with ``c = z - mean(z)``,
``σ = sqrt(mean(c²) + ε)`` over the last dimension of size ``n``.

With the centering projector ``Π = I - 11ᵀ/n``:

.. math::
    J = \frac{1}{σ}\Big(Π - \frac{c c^\top}{n σ^2}\Big),

    Q(g) = -\frac{(Πg) c^\top + c (Πg)^\top + (g^\top c)\, Π}{n σ^3}
           + \frac{3 (g^\top c)\, c c^\top}{n^2 σ^5}.

With ``ε = 0`` a row of zero variance has no derivative: :func:`value` refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch
from torch import Tensor

from hessviz.chain import Stage, plain
from hessviz.components.base import TokenMap, eye, ones
from hessviz.errors import InputError
from hessviz.kron import Factored


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


def vjp(st: LayerNormState, g: Tensor) -> Tensor:
    """``Jᵀ g``: ``(..., n) -> (..., n)`` (J is symmetric)."""
    c, s, n = st.centered, st.sigma, st.n
    return (g - g.mean(-1, keepdim=True) - c * (c * g).sum(-1, keepdim=True) / (n * s * s)) / s


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
