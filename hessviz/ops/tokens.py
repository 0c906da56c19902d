r"""The selection of some tokens, ``y = x[R]`` for the tokens ``R`` of ``x (L, n)``: the tape's way of
computing only the tokens a loss reads.

A loss whose gradient and curvature in ``Z`` vanish outside the tokens ``R`` (a classifier on
``[CLS]`` or on the last token: ``R = {0}`` or ``{L − 1}``) gives a Hessian that the other tokens do
not touch, ``H = Jᵀ N J + Σ_i g_i ∇²Z_i`` with ``g`` and ``N`` zero there. After the last layer's
attention, where every step is token-wise, the product sweep then needs the tokens ``R`` only
(:func:`hessviz.products.block.build`, ``only_read_tokens``): on MiniLM with a ``[CLS]`` head that is a
quarter
of the last layer's work instead of all of it (the projections of ``K`` and ``V`` stay whole).

Node face: a linear map, so no second-order part,

.. math::
    \dot y = \dot x_R, \qquad \bar x = S_R^\top \bar y, \qquad \dot{\bar x} = S_R^\top \dot{\bar y},

``S_R^\top`` putting the tokens back in place among zeros. There is no dense face: the dense
engines keep every token.
"""

from __future__ import annotations

from torch import Tensor

from hessviz.ops.base import Along, Maybe, Node


class Tokens(Node):
    """``output = input[tokens]`` for a 1-D index tensor ``tokens`` into the ``L`` tokens."""

    def __init__(self, output: str, input: str, x: Tensor, tokens: Tensor):
        self.output, self.inputs, self.params = output, (input,), ()
        self.tokens, self.length = tokens, x.shape[0]
        self.y = x[tokens]

    def _scatter(self, t: Tensor) -> Tensor:
        """``(…, |R|, n) -> (…, L, n)``, the tokens in place and zeros elsewhere."""
        out = t.new_zeros(*t.shape[:-2], self.length, t.shape[-1])
        out[..., self.tokens, :] = t
        return out

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        return None if dx[0] is None else dx[0][:, self.tokens]

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        return [self._scatter(gy)], []

    def adjoint_tangent(self, a: Along) -> tuple[list[Maybe], list[Maybe]]:
        return [None if a.dgy is None or not a.need_x[0] else self._scatter(a.dgy)], []
