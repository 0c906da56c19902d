r"""The residual sum ``y = a + b``: tangents add, adjoints copy, no second-order part."""

from __future__ import annotations

from torch import Tensor

from hessviz.matfree.tape import Maybe, Node, add


class Residual(Node):
    def __init__(self, output: str, a: str, b: str, ya: Tensor, yb: Tensor):
        self.output, self.inputs, self.params = output, (a, b), ()
        self.y = ya + yb

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        return add(dx[0], dx[1])

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        return [gy, gy], []

    def adjoint_tangent(self, dgy: Maybe, dx: list[Maybe], dp: list[Maybe], second: bool,
                        need_x: list[bool], need_p: list[bool]) -> tuple[list[Maybe], list[Maybe]]:
        return [dgy if need_x[0] else None, dgy if need_x[1] else None], []
