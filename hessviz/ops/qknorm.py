r"""QK-norm (Qwen3): an RMSNorm over each head's query and key rows, one ``γ (d_k,)`` each, shared
by the heads.

On the fused projection ``[Q K V] (L, H d_k + G d_k + G d_v)`` (``G`` key/value heads):

.. math::
    \tilde q_{t,h} = γ_q ⊙ \frac{q_{t,h}}{\sqrt{\text{mean}(q_{t,h}^2) + ε}}, \qquad
    \tilde k_{t,g} = γ_k ⊙ \frac{k_{t,g}}{\sqrt{\text{mean}(k_{t,g}^2) + ε}}, \qquad
    \tilde v = v.

Each of the two is :class:`~hessviz.ops.layernorm.RMSNorm` (its rules, written once there) on the
row view ``(L·H, d_k)`` of ``Q`` (row ``t·H + h`` is head ``h`` of token ``t``), so ``γ``'s gradient
and its tangent sum over tokens and heads, as a shared ``γ`` needs; ``V`` passes through.

Node face only (:class:`QKNorm`). The dense engine reads an attention with QK-norm through these
same rules (:class:`~hessviz.ops.attention.MultiHeadAttention` in its node-rule mode).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hessviz.ops.base import Along, Maybe, Node
from hessviz.ops.layernorm import RMSNorm


class QKNorm(Node):
    """``output = [Q̃ K̃ V]`` from ``input = [Q K V]``; ``gammas``: ``(name, γ_q)``, ``(name, γ_k)``."""

    def __init__(
        self,
        output: str,
        input: str,
        qkv: Tensor,
        heads: int,
        kv_heads: int,
        d_k: int,
        d_v: int,
        eps: float,
        gammas: tuple[tuple[str, Tensor], tuple[str, Tensor]],
        where: str,
    ):
        self.output, self.inputs = output, (input,)
        self.params = (gammas[0][0], gammas[1][0])
        self.L, self.d_k = qkv.shape[0], d_k
        self.widths = (heads * d_k, kv_heads * d_k, kv_heads * d_v)
        q, k, v = torch.split(qkv, self.widths, dim=-1)
        self.norms = (
            RMSNorm("q", "Q", self._rows(q), eps, gammas[0], where=f"query of {where}"),
            RMSNorm("k", "K", self._rows(k), eps, gammas[1], where=f"key of {where}"),
        )
        self.y = torch.cat([self._cols(n.y) for n in self.norms] + [v], -1)

    def _rows(self, t: Tensor) -> Tensor:
        """``(..., L, n d_k) -> (..., L·n, d_k)``."""
        return t.reshape(*t.shape[:-2], -1, self.d_k)

    def _cols(self, t: Tensor) -> Tensor:
        """``(..., L·n, d_k) -> (..., L, n d_k)``."""
        return t.reshape(*t.shape[:-2], self.L, -1)

    def _split(self, t: Maybe) -> list[Maybe]:
        return [None] * 3 if t is None else list(torch.split(t, self.widths, dim=-1))

    def _join(self, parts: list[Maybe]) -> Maybe:
        """``cat`` of the three parts, zeros for a ``None`` among them (``None`` when all are)."""
        known = next((p for p in parts if p is not None), None)
        if known is None:
            return None
        batch = known.shape[:-2]
        return torch.cat(
            [p if p is not None else known.new_zeros(*batch, self.L, w) for p, w in zip(parts, self.widths)],
            -1,
        )

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        parts = self._split(dx[0])
        out = []
        for norm, t, dg in zip(self.norms, parts[:2], dp):
            y = norm.tangent([None if t is None else self._rows(t)], [dg])
            out.append(None if y is None else self._cols(y))
        return self._join(out + [parts[2]])

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        parts = self._split(gy)
        gx, gp = [], []
        for norm, g in zip(self.norms, parts[:2]):
            (gz,), (gg,) = norm.adjoint(self._rows(g))
            gx.append(self._cols(gz))
            gp.append(gg)
        return [torch.cat(gx + [parts[2]], -1)], gp

    def adjoint_tangent(self, a: Along) -> tuple[list[Maybe], list[Maybe]]:
        dg, t = self._split(a.dgy), self._split(a.dx[0])
        gx, gp = [], []
        for norm, g_, t_, p_, need in zip(self.norms, dg[:2], t[:2], a.dp, a.need_p):
            (gz,), (gg,) = norm.adjoint_tangent(
                Along(
                    None if g_ is None else self._rows(g_),
                    [None if t_ is None else self._rows(t_)],
                    [p_],
                    a.second,
                    a.need_x,
                    [need],
                )
            )
            gx.append(None if gz is None else self._cols(gz))
            gp.append(gg)
        return [self._join(gx + [dg[2]])], gp
