r"""The feed-forward branch ``f(y) = φ(y W_1) W_2`` of one token ``y ∈ R^d``.

With ``h = y W_1``, ``a = φ(h)`` and an upstream gradient ``g ∈ R^d`` at ``f``, write
``g^a = W_2 g`` (at ``a``) and ``g^h = g^a ⊙ φ'(h)`` (at ``h``). Then

.. math::
    \frac{∂f}{∂y} = W_2^\top \operatorname{diag}(φ') W_1^\top, \qquad
    \frac{∂f_j}{∂W_1[i,m]} = y_i\, W_2[m,j]\, φ'_m, \qquad
    \frac{∂f_j}{∂W_2[m,j']} = a_m δ_{jj'};

second derivatives of ``gᵀf``:

.. math::
    ∂^2_{yy} = W_1 \operatorname{diag}(g^a ⊙ φ'') W_1^\top,\quad
    ∂^2_{y_i, W_1[i',m]} = δ_{ii'} g^h_m + W_1[i,m]\, y_{i'}\, g^a_m φ''_m,\quad
    ∂^2_{y_i, W_2[m,j']} = W_1[i,m] φ'_m g_{j'},

    ∂^2_{W_1[i,m], W_1[i',m']} = δ_{mm'} y_i y_{i'} g^a_m φ''_m,\quad
    ∂^2_{W_1[i,m], W_2[m',j']} = δ_{mm'} y_i φ'_m g_{j'},\quad
    ∂^2_{W_2 W_2} = 0.

ReLU has ``φ'' = 0``: every term with ``φ''`` is dropped, not computed as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from hessviz.components.activation import Activation
from hessviz.components.base import TokenMap, eye
from hessviz.contributions import Diagonal
from hessviz.kron import LEFT, RIGHT, Factored, KronTerm


@dataclass(frozen=True)
class FeedForward:
    """Forward values of the branch for all tokens: ``Y (L, d)`` -> ``output (L, d)``."""

    Y: Tensor
    W_1: Tensor
    W_2: Tensor
    act: Activation

    @cached_property
    def H(self) -> Tensor:
        return self.Y @ self.W_1

    @cached_property
    def hidden(self) -> Tensor:
        """``φ(Y W_1)``, ``(L, d_ff)``."""
        return self.act.value(self.H)

    @cached_property
    def output(self) -> Tensor:
        return self.hidden @ self.W_2

    @cached_property
    def dphi(self) -> Tensor:
        return self.act.df(self.H)

    @cached_property
    def d2phi(self) -> Tensor:
        return self.act.d2f(self.H)

    def _eye(self, n: int) -> Tensor:
        return eye(n, self.Y, self.Y.shape[0])

    @cached_property
    def input_map(self) -> TokenMap:
        """``y ↦ f(y)`` as a token-wise map: Jacobian and contracted ``∂²_yy``."""
        jac = torch.einsum("mj,tm,im->tji", self.W_2, self.dphi, self.W_1)

        def contract(g: Tensor) -> Tensor:
            curv = (g @ self.W_2.T) * self.d2phi                     # g^a ⊙ φ'', (L, d_ff)
            return torch.einsum("im,tm,km->tik", self.W_1, curv, self.W_1)

        return TokenMap(jac, contract if self.act.has_curvature else None)

    @cached_property
    def jacobian(self) -> dict[str, Factored]:
        """``∂f_t/∂W_1`` and ``∂f_t/∂W_2``, factored, output size ``d``."""
        d = self.W_2.shape[1]
        W2t_dphi = self.W_2.T.unsqueeze(0) * self.dphi.unsqueeze(1)  # (L, d, d_ff)
        return {
            "W_1": Factored((KronTerm(LEFT, self.Y, W2t_dphi),)),
            "W_2": Factored((KronTerm(LEFT, self.hidden, self._eye(d)),)),
        }

    def weight_gradients(self, g: Tensor) -> dict[str, Tensor]:
        """``∂(Σ_t g_tᵀ f_t)/∂W``: ``∇W_1 = Yᵀ ((g W_2ᵀ) ⊙ φ')``, ``∇W_2 = φ(Y W_1)ᵀ g``."""
        return {"W_1": self.Y.T @ ((g @ self.W_2.T) * self.dphi), "W_2": self.hidden.T @ g}

    def mixed(self, g: Tensor) -> dict[str, Factored]:
        """``∂²(gᵀf)/∂y ∂W`` per token as factored terms with output index ``y_i``."""
        ga = g @ self.W_2.T                                          # (L, d_ff)
        d = self.Y.shape[1]
        W1_dphi = self.W_1.unsqueeze(0) * self.dphi.unsqueeze(1)     # (L, d, d_ff)
        w1_terms = (KronTerm(RIGHT, ga * self.dphi, self._eye(d)),)
        if self.act.has_curvature:
            w1_terms += (KronTerm(LEFT, self.Y, self.W_1.unsqueeze(0) * (ga * self.d2phi).unsqueeze(1)),)
        return {"W_1": Factored(w1_terms), "W_2": Factored((KronTerm(RIGHT, g, W1_dphi),))}

    def functional(self, g: Tensor) -> list[Diagonal]:
        """The weight–weight second derivatives of ``Σ_t g_tᵀ f_t``: diagonal in ``m``."""
        d, dff = self.W_1.shape
        terms = [Diagonal("W_1", "W_2", (d, dff, dff, d), (1, 2),
                          torch.einsum("ti,tj,tm->ijm", self.Y, g, self.dphi))]
        if self.act.has_curvature:
            curv = (g @ self.W_2.T) * self.d2phi
            terms.append(Diagonal("W_1", "W_1", (d, dff, d, dff), (1, 3),
                                  torch.einsum("ti,tk,tm->ikm", self.Y, self.Y, curv)))
        return terms
