r"""Multi-head self-attention, node face: the core ``[Q K V] ↦ O`` and the chain of nodes of the
whole attention (the one forward of attention; the dense face, :mod:`hessviz.ops.attention`, reads it).

Node face (:class:`AttentionCore`): the core ``[Q K V] ↦ O = concat_h softmax(Q_h K_hᵀ c + M) V_h``;
the projections around it are :class:`~hessviz.ops.linear.Linear` nodes.

The input is the fused projection ``[Q K V] (L, H d_k + G d_k + G d_v)``; inside, each key/value
head is repeated for its query heads and ``q``, ``k`` are rotated (their adjoints rotated back by
``rotᵀ`` and summed over the readers of a key/value head); per head
``S = c Q Kᵀ + M`` (``c = 1/√d_k``, or ``attn_scale``; ``M`` the causal mask, ``−∞`` above the
diagonal and, with a ``window``, also at ``s ≤ t − window``), ``A = softmax_row(S)``, ``O = A V``.
Everything is ``(H, L, L)`` or ``(H, L, ·)`` per product; no ``(L, L, L)`` tensor is formed.

Soft-capping (``MODEL.md`` part 5, :mod:`~hessviz.ops.softcap`) puts ``S = c_s·tanh(S₀/c_s)`` between
the bilinear ``S₀ = c Q Kᵀ`` and the mask; its rules sit between the score's and the softmax's below:
``Ṡ = y' Ṡ₀``, ``S̄₀ = y' S̄``, ``S̄̇₀ = y' S̄̇ + [y'' S̄ Ṡ₀]`` (then ``S̄`` in the score's rules reads
``S̄₀``).

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

from collections.abc import Callable

import torch
from torch import Tensor

from hessviz.ops import batched as bt
from hessviz.ops import score, softmax
from hessviz.ops.base import Along, Maybe, Node, add
from hessviz.ops.rotary import Rotary
from hessviz.ops.softcap import Softcap


def _rowsum(t: Tensor) -> Tensor:
    return t.sum(-1, keepdim=True)


def _T(t: Tensor) -> Tensor:
    return t.transpose(-1, -2)


def _add_(a: Maybe, b: Tensor) -> Tensor:
    """``a + b``, into ``a`` when it has the sum's shape (``a`` a fresh tensor of the caller's)."""
    if a is None:
        return b
    return a.add_(b) if a.shape == torch.broadcast_shapes(a.shape, b.shape) else a + b


class AttentionCore(Node):
    """``output = O (L, H d_v)`` from ``input = [Q K V]``; ``heads``, ``d_k``, ``d_v``, ``causal``;
    ``scale`` the factor on ``q·k`` (``None``: ``1/√d_k``), ``window`` the sliding window (with
    ``causal``), ``softcap`` the cap ``c`` on the raw scores (``S = c·tanh(S₀/c)``; :attr:`cap` holds
    its ``y``, ``y'``, ``y''``)."""

    def __init__(
        self,
        output: str,
        input: str,
        qkv: Tensor,
        heads: int,
        d_k: int,
        d_v: int,
        causal: bool,
        kv_heads: int | None = None,
        rotary: Rotary | None = None,
        *,
        scale: float | None = None,
        window: int | None = None,
        softcap: float | None = None,
    ):
        self.output, self.inputs, self.params = output, (input,), ()
        self.H, self.d_k, self.d_v = heads, d_k, d_v
        self.G = heads if kv_heads is None else kv_heads
        self.rotary = rotary
        self.c = score.factor(d_k, scale)
        self.Q, self.K, self.V = self._heads(qkv)
        S = self.c * (self.Q @ _T(self.K))
        self.cap = None if softcap is None else Softcap.at(S, softcap)
        self.A = softmax.value(S if self.cap is None else self.cap.y, causal, window)  # (H, L, L)
        self.y = self._concat(self.A @ self.V)
        self.cK, self.cKT, self.cQ = self.c * self.K, self.c * _T(self.K), self.c * self.Q

    def _heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(..., L, H d_k + G d_k + G d_v) -> 3 × (..., H, L, ·)``: each key/value head repeated for
        the query heads that read it, ``q`` and ``k`` rotated when there are rotary positions."""
        q, k, v = torch.split(qkv, (self.H * self.d_k, self.G * self.d_k, self.G * self.d_v), dim=-1)
        split = lambda t, n, w: t.unflatten(-1, (n, w)).transpose(-2, -3)  # noqa: E731
        q, k, v = split(q, self.H, self.d_k), split(k, self.G, self.d_k), split(v, self.G, self.d_v)
        if self.rotary is not None:  # the keys rotated before they are repeated (G heads, not H)
            q, k = self.rotary.apply(q), self.rotary.apply(k)
        return q, self._expand(k), self._expand(v)

    def _expand(self, t: Tensor) -> Tensor:
        """``(..., G, L, w) -> (..., H, L, w)``: query head ``h`` reads key/value head ``h // (H/G)``."""
        return t if self.G == self.H else t.repeat_interleave(self.H // self.G, dim=-3)

    def _gather(self, gQ: Maybe, gK: Maybe, gV: Maybe) -> tuple[Maybe, Maybe, Maybe]:
        """The adjoint of :meth:`_heads` on per-head gradients: ``rotᵀ`` on ``Q̄, K̄``, each key/value
        head summing the gradients of the query heads that read it; ``(..., H or G, L, ·)``."""
        if self.G != self.H:  # summed before the keys' rotation back (the same for every head)
            group = self.H // self.G
            gK, gV = (None if t is None else t.unflatten(-3, (self.G, group)).sum(-3) for t in (gK, gV))
        if self.rotary is not None:
            gQ = None if gQ is None else self.rotary.apply_T(gQ)
            gK = None if gK is None else self.rotary.apply_T(gK)
        return gQ, gK, gV

    def _concat(self, o: Tensor) -> Tensor:
        """``(..., n, L, w) -> (..., L, n w)``."""
        return o.transpose(-2, -3).flatten(-2)

    def _tangents(self, dqkv: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``(Q̇, K̇, V̇, Ȧ, Ṡ₀)``; kept from the forward sweep for the reverse one (same ``dqkv``)."""
        cached = getattr(self, "_cache", None)
        if cached is not None and cached[0] is dqkv:
            return cached[1]
        dQ, dK, dV = self._heads(dqkv)
        dS0 = _add_(dQ @ self.cKT, self.cQ @ _T(dK))  # c(Q̇ Kᵀ + Q K̇ᵀ)
        dS = dS0 if self.cap is None else self.cap.tangent(dS0)
        out = dQ, dK, dV, softmax.vjp_fused(self.A, dS), dS0
        self._cache = (dqkv, out)
        return out

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        if dx[0] is None:
            return None
        _, _, dV, dA, _ = self._tangents(dx[0])
        return self._concat(_add_(dA @ self.V, bt.primal_times_heads(self.A, dV)))  # Ȧ V + A V̇

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        self.gO = gy.unflatten(-1, (self.H, self.d_v)).transpose(-2, -3)  # (H, L, d_v)
        self.gA = self.gO @ _T(self.V)
        self.gS, self.gA_r = softmax.vjp_centered(self.A, self.gA)  # A ⊙ (Ā − r), Ā − r
        if self.cap is not None:  # S̄₀ = y' ⊙ S̄; the cap's second-order rule reads S̄
            self.gS_capped, self.gS = self.gS, self.cap.adjoint(self.gS)
        gQ = self.c * self.gS @ self.K
        gK = self.c * _T(self.gS) @ self.Q
        gV = _T(self.A) @ self.gO
        # v-independent factors of the second-order rules, formed once
        self.cgS, self.cgST = self.c * self.gS, self.c * _T(self.gS)
        return [torch.cat([self._concat(t) for t in self._gather(gQ, gK, gV)], -1)], []

    def adjoint_tangent(self, a: Along) -> tuple[list[Maybe], list[Maybe]]:
        dgy, second = a.dgy, a.second_dx is not None
        dgA = dgV = dgS = dgQ = dgK = None
        if dgy is not None:
            dgO = dgy.unflatten(-1, (self.H, self.d_v)).transpose(-2, -3)
            dgA = dgO @ _T(self.V)  # Ō̇ Vᵀ
            dgV = _T(self.A) @ dgO  # Aᵀ Ō̇
        if second:
            dQ, dK, dV, dA, dS0 = self._tangents(a.dx[0])
        self._cache = None  # the forward sweep's, done with
        if second:
            dgA = _add_(dgA, self.gO @ _T(dV))  # [Ō V̇ᵀ]
            dgV = _add_(dgV, _T(dA) @ self.gO)  # [Ȧᵀ Ō]
            # A ⊙ (Ā̇ − rowsum(A ⊙ Ā̇ + Ȧ ⊙ Ā)) + Ȧ ⊙ (Ā − r): the softmax rule and its tangent, in
            # place on fresh tensors (Ā̇ and Ȧ are this node's own and read no more)
            t = dA * self.gA
            if dgA is not None:
                t.addcmul_(self.A, dgA)
            inner = -_rowsum(t) if dgA is None else dgA.sub_(_rowsum(t))
            dgS = dA.mul_(self.gA_r).addcmul_(self.A, inner)
        elif dgA is not None:
            dgS = softmax.vjp_fused(self.A, dgA)
        if self.cap is not None and (dgS is not None or second):  # y' ⊙ S̄̇ + [y'' ⊙ S̄ ⊙ Ṡ₀]
            dgS = self.cap.adjoint_tangent(dgS, self.gS_capped, dS0 if second else None)
        if dgS is not None:
            dgQ = dgS @ self.cK  # c S̄̇ K
            dgK = _T(dgS) @ self.cQ  # c S̄̇ᵀ Q
        if second:
            dgQ = add(dgQ, bt.primal_times_heads(self.cgS, dK))  # [c S̄ K̇]
            dgK = add(dgK, bt.primal_times_heads(self.cgST, dQ))  # [c S̄ᵀ Q̇]
        parts = self._gather(dgQ, dgK, dgV)
        if all(p is None for p in parts):
            return [None], []
        like = next(p for p in parts if p is not None)
        widths = (self.H * self.d_k, self.G * self.d_k, self.G * self.d_v)
        out = like.new_empty(*like.shape[:-3], self.A.shape[-1], sum(widths))
        for p, view in zip(parts, out.split(widths, -1)):  # each head-major part into its columns
            if p is None:
                view.zero_()
            else:
                view.unflatten(-1, (p.shape[-3], p.shape[-1])).transpose(-2, -3).copy_(p)
        return [out], []


LinearMaker = Callable[[str, str, Tensor, list[str], list[str]], Node]
"""``(output, input, x, weights, biases) -> `` the node ``x W + b`` (weights, biases: local names)."""


def chain(
    x: str,
    X: Tensor,
    linear: LinearMaker,
    heads: int,
    kv_heads: int,
    d_k: int,
    d_v: int,
    causal: bool,
    rotary: Rotary | None,
    norm: Callable[[str, Tensor], Node] | None = None,
    out_proj: bool = True,
    names: tuple[str, str, str, str] = ("QKV", "QKVn", "O", "SA"),
    cut: Callable[[Node], Node] | None = None,
    *,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> list[Node]:
    """The attention on the value ``x`` (``X (L, d)``) as nodes, in forward order: the fused projection
    ``x [W_Q W_K W_V] + [b_Q b_K b_V]``, QK-norm (``norm(output, input)`` on the projection, when given),
    the core and, when ``out_proj``, the output projection ``O W_O + b_O``. The one writing of the
    attention's forward: the tape (:mod:`hessviz.products.block`) and the dense face
    (:class:`~hessviz.ops.attention.MultiHeadAttention`) both run it.

    ``linear`` makes a projection from local names (``query.weight`` …; the tape maps them to its own,
    the dense face reads its weight table); ``names``: the values of the projection, the QK-norm, the
    core and the output; ``cut``: a node appended after the core, read by the output projection (the
    tape's :class:`~hessviz.ops.tokens.Tokens`); ``scale``, ``window``, ``softcap``: the core's
    (``MODEL.md`` part 5)."""
    kinds = ("query", "key", "value")
    nodes = [linear(names[0], x, X, [f"{k}.weight" for k in kinds], [f"{k}.bias" for k in kinds])]
    if norm is not None:
        nodes.append(norm(names[1], nodes[-1]))
    scores = {"scale": scale, "window": window, "softcap": softcap}
    nodes.append(
        AttentionCore(
            names[2], nodes[-1].output, nodes[-1].y, heads, d_k, d_v, causal, kv_heads, rotary, **scores
        )
    )
    if cut is not None:
        nodes.append(cut(nodes[-1]))
    if out_proj:
        nodes.append(linear(names[3], nodes[-1].output, nodes[-1].y, ["out.weight"], ["out.bias"]))
    return nodes
