r"""The feed-forward branch ``f(y) = φ(y W_1 + b_1) W_2 + b_2`` of one token ``y ∈ R^d`` (dense face).

The product engine runs the same branch as three nodes (:class:`~hessviz.ops.linear.Linear`,
the activation's :class:`~hessviz.ops.elementwise.Elementwise`, ``Linear``); the dense face is fused
here because its factored pieces share ``φ'`` and ``W_2 g`` across every weight pair.

Local parameter names: ``fc1.weight`` (``W_1``), ``fc1.bias`` (``b_1``), ``fc2.weight``,
``fc2.bias``; the biases are optional. With ``h = y W_1 + b_1``, ``a = φ(h)`` and an
upstream gradient ``g ∈ R^d`` at ``f``, write ``g^a = W_2 g`` (at ``a``) and
``g^h = g^a ⊙ φ'(h)`` (at ``h``). Then

.. math::
    \frac{∂f}{∂y} = W_2^\top \operatorname{diag}(φ') W_1^\top, \qquad
    \frac{∂f_j}{∂W_1[i,m]} = y_i\, W_2[m,j]\, φ'_m, \qquad
    \frac{∂f_j}{∂b_1[m]} = W_2[m,j]\, φ'_m, \qquad
    \frac{∂f_j}{∂W_2[m,j']} = a_m δ_{jj'}, \qquad \frac{∂f}{∂b_2} = I;

second derivatives of ``gᵀf``:

.. math::
    ∂^2_{yy} = W_1 \operatorname{diag}(g^a ⊙ φ'') W_1^\top,\quad
    ∂^2_{y_i, W_1[i',m]} = δ_{ii'} g^h_m + W_1[i,m]\, y_{i'}\, g^a_m φ''_m,\quad
    ∂^2_{y_i, b_1[m]} = W_1[i,m]\, g^a_m φ''_m,\quad
    ∂^2_{y_i, W_2[m,j']} = W_1[i,m] φ'_m g_{j'},

    ∂^2_{W_1[i,m], W_1[i',m']} = δ_{mm'} y_i y_{i'} g^a_m φ''_m,\quad
    ∂^2_{W_1[i,m], W_2[m',j']} = δ_{mm'} y_i φ'_m g_{j'},\quad
    ∂^2_{W_2 W_2} = 0,

and the same with ``y_i`` replaced by ``1`` for ``b_1`` in place of ``W_1``; ``b_2`` enters
linearly. ReLU has ``φ'' = 0`` (``hessian_is_zero``): every term with ``φ''`` is dropped, not
computed as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from hessviz.ops.base import Lazy, Stage, TokenMap, eye, ones
from hessviz.ops.contributions import Diagonal
from hessviz.ops.elementwise import Elementwise
from hessviz.ops.kron import LEFT, RIGHT, Factored, KronTerm


@dataclass(frozen=True)
class FeedForward:
    """Forward values of the branch for all tokens: ``Y (L, d)`` -> ``output (L, d)``."""

    Y: Tensor
    W_1: Tensor
    W_2: Tensor
    act: type[Elementwise]
    b_1: Tensor | None = None
    b_2: Tensor | None = None
    name: str = "ffn"

    def seeded(self, **values: Tensor) -> FeedForward:
        """``self`` with forward values a tape already computed (``H``, ``hidden``, ``output``, …,
        by the names of the cached properties below): none of them is computed a second time."""
        for name, value in values.items():
            if not isinstance(getattr(type(self), name, None), cached_property):
                raise AttributeError(f"{type(self).__name__} has no forward value {name!r}")
            self.__dict__[name] = value
        return self

    @cached_property
    def H(self) -> Tensor:
        H = self.Y @ self.W_1
        return H if self.b_1 is None else H + self.b_1

    @cached_property
    def hidden(self) -> Tensor:
        """``φ(Y W_1 + b_1)``, ``(L, d_ff)``."""
        return self.act.f(self.H)

    @cached_property
    def output(self) -> Tensor:
        out = self.hidden @ self.W_2
        return out if self.b_2 is None else out + self.b_2

    @cached_property
    def dphi(self) -> Tensor:
        return self.act.df(self.H)

    @cached_property
    def d2phi(self) -> Tensor:
        return self.act.d2f(self.H)

    def _eye(self, n: int) -> Tensor:
        return eye(n, self.Y, self.Y.shape[0])

    @property
    def _ones(self) -> Tensor:
        return ones(self.Y.shape[0], self.Y)

    def ref(self, local: str) -> tuple[str, str, None]:
        return (self.name, local, None)

    @cached_property
    def input_map(self) -> TokenMap:
        """``y ↦ f(y)`` as a token-wise map: Jacobian and contracted ``∂²_yy``."""
        jac = torch.einsum("mj,tm,im->tji", self.W_2, self.dphi, self.W_1)

        def contract(g: Tensor) -> Tensor:
            curv = (g @ self.W_2.T) * self.d2phi  # g^a ⊙ φ'', (L, d_ff)
            return torch.einsum("im,tm,km->tik", self.W_1, curv, self.W_1)

        return TokenMap(jac, None if self.act.hessian_is_zero else contract)

    @cached_property
    def jacobian(self) -> dict[tuple, Factored]:
        """``∂f_t/∂θ`` for every weight and bias, factored, output size ``d``."""
        W2t_dphi = self.W_2.T.unsqueeze(0) * self.dphi.unsqueeze(1)  # (L, d, d_ff), shared
        out = {self.ref("fc1.weight"): Factored((KronTerm(LEFT, self.Y, W2t_dphi),))}
        if self.b_1 is not None:
            out[self.ref("fc1.bias")] = Factored((KronTerm(LEFT, self._ones, W2t_dphi),))
        return out | self.down_jacobian

    @cached_property
    def down_jacobian(self) -> dict[tuple, Factored]:
        """``∂f_t/∂W_2 = a_t ⊗ I`` and ``∂f_t/∂b_2 = I``, factored (``a`` the hidden units)."""
        d = self.W_2.shape[1]
        out = {self.ref("fc2.weight"): Factored((KronTerm(LEFT, self.hidden, self._eye(d)),))}
        if self.b_2 is not None:
            out[self.ref("fc2.bias")] = Factored((KronTerm(LEFT, self._ones, self._eye(d)),))
        return out

    def mixed(self, g: Tensor) -> dict[tuple, Factored]:
        """``∂²(gᵀf)/∂y ∂θ`` per token as factored terms with output index ``y_i``."""
        ga = g @ self.W_2.T  # (L, d_ff)
        d = self.Y.shape[1]
        W1_dphi = self.W_1.unsqueeze(0) * self.dphi.unsqueeze(1)  # (L, d, d_ff)
        w1_terms = (KronTerm(RIGHT, ga * self.dphi, self._eye(d)),)
        out = {}
        if not self.act.hessian_is_zero:
            W1_curv = self.W_1.unsqueeze(0) * (ga * self.d2phi).unsqueeze(1)
            w1_terms += (KronTerm(LEFT, self.Y, W1_curv),)
            if self.b_1 is not None:
                out[self.ref("fc1.bias")] = Factored((KronTerm(LEFT, self._ones, W1_curv),))
        out[self.ref("fc1.weight")] = Factored(w1_terms)
        out[self.ref("fc2.weight")] = Factored((KronTerm(RIGHT, g, W1_dphi),))
        return out

    def functional(self, g: Tensor) -> list[Diagonal]:
        """The weight–weight second derivatives of ``Σ_t g_tᵀ f_t``: diagonal in ``m``."""
        fc1 = [(self.ref("fc1.weight"), self.Y)]
        if self.b_1 is not None:
            fc1.append((self.ref("fc1.bias"), self._ones))
        w2 = self.ref("fc2.weight")
        terms = [Diagonal(r, w2, (1, 2), torch.einsum("ti,tj,tm->ijm", u, g, self.dphi)) for r, u in fc1]
        if not self.act.hessian_is_zero:
            curv = (g @ self.W_2.T) * self.d2phi
            terms += [
                Diagonal(ra, rb, (1, 3), torch.einsum("ti,tk,tm->ikm", ua, ub, curv))
                for k, (ra, ua) in enumerate(fc1)
                for rb, ub in fc1[k:]
            ]
        return terms

    def stage(self) -> Stage:
        """The branch ``y ↦ f(y)`` with its parameters, for the chain rule."""
        refs = [
            self.ref(k)
            for k, w in (("fc1.weight", 1), ("fc1.bias", self.b_1), ("fc2.weight", 1), ("fc2.bias", self.b_2))
            if w is not None
        ]
        return Stage(
            self.input_map,
            Lazy({r: (lambda r=r: self.jacobian[r]) for r in refs}),
            self.mixed,
            self.functional,
        )
