r"""An elementwise activation ``y = φ(u)``, both faces from ``φ``, ``φ'`` and ``φ''`` alone.

A subclass states ``f``, ``df`` and ``d2f`` (static methods on tensors of any shape), or sets
``hessian_is_zero`` and leaves ``d2f`` out (cf. BackPACK's ``elementwise.py``). Its name and
title are one row of :data:`hessviz.ops.activations.ACTIVATIONS`.

Dense face: the Jacobian is ``diag(φ'(u))`` and the contracted second derivative
``Q(g) = diag(g ⊙ φ''(u))``; the feed-forward fusion (:mod:`hessviz.ops.ffn`) reads ``f``,
``df``, ``d2f`` and drops every ``φ''`` term when ``hessian_is_zero``.

Node face (:class:`Elementwise` as a tape node):

.. math::
    \dot y = φ'(u) \dot u, \qquad \bar u = φ'(u) \bar y, \qquad
    \dot{\bar u} = φ'(u) \dot{\bar y} + [φ''(u)\, \bar y\, \dot u];

``φ'' ȳ`` is fixed by the primal point and kept; it is skipped when ``hessian_is_zero``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from hessviz.ops.base import Along, Maybe, Node, add


class Elementwise(Node):
    """``output = φ(input)`` for the ``φ`` of the subclass."""

    name: ClassVar[str]
    """the ``activation`` setting that selects it."""
    title: ClassVar[str]
    """how figures and config titles write it."""
    hessian_is_zero: ClassVar[bool] = False
    """``φ'' = 0`` everywhere it is defined: every second-order term vanishes and is not computed."""

    @staticmethod
    def f(u: Tensor) -> Tensor:
        """``φ(u)``."""
        raise NotImplementedError

    @staticmethod
    def df(u: Tensor) -> Tensor:
        """``φ'(u)``."""
        raise NotImplementedError

    @classmethod
    def d2f(cls, u: Tensor) -> Tensor:
        """``φ''(u)``; zeros when ``hessian_is_zero``."""
        if cls.hessian_is_zero:
            return torch.zeros_like(u)
        raise NotImplementedError

    @classmethod
    def derivatives(cls, u: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(φ(u), φ'(u), φ''(u))`` at once (``None`` for ``φ''`` when ``hessian_is_zero``); a subclass
        may share their common factors (:class:`~hessviz.ops.silu.SiLU`: one sigmoid for the three)."""
        return cls.f(u), cls.df(u), None if cls.hessian_is_zero else cls.d2f(u)

    def __init__(self, output: str, input: str, u: Tensor):
        self.output, self.inputs, self.params = output, (input,), ()
        self.u = u
        self.y = self.f(u)
        self.dphi = self.df(u)

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        return None if dx[0] is None else self.dphi * dx[0]

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        self.curv = None if self.hessian_is_zero else self.d2f(self.u) * gy  # φ''(u) ȳ
        return [self.dphi * gy], []

    def adjoint_tangent(self, a: Along) -> tuple[list[Maybe], list[Maybe]]:
        out = None if a.dgy is None else self.dphi * a.dgy
        if self.curv is not None and a.second_dx is not None:
            out = add(out, self.curv * a.second_dx)
        return [out], []
