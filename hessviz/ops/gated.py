r"""The gated feed-forward branch ``f(y) = (φ(y W_G + b_G) ⊙ (y W_1 + b_1)) W_2 + b_2`` (SwiGLU with
``φ = silu``, GeGLU with ``gelu_tanh``; Llama's ``gate_proj``, ``up_proj``, ``down_proj``): both faces.

Local parameter names: ``gate.weight`` (``W_G``), ``gate.bias`` (``b_G``), ``fc1.weight`` (``W_1``),
``fc1.bias``, ``fc2.weight`` (``W_2``), ``fc2.bias``; the biases are optional. Per token ``y ∈ R^d``,
with ``u = y W_G + b_G`` (the gate), ``h = y W_1 + b_1`` (the up projection), ``p = φ(u)``,
``ψ = φ'(u)``, ``ψ₂ = φ''(u)``, ``a = p ⊙ h`` and an upstream gradient ``g ∈ R^d`` at ``f``, write
``c = W_2 g`` (the gradient at ``a``). Then

.. math::
    \frac{∂f}{∂y} = W_2^\top \big(\operatorname{diag}(ψ ⊙ h) W_G^\top + \operatorname{diag}(p) W_1^\top\big),
    \quad \frac{∂f_j}{∂W_G[i,m]} = y_i ψ_m h_m W_2[m,j], \quad
    \frac{∂f_j}{∂W_1[i,m]} = y_i p_m W_2[m,j], \quad \frac{∂f_j}{∂W_2[m,j']} = a_m δ_{jj'};

second derivatives of ``gᵀf`` (every one diagonal in the hidden unit ``m``; ``h`` is linear in
everything, so there is no ``(W_1, W_1)`` term):

.. math::
    ∂^2_{yy} = W_G \operatorname{diag}(c ψ₂ h) W_G^\top + W_G \operatorname{diag}(c ψ) W_1^\top
               + W_1 \operatorname{diag}(c ψ) W_G^\top,

    ∂^2_{y_i, W_G[i',m]} = δ_{ii'} c_m ψ_m h_m + y_{i'} (W_G[i,m] c_m ψ₂_m h_m + W_1[i,m] c_m ψ_m),
    \quad ∂^2_{y_i, W_1[i',m]} = δ_{ii'} c_m p_m + y_{i'} W_G[i,m] c_m ψ_m,

    ∂^2_{y_i, W_2[m,j']} = (∂a_m/∂y_i)\, g_{j'}, \quad
    ∂^2_{W_G[i,m], W_G[i',m']} = δ_{mm'} y_i y_{i'} c_m ψ₂_m h_m, \quad
    ∂^2_{W_G[i,m], W_1[i',m']} = δ_{mm'} y_i y_{i'} c_m ψ_m,

    ∂^2_{W_G[i,m], W_2[m',j']} = δ_{mm'} y_i ψ_m h_m g_{j'}, \quad
    ∂^2_{W_1[i,m], W_2[m',j']} = δ_{mm'} y_i p_m g_{j'},

and the same with ``y_i`` replaced by ``1`` for ``b_G``, ``b_1``; ``b_2`` enters linearly. With ReLU
(``ψ₂ = 0``) every ``ψ₂`` term is dropped, but the gate–up terms stay: the product is bilinear.

Dense face: :class:`GatedFeedForward`, the fused branch for the chain rule (the plain
:class:`~hessviz.ops.ffn.FeedForward` with the gate added). Node face: the projections are one
:class:`~hessviz.ops.linear.Linear` ``y [W_G W_1] + [b_G b_1]``, the down projection another, and
:class:`GatedUnit` is the product between them, ``[u h] ↦ φ(u) ⊙ h``:

.. math::
    \dot a = ψ \dot u ⊙ h + p ⊙ \dot h, \qquad \bar u = ψ h \bar a, \quad \bar h = p \bar a,

    \dot{\bar u} = ψ h \dot{\bar a} + [\bar a ⊙ (ψ \dot h + ψ₂ h \dot u)], \qquad
    \dot{\bar h} = p \dot{\bar a} + [\bar a ⊙ ψ \dot u].
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from hessviz.ops.base import Along, Lazy, Maybe, Node, Stage, TokenMap
from hessviz.ops.contributions import Diagonal
from hessviz.ops.elementwise import Elementwise
from hessviz.ops.ffn import FeedForward
from hessviz.ops.kron import LEFT, RIGHT, Factored, KronTerm


@dataclass(frozen=True)
class GatedFeedForward(FeedForward):
    """Forward values of the gated branch for all tokens: ``Y (L, d)`` -> ``output (L, d)``; ``W_G``
    and ``b_G`` are the gate's (``W_1, b_1`` the up projection, ``W_2, b_2`` the down one)."""

    W_G: Tensor | None = None
    b_G: Tensor | None = None

    @cached_property
    def U(self) -> Tensor:
        """``u = Y W_G + b_G``, ``(L, d_ff)``."""
        U = self.Y @ self.W_G
        return U if self.b_G is None else U + self.b_G

    @cached_property
    def gate(self) -> Tensor:
        """``p = φ(u)``."""
        return self.act.f(self.U)

    @cached_property
    def psi(self) -> Tensor:
        """``ψ = φ'(u)``."""
        return self.act.df(self.U)

    @cached_property
    def psi_h(self) -> Tensor:
        """``ψ ⊙ h``: how ``a`` moves with ``u``."""
        return self.psi * self.H

    @cached_property
    def hidden(self) -> Tensor:
        """``a = φ(u) ⊙ h``, ``(L, d_ff)``."""
        return self.gate * self.H

    def _curv(self, c: Tensor) -> Tensor | None:
        """``c ⊙ ψ₂ ⊙ h`` (``None`` when ``φ'' = 0``)."""
        return None if self.act.hessian_is_zero else c * self.act.d2f(self.U) * self.H

    def _sides(self) -> tuple[list, list]:
        """``[(ref, vector)]`` of the gate's and of the up projection's weights: ``Y`` for a matrix,
        ones for a bias."""
        gate = [(self.ref("gate.weight"), self.Y)] + (
            [(self.ref("gate.bias"), self._ones)] if self.b_G is not None else []
        )
        up = [(self.ref("fc1.weight"), self.Y)] + (
            [(self.ref("fc1.bias"), self._ones)] if self.b_1 is not None else []
        )
        return gate, up

    @cached_property
    def da_dy(self) -> Tensor:
        """``(∂a/∂y)ᵀ`` per token, ``[t, i, m] = W_G[i,m] ψ_m h_m + W_1[i,m] p_m``, ``(L, d, d_ff)``."""
        return torch.addcmul(
            self.W_G.unsqueeze(0) * self.psi_h.unsqueeze(1), self.W_1.unsqueeze(0), self.gate.unsqueeze(1)
        )

    @cached_property
    def input_map(self) -> TokenMap:
        """``y ↦ f(y)``: Jacobian ``W_2ᵀ (∂a/∂y)`` and the contracted ``∂²_yy`` above."""
        jac = torch.einsum("mj,tim->tji", self.W_2, self.da_dy)

        def contract(g: Tensor) -> Tensor:
            c = g @ self.W_2.T
            cross = torch.einsum("im,tm,km->tik", self.W_G, c * self.psi, self.W_1)
            out = cross + cross.transpose(-1, -2)
            curv = self._curv(c)
            if curv is not None:
                out = out + torch.einsum("im,tm,km->tik", self.W_G, curv, self.W_G)
            return out

        return TokenMap(jac, contract)

    @cached_property
    def jacobian(self) -> dict[tuple, Factored]:
        """``∂f_t/∂θ`` for every weight and bias, factored, output size ``d``."""
        W2t = self.W_2.T.unsqueeze(0)
        by_gate, by_up = W2t * self.psi_h.unsqueeze(1), W2t * self.gate.unsqueeze(1)  # (L, d, d_ff)
        gate, up = self._sides()
        out = {r: Factored((KronTerm(LEFT, u, by_gate),)) for r, u in gate}
        out |= {r: Factored((KronTerm(LEFT, u, by_up),)) for r, u in up}
        return out | self.down_jacobian

    def mixed(self, g: Tensor) -> dict[tuple, Factored]:
        """``∂²(gᵀf)/∂y ∂θ`` per token as factored terms with output index ``y_i``."""
        c = g @ self.W_2.T
        eye_d = self._eye(self.Y.shape[1])
        curv = self._curv(c)
        at_gate = self.W_1.unsqueeze(0) * (c * self.psi).unsqueeze(1)  # W_1[i,m] c ψ
        if curv is not None:
            at_gate = at_gate + self.W_G.unsqueeze(0) * curv.unsqueeze(1)  # + W_G[i,m] c ψ₂ h
        at_up = self.W_G.unsqueeze(0) * (c * self.psi).unsqueeze(1)  # W_G[i,m] c ψ
        gate, up = self._sides()
        out = {}
        for r, u in gate:
            terms = (KronTerm(LEFT, u, at_gate),)
            out[r] = Factored(((KronTerm(RIGHT, c * self.psi_h, eye_d),) if u is self.Y else ()) + terms)
        for r, u in up:
            terms = (KronTerm(LEFT, u, at_up),)
            out[r] = Factored(((KronTerm(RIGHT, c * self.gate, eye_d),) if u is self.Y else ()) + terms)
        out[self.ref("fc2.weight")] = Factored((KronTerm(RIGHT, g, self.da_dy),))
        return out

    def functional(self, g: Tensor) -> list[Diagonal]:
        """The weight–weight second derivatives of ``Σ_t g_tᵀ f_t``: diagonal in ``m``."""
        c = g @ self.W_2.T
        gate, up = self._sides()
        w2 = self.ref("fc2.weight")
        terms = [Diagonal(r, w2, (1, 2), torch.einsum("ti,tj,tm->ijm", u, g, self.psi_h)) for r, u in gate]
        terms += [Diagonal(r, w2, (1, 2), torch.einsum("ti,tj,tm->ijm", u, g, self.gate)) for r, u in up]
        cpsi = c * self.psi
        terms += [
            Diagonal(ra, rb, (1, 3), torch.einsum("ti,tk,tm->ikm", ua, ub, cpsi))
            for ra, ua in gate
            for rb, ub in up
        ]
        curv = self._curv(c)
        if curv is not None:
            terms += [
                Diagonal(ra, rb, (1, 3), torch.einsum("ti,tk,tm->ikm", ua, ub, curv))
                for k, (ra, ua) in enumerate(gate)
                for rb, ub in gate[k:]
            ]
        return terms

    def stage(self) -> Stage:
        """The branch ``y ↦ f(y)`` with its parameters, for the chain rule."""
        gate, up = self._sides()
        refs = [r for r, _ in gate + up] + list(self.down_jacobian)
        return Stage(
            self.input_map,
            Lazy({r: (lambda r=r: self.jacobian[r]) for r in refs}),
            self.mixed,
            self.functional,
        )


