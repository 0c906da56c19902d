r"""An elementwise activation ``y = φ(u)``, from its ``φ'`` and ``φ''`` alone.

.. math::
    \dot y = φ'(u) \dot u, \qquad \bar u = φ'(u) \bar y, \qquad
    \dot{\bar u} = φ'(u) \dot{\bar y} + [φ''(u)\, \bar y\, \dot u].

``φ'' ȳ`` is fixed by the primal point and kept; ReLU has ``φ'' = 0`` and no second-order part.
``gelu_tanh`` (GPT-2's) is stated here when :mod:`hessviz.components.activation` lacks it:
``φ = ½u(1 + tanh s)``, ``s = c(u + a u³)``, ``c = √(2/π)``, ``a = 0.044715``,
``φ' = ½(1 + t) + ½u(1 − t²)s'``, ``φ'' = (1 − t²)(s' − u t s'² + ½u s'')``, ``t = tanh s``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hessviz.components import activation as stock
from hessviz.matfree.tape import Maybe, Node, add

_C, _A = math.sqrt(2.0 / math.pi), 0.044715


def _gelu_tanh_parts(u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    s1 = _C * (1.0 + 3.0 * _A * u * u)
    t = torch.tanh(_C * (u + _A * u ** 3))
    return t, s1, _C * 6.0 * _A * u


GELU_TANH = stock.Activation(
    name="gelu_tanh",
    value=lambda u: 0.5 * u * (1.0 + torch.tanh(_C * (u + _A * u ** 3))),
    df=lambda u: (lambda t, s1, s2: 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * s1)(*_gelu_tanh_parts(u)),
    d2f=lambda u: (lambda t, s1, s2: (1 - t * t) * (s1 - u * t * s1 * s1 + 0.5 * u * s2))(
        *_gelu_tanh_parts(u)),
    has_curvature=True,
)


def get(name: str) -> stock.Activation:
    """The activation ``name`` from the components, or ``gelu_tanh`` above."""
    table = getattr(stock, "ACTIVATIONS", {})
    return table[name] if name in table else {"gelu_tanh": GELU_TANH}[name]


class Elementwise(Node):
    """``output = φ(input)``."""

    def __init__(self, output: str, input: str, u: Tensor, name: str):
        self.output, self.inputs, self.params = output, (input,), ()
        self.act = get(name)
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
