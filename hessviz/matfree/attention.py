r"""Multi-head attention core ``[Q K V] ↦ O = concat_h softmax(Q_h K_hᵀ c + M) V_h``.

The input is the fused projection ``[Q K V] (L, H d_k + H d_k + H d_v)``; per head
``S = c Q Kᵀ + M`` (``c = 1/√d_k``, ``M`` the causal mask, ``−∞`` above the diagonal),
``A = softmax_row(S)``, ``O = A V``. Everything is ``(H, L, L)`` or ``(H, L, ·)`` per
product; no ``(L, L, L)`` tensor is formed.

Softmax, with ``r = rowsum(A ⊙ Ā)``:

.. math::
    \dot A = A ⊙ (\dot S − \text{rowsum}(A ⊙ \dot S)), \qquad \bar S = A ⊙ (\bar A − r),

    \dot{\bar S} = A ⊙ (\dot{\bar A} − \text{rowsum}(A ⊙ \dot{\bar A}))
      + [\dot A ⊙ (\bar A − r) − A ⊙ \text{rowsum}(\dot A ⊙ \bar A)].

Masked entries have ``A = 0``, so every rule above is zero there: the mask needs no
rule of its own. The bilinear score and the value product:

.. math::
    \dot S = c(\dot Q K^\top + Q \dot K^\top),\quad
    \bar Q = c \bar S K,\ \bar K = c \bar S^\top Q,\quad
    \dot{\bar Q} = c(\dot{\bar S} K + [\bar S \dot K]),\
    \dot{\bar K} = c(\dot{\bar S}^\top Q + [\bar S^\top \dot Q]),

    \dot O = \dot A V + A \dot V,\quad \bar A = \bar O V^\top,\ \bar V = A^\top \bar O,\quad
    \dot{\bar A} = \dot{\bar O} V^\top + [\bar O \dot V^\top],\
    \dot{\bar V} = A^\top \dot{\bar O} + [\dot A^\top \bar O].

The factors that do not depend on the product (``cK``, ``cQ``, ``c S̄``, ``Ā − r``) are
formed once; the tangents ``(Q̇, K̇, V̇, Ȧ)`` of the forward sweep are kept for the reverse
one; the two softmax terms of ``S̄̇`` share one row sum,
``S̄̇ = A ⊙ (Ā̇ − rowsum(A ⊙ Ā̇ + Ȧ ⊙ Ā)) + Ȧ ⊙ (Ā − r)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hessviz.components import softmax
from hessviz.matfree.tape import Maybe, Node, add


def _rowsum(t: Tensor) -> Tensor:
    return t.sum(-1, keepdim=True)


def _T(t: Tensor) -> Tensor:
    return t.transpose(-1, -2)


class Attention(Node):
    """``output = O (L, H d_v)`` from ``input = [Q K V]``; ``heads``, ``d_k``, ``d_v``, ``causal``."""

    def __init__(self, output: str, input: str, qkv: Tensor, heads: int, d_k: int, d_v: int,
                 causal: bool):
        self.output, self.inputs, self.params = output, (input,), ()
        self.H, self.d_k, self.d_v = heads, d_k, d_v
        self.c = 1.0 / math.sqrt(d_k)
        self.Q, self.K, self.V = self._heads(qkv)
        self.A = softmax.value(self.c * (self.Q @ _T(self.K)), causal)   # (H, L, L)
        self.y = self._concat(self.A @ self.V)
        self.cK, self.cKT, self.cQ = self.c * self.K, self.c * _T(self.K), self.c * self.Q

    def _heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(..., L, H(2d_k + d_v)) -> 3 × (..., H, L, ·)``."""
        hk = self.H * self.d_k
        q, k, v = torch.split(qkv, (hk, hk, self.H * self.d_v), dim=-1)
        split = lambda t, w: t.unflatten(-1, (self.H, w)).transpose(-2, -3)  # noqa: E731
        return split(q, self.d_k), split(k, self.d_k), split(v, self.d_v)

    def _concat(self, o: Tensor) -> Tensor:
        """``(..., H, L, d_v) -> (..., L, H d_v)``."""
        return o.transpose(-2, -3).flatten(-2)

    def _softmax_jvp(self, dS: Tensor) -> Tensor:
        P = self.A * dS
        return P - self.A * _rowsum(P)

    def _tangents(self, dqkv: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(Q̇, K̇, V̇, Ȧ)``; kept from the forward sweep for the reverse one (same ``dqkv``)."""
        cached = getattr(self, "_cache", None)
        if cached is not None and cached[0] is dqkv:
            return cached[1]
        dQ, dK, dV = self._heads(dqkv)
        dS = dQ @ self.cKT + self.cQ @ _T(dK)                              # c(Q̇ Kᵀ + Q K̇ᵀ)
        out = dQ, dK, dV, self._softmax_jvp(dS)
        self._cache = (dqkv, out)
        return out

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        if dx[0] is None:
            return None
        _, _, dV, dA = self._tangents(dx[0])
        return self._concat(dA @ self.V + self.A @ dV)                  # Ȧ V + A V̇

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        self.gO = gy.unflatten(-1, (self.H, self.d_v)).transpose(-2, -3)  # (H, L, d_v)
        self.gA = self.gO @ _T(self.V)
        self.r = _rowsum(self.A * self.gA)
        self.gS = self.A * (self.gA - self.r)
        gQ = self.c * self.gS @ self.K
        gK = self.c * _T(self.gS) @ self.Q
        gV = _T(self.A) @ self.gO
        # v-independent factors of the second-order rules, formed once
        self.cgS, self.cgST = self.c * self.gS, self.c * _T(self.gS)
        self.gA_r = self.gA - self.r
        return [torch.cat([self._concat(gQ), self._concat(gK), self._concat(gV)], -1)], []

    def adjoint_tangent(self, dgy: Maybe, dx: list[Maybe], dp: list[Maybe], second: bool,
                        need_x: list[bool], need_p: list[bool]) -> tuple[list[Maybe], list[Maybe]]:
        second = second and dx[0] is not None
        dgA = dgV = dgS = dgQ = dgK = None
        if dgy is not None:
            dgO = dgy.unflatten(-1, (self.H, self.d_v)).transpose(-2, -3)
            dgA = dgO @ _T(self.V)                                       # Ō̇ Vᵀ
            dgV = _T(self.A) @ dgO                                       # Aᵀ Ō̇
        if second:
            dQ, dK, dV, dA = self._tangents(dx[0])
        self._cache = None                                               # the forward sweep's, done with
        if second:
            dgA = add(dgA, self.gO @ _T(dV))                             # [Ō V̇ᵀ]
            dgV = add(dgV, _T(dA) @ self.gO)                             # [Ȧᵀ Ō]
            # A ⊙ (Ā̇ − rowsum(A ⊙ Ā̇ + Ȧ ⊙ Ā)) + Ȧ ⊙ (Ā − r): the softmax rule and its tangent
            t = dA * self.gA if dgA is None else torch.addcmul(dA * self.gA, self.A, dgA)
            inner = -_rowsum(t) if dgA is None else dgA - _rowsum(t)
            dgS = torch.addcmul(dA * self.gA_r, self.A, inner)
        elif dgA is not None:
            dgS = self._softmax_jvp(dgA)
        if dgS is not None:
            dgQ = dgS @ self.cK                                          # c S̄̇ K
            dgK = _T(dgS) @ self.cQ                                      # c S̄̇ᵀ Q
        if second:
            dgQ = add(dgQ, self.cgS @ dK)                                # [c S̄ K̇]
            dgK = add(dgK, self.cgST @ dQ)                               # [c S̄ᵀ Q̇]
        parts = [dgQ, dgK, dgV]
        if all(p is None for p in parts):
            return [None], []
        like = next(p for p in parts if p is not None)
        batch = like.shape[:-3]
        L = self.A.shape[-1]
        widths = (self.d_k, self.d_k, self.d_v)
        full = [self._concat(p) if p is not None else like.new_zeros(*batch, L, self.H * w)
                for p, w in zip(parts, widths)]
        return [torch.cat(full, -1)], []