class GatedUnit(Node):
    """``output = φ(u) ⊙ h`` from ``input = [u h] (L, 2 d_ff)`` (node face), ``φ`` an
    :class:`~hessviz.ops.elementwise.Elementwise`."""

    def __init__(self, output: str, input: str, uh: Tensor, act: type[Elementwise]):
        self.output, self.inputs, self.params = output, (input,), ()
        u, self.h = uh.chunk(2, dim=-1)
        self.p, self.psi, psi2 = act.derivatives(u)
        self.psi_h = self.psi * self.h
        self.psi2_h = None if psi2 is None else psi2.mul_(self.h)
        self.y = self.p * self.h

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        if dx[0] is None:
            return None
        du, dh = dx[0].chunk(2, dim=-1)
        return torch.mul(self.psi_h, du).addcmul_(self.p, dh)

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        self.gy = gy
        # v-independent factors of the second-order rules, formed once
        self.gpsi = gy * self.psi
        self.gpsi2_h = None if self.psi2_h is None else gy * self.psi2_h
        return [torch.cat([self.psi_h * gy, self.p * gy], dim=-1)], []

    def adjoint_tangent(self, a: Along) -> tuple[list[Maybe], list[Maybe]]:
        """Both halves written into one ``(k, L, 2 d_ff)`` output:
        ``ū̇ = ψh ȳ̇ + [ȳψ ḣ + ȳψ'h u̇]``, ``h̄̇ = φ ȳ̇ + [ȳψ u̇]``."""
        dgy, dx = a.dgy, a.second_dx
        if dgy is None and dx is None:
            return [None], []
        like = dgy if dgy is not None else dx
        out = like.new_empty(*like.shape[:-1], 2 * self.p.shape[-1])
        dgu, dgh = out.chunk(2, dim=-1)
        if dgy is not None:
            torch.mul(self.psi_h, dgy, out=dgu)
            torch.mul(self.p, dgy, out=dgh)
        else:
            out.zero_()
        if dx is not None:
            du, dh = dx.chunk(2, dim=-1)
            dgu.addcmul_(self.gpsi, dh)
            if self.gpsi2_h is not None:
                dgu.addcmul_(self.gpsi2_h, du)
            dgh.addcmul_(self.gpsi, du)
        return [out], []
