r"""The residual sum ``y = a + b``: the identity path is linear, so it adds no second derivative.

Dense face: around a token-wise branch ``b``, ``x ↦ x + b(x)`` has the Jacobian ``I + ∂b/∂x``
and the branch's own contracted second derivative, ``Q_y(g) = Q_b(g)``.

Node face: tangents add, adjoints copy, no second-order part:

.. math::
    \dot y = \dot a + \dot b, \qquad \bar a = \bar b = \bar y, \qquad
    \dot{\bar a} = \dot{\bar b} = \dot{\bar y}.
"""

from __future__ import annotations

from torch import Tensor

from hessviz.ops.base import Along, Maybe, Node, TokenMap, add, eye


def residual(branch: TokenMap) -> TokenMap:
    """``x ↦ x + b(x)`` from the branch's derivatives."""
    return TokenMap(branch.jac + eye(branch.jac.shape[-1], branch.jac), branch.contract)


class Residual(Node):
    """``output = a + b``."""

    def __init__(self, output: str, a: str, b: str, ya: Tensor, yb: Tensor):
        self.output, self.inputs, self.params = output, (a, b), ()
        self.y = ya + yb

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        return add(dx[0], dx[1])

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        return [gy, gy], []

    def adjoint_tangent(self, a: Along) -> tuple[list[Maybe], list[Maybe]]:
        return [a.dgy if need else None for need in a.need_x], []
