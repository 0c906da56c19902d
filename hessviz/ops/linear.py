r"""An affine map ``y = x W + b`` over column blocks ``W = [W_1 … W_m]``, ``b = [b_1 … b_m]``.

Several maps that read the same input (``W_Q, W_K, W_V``) are one node: the products with
the primal ``W`` (``ẋ W``, ``ȳ̇ Wᵀ``) are one matrix product each. The weight tangents
``Ẇ_i`` are never concatenated (that would copy them): each adds its own product into the
column block ``i`` in place, and ``Ẇ̄_i = xᵀ ȳ̇_i + ẋᵀ ȳ_i = [x; ẋ]ᵀ [ȳ̇_i; ȳ_i]`` is one
matrix product over ``2L`` stacked rows, written once. Shapes: ``x (L, n)``, ``W (n, m)``,
``b (m,)``; tangents carry a leading ``k``.

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

from hessviz.ops import batched as bt
from hessviz.ops.base import Along, Maybe, Node


class Linear(Node):
    """``output = input @ cat(weights) + cat(biases)``; ``biases`` entries may be ``None``."""

    writes_into = True
    defers_params = True

    def __init__(
        self,
        output: str,
        input: str,
        x: Tensor,
        weights: list[tuple[str, Tensor]],
        biases: list[tuple[str, Tensor] | None],
        W: Tensor | None = None,
    ):
        """``W``: the weights already concatenated (shared by the tapes of a batch's sequences);
        by default ``cat(weights)`` (a copy when there are several)."""
        self.output, self.inputs = output, (input,)
        self.x = x
        self.widths = [w.shape[1] for _, w in weights]
        edges = [0] + torch.tensor(self.widths).cumsum(0).tolist()
        self.cols = [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]
        """the column block of each weight in ``W`` and ``y``."""
        self.blocks = [w for _, w in weights]
        if W is None and len(weights) == 1:
            W = weights[0][1]
        elif W is None and x.device.type != "cpu":
            W = torch.cat(self.blocks, dim=1)
        self.W = W
        """the weights concatenated, or ``None`` on the CPU: there each block is its own GEMM
        (:meth:`times_W`, :meth:`times_WT`), the same arithmetic without copying the weights at every
        build (a third of a SmolLM2 tape's set-up, issue 47); a GPU keeps one launch."""
        self.weight_names = tuple(n for n, _ in weights)
        self.bias_names = tuple(b[0] for b in biases if b is not None)
        self.bias_of = [i for i, b in enumerate(biases) if b is not None]
        self.params = self.weight_names + self.bias_names
        y = self.times_W(x)
        if self.bias_names:
            b = torch.cat(
                [
                    b[1] if b is not None else torch.zeros(w, dtype=x.dtype, device=x.device)
                    for b, w in zip(biases, self.widths)
                ]
            )
            y = y + b
        self.y = y

    def times_W(self, a: Tensor) -> Tensor:
        """``a W``: ``(…, n) -> (…, m)``, one GEMM per weight block into its columns when unfused."""
        rows = a.reshape(-1, a.shape[-1])
        out = rows.new_empty(rows.shape[0], sum(self.widths))
        if self.W is not None:
            bt.rows_times(rows, self.W, out)
        else:
            for w, c in zip(self.blocks, self.cols):
                bt.rows_times(rows, w, out[:, c])  # into its columns (unit stride: no copy)
        return out.reshape(*a.shape[:-1], out.shape[1])

    def times_WT(self, a: Tensor) -> Tensor:
        """``a Wᵀ``: ``(…, m) -> (…, n)``, the blocks' GEMMs accumulated when unfused."""
        if self.W is not None:
            return a @ self.W.T
        rows = a.reshape(-1, a.shape[-1])
        out = rows[:, self.cols[0]] @ self.blocks[0].T
        for w, c in zip(self.blocks[1:], self.cols[1:]):
            out.addmm_(rows[:, c], w.T)
        return out.reshape(*a.shape[:-1], out.shape[1])

    def stacked(self, nodes: list[Linear], adjoints: bool) -> Linear:
        """The same map on the rows of ``nodes`` stacked (the same node of ``B`` sequences' tapes:
        :mod:`hessviz.products.lockstep`): ``x`` is ``(B L, n)``, and with ``adjoints`` ``ȳ`` too.
        Its :meth:`tangent` and :meth:`adjoint_tangent` on stacked tangents are those of the
        ``B`` nodes, with the weights' products summed over the sequences in one GEMM."""
        if len(nodes) == 1:
            return nodes[0]
        out = object.__new__(Linear)
        out.__dict__ |= {k: v for k, v in self.__dict__.items() if k not in ("x", "y", "gy")}
        out.x = torch.cat([n.x for n in nodes])
        if adjoints:
            out.gy = torch.cat([n.gy for n in nodes])
        return out

    def _split(self, t: Tensor, where: list[int]) -> list[Tensor]:
        pieces = torch.split(t, self.widths, dim=-1)
        return [pieces[i] for i in where]

    def _batch(self, *tangents: Maybe) -> int | None:
        """``k``, the leading size of the first tangent given (``None`` when all are zero)."""
        return next((t.shape[0] for t in tangents if t is not None), None)

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        nw = len(self.weight_names)
        k = self._batch(dx[0], *dp)
        if k is None:
            return None
        out = (
            self.times_W(dx[0])
            if dx[0] is not None
            else self.x.new_zeros(k, self.x.shape[0], sum(self.widths))
        )  # ẋ W
        for i, db in zip(self.bias_of, dp[nw:]):
            if db is not None:
                out[..., self.cols[i]] += db[:, None, :]  # + ḃ_i
        for i, dW in enumerate(dp[:nw]):
            if dW is not None:
                bt.add_primal_times_(out[..., self.cols[i]], self.x, dW)  # + x Ẇ_i
        return out

    def adjoint(self, gy: Tensor, params: bool = True) -> tuple[list[Maybe], list[Maybe]]:
        """``([ȳ Wᵀ], [xᵀ ȳ_i …, Σ_t ȳ_t …])``; ``params=False``: the parameter adjoints are
        ``None`` (:meth:`parameter_adjoint` gives them when asked)."""
        self.gy = gy
        if not params:
            return [self.times_WT(gy)], [None] * len(self.params)
        gW, gb = self.x.T @ gy, gy.sum(0)
        nw = len(self.weight_names)
        return [self.times_WT(gy)], self._split(gW, list(range(nw))) + self._split(gb, self.bias_of)

    def parameter_adjoint(self, gy: Tensor, i: int) -> Tensor:
        """Parameter ``i``'s adjoint alone: ``xᵀ ȳ_i`` for a weight, ``Σ_t ȳ_t`` over its columns
        for a bias."""
        nw = len(self.weight_names)
        if i < nw:
            return self.x.T @ gy[:, self.cols[i]]
        return gy[:, self.cols[self.bias_of[i - nw]]].sum(0)

    def adjoint_tangent(
        self,
        a: Along,
        dest: list[Maybe] | None = None,
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> tuple[list[Maybe], list[Maybe]]:
        """The weights' products go into ``dest`` (when given) as ``beta dest + alpha Ẇ̄`` (the
        defaults: ``Ẇ̄``); a product without a destination is ``Ẇ̄``, unscaled."""
        dgy, need_p = a.dgy, a.need_p
        nw = len(self.weight_names)
        dest = dest or [None] * len(self.params)
        dW = a.dp[:nw] if a.second else [None] * nw
        dx0 = a.second_dx
        k = self._batch(dgy, dx0, *dW)
        if k is None:
            return [None], [None] * len(self.params)
        dgx = None
        if a.need_x[0] and (dgy is not None or any(w is not None for w in dW)):
            dgx = (
                self.times_WT(dgy)
                if dgy is not None
                else self.x.new_zeros(k, self.x.shape[0], self.x.shape[1])
            )  # ȳ̇ Wᵀ
            for i, w in enumerate(dW):
                if w is not None:
                    bt.add_primal_times_T_(dgx, self.gy[:, self.cols[i]], w)  # + ȳ_i Ẇ_iᵀ
        dgp: list[Maybe] = [None] * len(self.params)
        for i in range(nw):
            if need_p[i] and (dgy is not None or dx0 is not None):  # xᵀ ȳ̇_i + ẋᵀ ȳ_i
                cols = self.cols[i]
                into = dest[i] is not None
                dgp[i] = bt.stacked_T_times(
                    [self.x, dx0],
                    [None if dgy is None else dgy[..., cols], self.gy[:, cols]],
                    k,
                    dest[i] if into else self.x.new_empty(k, self.x.shape[1], self.widths[i]),
                    alpha if into else 1.0,
                    beta if into else 0.0,
                )
        for j, i in enumerate(self.bias_of):
            if need_p[nw + j] and dgy is not None:
                dgp[nw + j] = dgy[..., self.cols[i]].sum(-2)  # Σ_t ȳ̇_t
        return [dgx], dgp
