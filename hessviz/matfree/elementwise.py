r"""An elementwise activation ``y = φ(u)``, from its ``φ'`` and ``φ''`` alone.

.. math::
    \dot y = φ'(u) \dot u, \qquad \bar u = φ'(u) \bar y, \qquad
    \dot{\bar u} = φ'(u) \dot{\bar y} + [φ''(u)\, \bar y\, \dot u].

``φ'' ȳ`` is fixed by the primal point and kept; ReLU has ``φ'' = 0`` and no second-order part.
``φ``, ``φ'``, ``φ''`` come from :mod:`hessviz.components.activation`.
"""

from __future__ import annotations

from torch import Tensor

from hessviz.components import activation
from hessviz.matfree.tape import Maybe, Node, add


class Elementwise(Node):
    """``output = φ(input)``."""

    def __init__(self, output: str, input: str, u: Tensor, name: str):
        self.output, self.inputs, self.params = output, (input,), ()
        self.act = activation.get(name)
        self.y = self.act.value(u)
        self.u = u
        self.df = self.act.df(u)

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        return None if dx[0] is None else self.df * dx[0]

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        self.curv = self.act.d2f(self.u) * gy if self.act.has_curvature else None   # φ''(u) ȳ
        return [self.df * gy], []

    def adjoint_tangent(self, dgy: Maybe, dx: list[Maybe], dp: list[Maybe], second: bool,
                        need_x: list[bool], need_p: list[bool]) -> tuple[list[Maybe], list[Maybe]]:
        out = None if dgy is None else self.df * dgy
        if second and self.curv is not None and dx[0] is not None:
            out = add(out, self.curv * dx[0])
        return [out], []
