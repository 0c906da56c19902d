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

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from torch import Tensor

from hessviz.block.placements import Step
from hessviz.block.terms import SWEEP_RULES
from hessviz.ops.base import Along, Maybe, Node, add


@dataclass(frozen=True)
class StepNodes:
    """One step of the block's recipe as it went onto the tape: the step, the tape values it read
    (``inputs``, in the step's order) and wrote (``output``), and the nodes it appended."""

    step: Step
    inputs: tuple[str, ...]
    output: str
    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class LayerSpan:
    """One block of a stack on the tape: its input and output values, its nodes
    ``nodes[start:stop]`` and, step by step of its recipe, the nodes each step appended (the
    dense engine folds over them: :func:`hessviz.dense.record.fold`)."""

    input: str
    output: str
    start: int
    stop: int
    steps: tuple[StepNodes, ...] = ()


def output_seed(loss_hvp: Callable[[Tensor], Tensor], dZ: Maybe, seed_curvature: bool) -> Maybe:
    """The reverse sweep's seed at the output, ``Z̄̇ = ∇²_Z ℓ · Ż`` (``loss_hvp(dZ)``), for a term
    that seeds the loss's curvature (:data:`hessviz.block.terms.SWEEP_RULES`); ``None`` (zero) for one
    that does not, or when ``Ż`` is zero."""
    return loss_hvp(dZ) if seed_curvature and dZ is not None else None


def collect(
    out: dict[str, Maybe],
    written: set[str],
    params: Sequence[str],
    products: Sequence[Maybe],
    dest: Sequence[Maybe] | None,
    wanted: set[str],
    alpha: float,
) -> None:
    """Add one node's parameter ``products`` of the ``wanted`` parameters into ``out``. A product
    the node wrote into its view of ``dest`` (already scaled by ``alpha``) is recorded in
    ``written``; a later term of a parameter so written is added into that view, times ``alpha``."""
    for i, (name, g) in enumerate(zip(params, products)):
        if name not in wanted or g is None:
            continue
        if dest is not None and dest[i] is not None and g.data_ptr() == dest[i].data_ptr():
            written.add(name)
        if name in written and out.get(name) is not None and out[name] is not g:
            out[name].add_(g, alpha=alpha)  # a later term, into the view
        else:
            out[name] = add(out.get(name), g)


def needs(
    node: Node,
    dgy: Maybe,
    dx: list[Maybe],
    dp: list[Maybe],
    second: bool,
    upstream: Mapping[str, set[str]],
    wanted: set[str],
) -> tuple[list[bool], list[bool]] | None:
    """Which adjoint tangents of ``node`` the reverse sweep needs, ``(need_x, need_p)``: an input's
    when a wanted parameter or input lies upstream of it (``upstream``: :meth:`Tape._closure`), a
    parameter's when it is wanted. ``None``: the node does no work, because it has no adjoint
    tangent ``dgy`` and no second-order part (``second`` off, or no tangent ``dx``, ``dp``), or
    nothing it would give is needed."""
    if dgy is None and not (second and any(t is not None for t in dx + dp)):
        return None
    need_x = [bool(upstream.get(n, set()) & wanted) for n in node.inputs]
    need_p = [p in wanted for p in node.params]
    return (need_x, need_p) if any(need_x) or any(need_p) else None


class Gradients(Mapping):
    """The parameter gradients of a :class:`Tape` as a read-only mapping (:attr:`Tape.gradients`)."""

    def __init__(self, tape: Tape):
        self.tape = tape

    def __getitem__(self, name: str) -> Tensor:
        node = self.tape._deferred.get(name)
        if node is None:
            return self.tape._small[name]
        return node.parameter_adjoint(self.tape.adjoints[node.output], node.params.index(name))

    def __iter__(self) -> Iterator[str]:
        yield from self.tape._small
        yield from (n for n in self.tape._deferred if n not in self.tape._small)

    def __len__(self) -> int:
        return len(set(self.tape._small) | set(self.tape._deferred))


