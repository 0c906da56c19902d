r"""The second-order adjoint sweep, written once for every block (forward-over-reverse by hand).

A block is a *tape*: a list of nodes ``y = f(x_1, …, x_m; θ_f)`` in forward order. Each
node states four rules (primal values are unbatched ``(L, n)``, everything dotted carries a
leading batch axis ``k`` for ``k`` products at once):

* ``tangent``: the forward tangent ``ẏ = Σ_i ∂_i f ẋ_i + ∂_θ f θ̇`` (JVP);
* ``adjoint``: the first-order adjoint ``x̄_i = (∂_i f)ᵀ ȳ``, ``θ̄ = (∂_θ f)ᵀ ȳ`` (VJP),
  run once at the primal point; the node keeps ``ȳ`` for the second-order terms;
* ``adjoint_tangent``: the tangent of that VJP map in the direction ``(ẋ, θ̇, ȳ̇)``,

  .. math::
      \dot{\bar x}_i = (\partial_i f)^\top \dot{\bar y}
        + \big[\textstyle\sum_j (\partial_j \partial_i f)[\dot x_j]
        + (\partial_\theta\partial_i f)[\dot\theta]\big]^\top \bar y ,

  the bracket being the *second-order* part (it is skipped for the Gauss–Newton term).

With ``v = θ̇`` the sweep returns ``θ̄̇ = H v`` where the loss node seeds
``Z̄ = ∇_Z ℓ`` (first order) and ``Z̄̇ = ∇²_Z ℓ · Ż``:

====================  ===================  ==================
term                  seed ``Z̄̇``          second-order parts
====================  ===================  ==================
``full``              ``∇²_Z ℓ · Ż``       on
``outer``  (GGN)      ``∇²_Z ℓ · Ż``       off  (``Jᵀ H_Z J v``)
``functional``        ``0``                on   (``Σ_i ∂ℓ/∂Z_i ∇²Z_i v``)
====================  ===================  ==================

A ``None`` tangent or adjoint stands for zero: nodes skip the work it would multiply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import Tensor

Maybe = Tensor | None

TERM_RULES: dict[str, tuple[bool, bool]] = {
    "full": (True, True),
    "outer": (True, False),
    "functional": (False, True),
}
"""term -> (seed ``Z̄̇`` with the loss curvature, keep the second-order parts)."""


def add(*terms: Maybe) -> Maybe:
    """Sum of the non-``None`` terms (``None`` when all are zero)."""
    out = None
    for t in terms:
        if t is not None:
            out = t if out is None else out + t
    return out


class Node:
    """One step ``y = f(inputs; params)`` of a tape (see the module docstring)."""

    inputs: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    output: str = ""
    y: Tensor

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        raise NotImplementedError

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        raise NotImplementedError

    def adjoint_tangent(self, dgy: Maybe, dx: list[Maybe], dp: list[Maybe], second: bool,
                        need_x: list[bool], need_p: list[bool]) -> tuple[list[Maybe], list[Maybe]]:
        raise NotImplementedError


@dataclass
class Tape:
    """Nodes in forward order, the primal values by name, and the first-order adjoints.

    ``seed_gradient`` is ``∇_Z ℓ (L, d)``; ``loss_hvp(Ż) = ∇²_Z ℓ · Ż`` for ``Ż (k, L, d)``.
    """

    nodes: list[Node]
    values: dict[str, Tensor]
    output: str
    seed_gradient: Tensor
    loss_hvp: Callable[[Tensor], Tensor]
    gradients: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bars: dict[str, Maybe] = {self.output: self.seed_gradient}
        for node in reversed(self.nodes):           # first-order reverse sweep, once
            gy = bars.pop(node.output, None)
            if gy is None:
                continue
            gx, gp = node.adjoint(gy)
            for name, g in zip(node.inputs, gx):
                bars[name] = add(bars.get(name), g)
            for name, g in zip(node.params, gp):
                if g is not None:
                    self.gradients[name] = g
        self._upstream = self._param_closure()

    def _param_closure(self) -> dict[str, set[str]]:
        """value name -> parameters that it depends on (to skip adjoints nobody needs)."""
        deps: dict[str, set[str]] = {}
        for node in self.nodes:
            s = set(node.params)
            for name in node.inputs:
                s |= deps.get(name, set())
            deps[node.output] = s
        return deps

    def sweep(self, dparams: dict[str, Tensor], term: str, wanted: Sequence[str]) -> dict[str, Maybe]:
        """``θ̄̇`` for the parameters ``wanted``, given tangents ``dparams`` (``k`` leading).

        ``dparams`` maps a parameter name to its tangent of shape ``(k, *shape)``; missing
        names have zero tangent. Returns ``name -> (k, *shape)`` (``None`` when exactly 0).
        """
        seed_curvature, second = TERM_RULES[term]
        wanted_set = set(wanted)
        dvals: dict[str, Maybe] = {}
        for node in self.nodes:                      # forward tangents (JVP)
            dvals[node.output] = node.tangent([dvals.get(n) for n in node.inputs],
                                              [dparams.get(p) for p in node.params])
        dZ = dvals[self.output]
        dbars: dict[str, Maybe] = {self.output: self.loss_hvp(dZ) if seed_curvature and dZ is not None
                                   else None}
        out: dict[str, Maybe] = {}
        for node in reversed(self.nodes):           # tangent of the reverse sweep
            dgy = dbars.pop(node.output, None)
            dx = [dvals.get(n) for n in node.inputs]
            dp = [dparams.get(p) for p in node.params]
            has_tangent = any(t is not None for t in dx + dp)
            if dgy is None and not (second and has_tangent):
                continue
            need_x = [bool(self._upstream.get(n, set()) & wanted_set) for n in node.inputs]
            need_p = [p in wanted_set for p in node.params]
            if not (any(need_x) or any(need_p)):
                continue
            dgx, dgp = node.adjoint_tangent(dgy, dx, dp, second, need_x, need_p)
            for name, g in zip(node.inputs, dgx):
                dbars[name] = add(dbars.get(name), g)
            for name, g in zip(node.params, dgp):
                if name in wanted_set:
                    out[name] = add(out.get(name), g)
        return out
