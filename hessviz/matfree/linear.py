r"""An affine map ``y = x W + b`` over column blocks ``W = [W_1 … W_m]``, ``b = [b_1 … b_m]``.

Several maps that read the same input (``W_Q, W_K, W_V``) are one node, so each product is
one matrix product. Shapes: ``x (L, n)``, ``W (n, m)``, ``b (m,)``; tangents carry a
leading ``k``.

.. math::
    \dot y = \dot x W + x \dot W + \dot b, \qquad
    \bar x = \bar y W^\top,\ \bar W = x^\top \bar y,\ \bar b = \textstyle\sum_t \bar y_t,

    \dot{\bar x} = \dot{\bar y} W^\top + [\bar y \dot W^\top], \quad
    \dot{\bar W} = x^\top \dot{\bar y} + [\dot x^\top \bar y], \quad
    \dot{\bar b} = \textstyle\sum_t \dot{\bar y}_t ,

with the second-order parts in brackets (the map is bilinear in ``(x, W)``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hessviz.matfree import batched as bt
from hessviz.matfree.tape import Maybe, Node


class Linear(Node):
    """``output = input @ cat(weights) + cat(biases)``; ``biases`` entries may be ``None``."""

    def __init__(self, output: str, input: str, x: Tensor, weights: list[tuple[str, Tensor]],
                 biases: list[tuple[str, Tensor] | None]):
        self.output, self.inputs = output, (input,)
        self.x = x
        self.widths = [w.shape[1] for _, w in weights]
        self.W = weights[0][1] if len(weights) == 1 else torch.cat([w for _, w in weights], dim=1)
        self.weight_names = tuple(n for n, _ in weights)
        self.bias_names = tuple(b[0] for b in biases if b is not None)
        self.bias_of = [i for i, b in enumerate(biases) if b is not None]
        self.params = self.weight_names + self.bias_names
        y = x @ self.W
        if self.bias_names:
            b = torch.cat([b[1] if b is not None else torch.zeros(w, dtype=x.dtype, device=x.device)
                           for b, w in zip(biases, self.widths)])
            y = y + b
        self.y = y

    def _join(self, parts: list[Maybe], where: list[int]) -> Maybe:
        """Concatenate per-block tangents along the last axis, zeros for missing ones."""
        if all(p is None for p in parts):
            return None
        like = next(p for p in parts if p is not None)
        full = [None] * len(self.widths)
        for i, p in zip(where, parts):
            full[i] = p
        return torch.cat([p if p is not None else like.new_zeros(*like.shape[:-1], w)
                          for p, w in zip(full, self.widths)], dim=-1) if len(full) > 1 else full[0]

    def _split(self, t: Tensor, where: list[int]) -> list[Tensor]:
        pieces = torch.split(t, self.widths, dim=-1)
        return [pieces[i] for i in where]

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        nw = len(self.weight_names)
        dW = self._join(dp[:nw], list(range(nw)))
        db = self._join(dp[nw:], self.bias_of)
        out = None if db is None else db[:, None, :].expand(-1, self.x.shape[0], -1)    # ḃ
        if dx[0] is not None:
            out = bt.tangent_times(dx[0], self.W, out)                # ẋ W
        if dW is not None:
            out = bt.primal_times(self.x, dW, out)                    # x Ẇ
        return out

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        self.gy = gy
        gW = self.x.T @ gy
        gb = gy.sum(0)
        nw = len(self.weight_names)
        return [gy @ self.W.T], self._split(gW, list(range(nw))) + self._split(gb, self.bias_of)

    def adjoint_tangent(self, dgy: Maybe, dx: list[Maybe], dp: list[Maybe], second: bool,
                        need_x: list[bool], need_p: list[bool]) -> tuple[list[Maybe], list[Maybe]]:
        nw = len(self.weight_names)
        dgx = None
        if need_x[0]:
            if dgy is not None:
                dgx = bt.tangent_times(dgy, self.W.T)                  # ȳ̇ Wᵀ
            dW = self._join(dp[:nw], list(range(nw))) if second else None
            if dW is not None:
                dgx = bt.primal_times_T(self.gy, dW, dgx)              # + ȳ Ẇᵀ
        dgp: list[Maybe] = [None] * len(self.params)
        if any(need_p[:nw]):
            dgW = None
            if dgy is not None:
                dgW = bt.primal_T_times(self.x, dgy)                   # xᵀ ȳ̇
            if second and dx[0] is not None:
                dgW = bt.tangent_T_times(dx[0], self.gy, dgW)          # + ẋᵀ ȳ
            if dgW is not None:
                dgp[:nw] = self._split(dgW, list(range(nw)))
        if any(need_p[nw:]) and dgy is not None:
            dgp[nw:] = self._split(dgy.sum(-2), self.bias_of)          # Σ_t ȳ̇_t
        return [dgx], dgp