@dataclass
class Tape:
    """Nodes in forward order, the primal values by name, and the first-order adjoints.

    ``seed_gradient`` is ``∇_Z ℓ (L, d)``; ``loss_hvp(Ż) = ∇²_Z ℓ · Ż`` for ``Ż (k, L, d)``.
    ``adjoints[v]`` is ``∂ℓ/∂v`` for every value ``v`` (the input ``X`` included); ``layers`` the
    blocks of a stack (one span for one block).

    The first-order sweep keeps the value adjoints (the products read them) but not the weight-sized
    gradients of a node that ``defers_params`` (a :class:`~hessviz.ops.linear.Linear`: ``xᵀ ȳ`` is
    the size of its weight, the products never read it): :attr:`gradients` computes those from the
    kept ``ȳ`` when asked, so a tape holds activation-sized state only.
    """

    nodes: list[Node]
    values: dict[str, Tensor]
    output: str
    seed_gradient: Tensor
    loss_hvp: Callable[[Tensor], Tensor]
    layers: list[LayerSpan] = field(default_factory=list)
    adjoints: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.whole = LayerSpan("X", self.output, 0, len(self.nodes))
        if not self.layers:
            self.layers = [self.whole]
        self._closures: dict[tuple[int, int, frozenset[str]], dict[str, set[str]]] = {}
        self._small: dict[str, Tensor] = {}  # the gradients of nodes that do not defer theirs
        self._deferred: dict[str, Node] = {}  # parameter -> the node whose gradient is read on demand
        bars: dict[str, Maybe] = {self.output: self.seed_gradient}
        for node in reversed(self.nodes):  # first-order reverse sweep, once
            gy = bars.pop(node.output, None)
            if gy is None:
                continue
            self.adjoints[node.output] = gy
            if node.defers_params:
                gx, gp = node.adjoint(gy, params=False)
                self._deferred |= dict.fromkeys(node.params, node)
            else:
                gx, gp = node.adjoint(gy)
            for name, g in zip(node.inputs, gx):
                bars[name] = add(bars.get(name), g)
            for name, g in zip(node.params, gp):
                if g is not None:
                    self._small[name] = g
        self.adjoints |= {name: g for name, g in bars.items() if g is not None}

    @property
    def gradients(self) -> Gradients:
        """``name -> ∂ℓ/∂θ`` of every parameter the sweep reached, read one at a time: a deferred
        node's weight gradient is computed (``xᵀ ȳ``, one GEMM) when its name is read, and not kept."""
        return Gradients(self)

    def _closure(self, span: LayerSpan, sources: frozenset[str]) -> dict[str, set[str]]:
        """value name -> the parameters and the ``sources`` (values fed from outside) it depends
        on, over the nodes of ``span`` (to skip adjoints nobody needs)."""
        key = (span.start, span.stop, sources)
        if key not in self._closures:
            deps: dict[str, set[str]] = {name: {name} for name in sources}
            for node in self.nodes[span.start : span.stop]:
                s = set(node.params)
                for name in node.inputs:
                    s |= deps.get(name, set())
                deps[node.output] = s
            self._closures[key] = deps
        return self._closures[key]

    def tangents(
        self, span: LayerSpan, dinputs: dict[str, Tensor], dparams: dict[str, Tensor]
    ) -> dict[str, Maybe]:
        """Forward tangents (JVP) of every value of ``span``'s nodes from the tangents ``dinputs``
        of the values they read from outside and ``dparams`` of the weights (``k`` leading)."""
        dvals: dict[str, Maybe] = dict(dinputs)
        for node in self.nodes[span.start : span.stop]:
            dvals[node.output] = node.tangent(
                [dvals.get(n) for n in node.inputs], [dparams.get(p) for p in node.params]
            )
        return dvals

    def adjoint_tangents(
        self,
        span: LayerSpan,
        dvals: dict[str, Maybe],
        dparams: dict[str, Tensor],
        seeds: dict[str, Maybe],
        second: bool,
        wanted: Sequence[str],
        wanted_inputs: Sequence[str] = (),
        into: dict[str, Tensor] | None = None,
        alpha: float = 1.0,
        accumulate: bool = False,
    ) -> tuple[dict[str, Maybe], dict[str, Maybe]]:
        """The tangent of the reverse sweep over ``span``: ``(θ̄̇ of wanted, x̄̇ of wanted_inputs)``.

        ``seeds`` holds the adjoint tangents of the outputs (``None`` for zero); ``second`` keeps
        the second-order parts. The first-order adjoints are the tape's (``∂ℓ/∂·`` of the loss).
        ``into`` maps parameters to ``(k, *shape)`` views that a node which ``writes_into`` may
        fill in place (the first node to produce that parameter's product only): with ``θ̄̇``, or,
        given ``alpha`` / ``accumulate``, with ``(into if accumulate else 0) + alpha θ̄̇`` (a
        batch's sequences summed into one product); the returned entry is then that view."""
        into = into or {}
        scaled = alpha != 1.0 or accumulate
        written: set[str] = set()  # products written into their `into` view (scaled if `scaled`)
        wanted_set = set(wanted) | set(wanted_inputs)
        upstream = self._closure(span, frozenset(wanted_inputs))
        dbars: dict[str, Maybe] = dict(seeds)
        out: dict[str, Maybe] = {}
        for node in reversed(self.nodes[span.start : span.stop]):
            dgy = dbars.pop(node.output, None)
            dx = [dvals.get(n) for n in node.inputs]
            dp = [dparams.get(p) for p in node.params]
            needed = needs(node, dgy, dx, dp, second, upstream, wanted_set)
            if needed is None:
                continue
            along, dest = Along(dgy, dx, dp, second, *needed), None
            if node.writes_into:
                dest = [into.get(p) if p not in out else None for p in node.params]
                scale = {"alpha": alpha, "beta": float(accumulate)} if scaled else {}
                dgx, dgp = node.adjoint_tangent(along, dest=dest, **scale)
            else:
                dgx, dgp = node.adjoint_tangent(along)
            for name, g in zip(node.inputs, dgx):
                dbars[name] = add(dbars.get(name), g)
            collect(out, written, node.params, dgp, dest, wanted_set, alpha)
        return out, {name: dbars.get(name) for name in wanted_inputs}

    def sweep(
        self,
        dparams: dict[str, Tensor],
        term: str,
        wanted: Sequence[str],
        into: dict[str, Tensor] | None = None,
        alpha: float = 1.0,
        accumulate: bool = False,
    ) -> dict[str, Maybe]:
        """``θ̄̇`` for the parameters ``wanted``, given tangents ``dparams`` (``k`` leading).

        ``dparams`` maps a parameter name to its tangent of shape ``(k, *shape)``; missing
        names have zero tangent. Returns ``name -> (k, *shape)`` (``None`` when exactly 0);
        a product may be the view of ``into`` it was written into, scaled by ``alpha`` and added
        to it when ``accumulate`` (:meth:`adjoint_tangents`).
        """
        seed_curvature, second = SWEEP_RULES[term]
        dvals = self.tangents(self.whole, {}, dparams)
        dZ = dvals[self.output]
        seed = output_seed(self.loss_hvp, dZ, seed_curvature)
        return self.adjoint_tangents(
            self.whole,
            dvals,
            dparams,
            {self.output: seed},
            second,
            wanted,
            into=into,
            alpha=alpha,
            accumulate=accumulate,
        )[0]
