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
from typing import cast

import torch
from torch import Tensor

from hessviz.block.placements import Step
from hessviz.block.terms import SWEEP_RULES
from hessviz.ops.base import Along, Maybe, Node, add
from hessviz.ops.linear import Linear


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
        view = None if dest is None else dest[i]
        if view is not None and g.data_ptr() == view.data_ptr():
            written.add(name)
        before = out.get(name)
        if name in written and before is not None and before is not g:
            before.add_(g, alpha=alpha)  # a later term, into the view
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
        g = node.parameter_adjoint(self.tape.adjoints[node.output], node.params.index(name))
        assert g is not None  # a deferred node's weights have a gradient
        return g

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
                gx, gp = node.adjoint(gy, params=False)  # type: ignore[call-arg]  # a deferring node's own face
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
        of the values they read from outside and ``dparams`` of the weights (``k`` leading):
        :func:`tangents` of this one tape."""
        return tangents([self.nodes[span.start : span.stop]], [dinputs], dparams)[0]


# ----------------------------------------------------------------------------- the one sweep loop
# Written once over ``B ≥ 1`` tapes of the same nodes ("lanes": the sequences of a batch, side by
# side). One tape is ``B = 1``; :mod:`hessviz.products.lockstep` and :mod:`hessviz.products.checkpoint`
# call these with several.


def _cat(pieces: list[Maybe]) -> Maybe:
    """``B`` tangents ``(k, L, n)`` as ``(k, B L, n)`` (``None`` when they are zero; one: itself)."""
    if pieces[0] is None or len(pieces) == 1:
        return pieces[0]
    return torch.cat([p for p in pieces if p is not None], dim=1)


def _split(t: Maybe, B: int) -> list[Maybe]:
    """``(k, B L, n) -> B`` views ``(k, L, n)`` (one: itself)."""
    if t is None:
        return [None] * B
    return [t] if B == 1 else list(t.chunk(B, dim=1))


def _linear(nodes: Sequence[Sequence[Node]], i: int) -> list[Linear]:
    """Node ``i`` of every lane, a linear map in each (the lanes have the same nodes)."""
    out: list[Linear] = []
    for lane in nodes:
        node = lane[i]
        assert isinstance(node, Linear)
        out.append(node)
    return out


def tangents(
    nodes: Sequence[Sequence[Node]],
    dinputs: Sequence[Mapping[str, Maybe]],
    dparams: Mapping[str, Tensor],
) -> list[dict[str, Maybe]]:
    """Forward tangents of every value of ``B`` lanes' nodes, ``nodes[β]`` those of lane ``β`` (the
    same nodes across ``β``, their values differ), from the tangents ``dinputs[β]`` of the values
    they read from outside and the weights' shared ``dparams (k, *shape)``. A node that
    is a linear map (token-wise) runs once on the ``B·L`` stacked rows
    (:meth:`~hessviz.ops.linear.Linear.stacked`; itself for one lane); every other node per lane."""
    B = len(nodes)
    dvals: list[dict[str, Maybe]] = [dict(d) for d in dinputs]
    for i, node in enumerate(nodes[0]):
        dp = [dparams.get(p) for p in node.params]
        if B == 1:  # one tape: each node as it is
            d = dvals[0]
            d[node.output] = node.tangent([d.get(x) for x in node.inputs], dp)
        elif node.writes_into:
            dx = _cat([d.get(node.inputs[0]) for d in dvals])
            y = cast(Linear, node).stacked(_linear(nodes, i), adjoints=False).tangent([dx], dp)
            for d, piece in zip(dvals, _split(y, B)):
                d[node.output] = piece
        else:
            for n, d in zip(nodes, dvals):
                d[node.output] = n[i].tangent([d.get(x) for x in node.inputs], dp)
    return dvals


def adjoint_tangents(
    tapes: Sequence[Tape],
    span: LayerSpan,
    dvals: Sequence[Mapping[str, Maybe]],
    dparams: Mapping[str, Tensor],
    seeds: Sequence[Mapping[str, Maybe]],
    second: bool,
    wanted: Sequence[str],
    wanted_inputs: Sequence[str] = (),
    into: Mapping[str, Tensor] | None = None,
    alpha: float = 1.0,
    accumulate: bool = False,
) -> tuple[dict[str, Maybe], list[dict[str, Maybe]]]:
    """The tangent of the reverse sweep over ``span`` of ``B`` tapes of the same nodes:
    ``(Σ_β θ̄̇_β of wanted, per tape x̄̇ of wanted_inputs)``.

    ``seeds[β]`` holds tape ``β``'s adjoint tangents of its outputs (``None`` for zero); ``second``
    keeps the second-order parts. The first-order adjoints are the tapes' (``∂ℓ/∂·`` of the loss).
    ``into`` maps parameters to ``(k, *shape)`` views that a node which ``writes_into`` may fill in
    place (the first node to produce that parameter's product only): a linear map, run once on the
    lanes' stacked
    rows: with ``Σ_β θ̄̇_β``, or, given ``alpha`` / ``accumulate``, with
    ``(into if accumulate else 0) + alpha Σ_β θ̄̇_β``; the returned entry is then that view. Every
    other entry is the unscaled sum (:meth:`~hessviz.products.layout.Layout.gather` scales it).
    Every other node runs per lane and its parameter products are summed over the lanes."""
    B, first = len(tapes), tapes[0]
    nodes = [t.nodes for t in tapes]
    into = into or {}
    scale = {"alpha": alpha, "beta": float(accumulate)} if alpha != 1.0 or accumulate else {}
    written: set[str] = set()  # products written into their `into` view (scaled if `scale`)
    wanted_set = set(wanted) | set(wanted_inputs)
    upstream = first._closure(span, frozenset(wanted_inputs))
    dbars = [dict(s) for s in seeds]
    out: dict[str, Maybe] = {}
    for i in reversed(range(span.start, span.stop)):
        node = first.nodes[i]
        dgys = [db.pop(node.output, None) for db in dbars]
        dp = [dparams.get(p) for p in node.params]
        dxs = [[d.get(x) for x in node.inputs] for d in dvals]
        needed = needs(node, dgys[0], dxs[0], dp, second, upstream, wanted_set)  # the same for every lane
        if needed is None:
            continue
        need_x, need_p = needed
        dest = None
        dgxs: list[Sequence[Maybe]]
        dgp: list[Maybe]
        if node.writes_into:  # a linear map: once, on the lanes' stacked rows (one lane: itself)
            dest = [into.get(p) if p not in out else None for p in node.params]
            lin = cast(Linear, node)
            lin = lin if B == 1 else lin.stacked(_linear(nodes, i), adjoints=True)
            dgx, dgp = lin.adjoint_tangent(
                Along(_cat(dgys), [_cat([dx[0] for dx in dxs])], dp, second, need_x, need_p),
                dest=dest,
                **scale,
            )
            dgxs = [dgx] if B == 1 else [[g] for g in _split(dgx[0], B)]
        elif B == 1:  # one tape: its node's products as they are
            gx, dgp = node.adjoint_tangent(Along(dgys[0], dxs[0], dp, second, need_x, need_p))
            dgxs = [gx]
        else:
            dgxs, dgp = [], [None for _ in node.params]
            for n, dgy, dx in zip(nodes, dgys, dxs):
                gx, gp = n[i].adjoint_tangent(Along(dgy, dx, dp, second, need_x, need_p))
                dgxs.append(gx)
                dgp = [add(a, b) for a, b in zip(dgp, gp)]
        for db, lane in zip(dbars, dgxs):
            for name, g in zip(node.inputs, lane):
                db[name] = add(db.get(name), g)
        collect(out, written, node.params, dgp, dest, wanted_set, alpha)
    return out, [{name: db.get(name) for name in wanted_inputs} for db in dbars]


def seeds(
    tapes: Sequence[Tape], dvals: Sequence[Mapping[str, Maybe]], seed_curvature: bool
) -> list[dict[str, Maybe]]:
    """Each tape's seed ``Z̄̇ = ∇²_Z ℓ · Ż`` at its output (``None``: zero, or the term has none)."""
    return [{t.output: output_seed(t.loss_hvp, d[t.output], seed_curvature)} for t, d in zip(tapes, dvals)]


def sweep(
    tapes: Sequence[Tape],
    dparams: Mapping[str, Tensor],
    term: str,
    wanted: Sequence[str],
    into: Mapping[str, Tensor] | None = None,
    alpha: float = 1.0,
    accumulate: bool = False,
) -> dict[str, Maybe]:
    """The sweep: ``Σ_β θ̄̇_β`` of the ``wanted`` parameters over ``B`` tapes of the same nodes (one
    tape: its ``θ̄̇``), the tangents ``dparams (k, *shape)`` shared: the forward tangents of the whole
    tapes, the seed of ``term`` (:data:`hessviz.block.terms.SWEEP_RULES`), the tangent of the
    reverse sweep (:func:`adjoint_tangents`; ``into``, ``alpha``, ``accumulate`` as there)."""
    seed_curvature, second = SWEEP_RULES[term]
    dvals = tangents([t.nodes for t in tapes], [{} for _ in tapes], dparams)
    return adjoint_tangents(
        tapes,
        tapes[0].whole,
        dvals,
        dparams,
        seeds(tapes, dvals, seed_curvature),
        second,
        wanted,
        into=into,
        alpha=alpha,
        accumulate=accumulate,
    )[0]


def split_sweep(
    tape: Tape,
    groups: Sequence[Mapping[str, Tensor]],
    term: str,
    wanted: Sequence[Sequence[str]],
    into: Sequence[Mapping[str, Tensor] | None],
    alpha: float = 1.0,
    accumulate: bool = False,
    batch: int | None = None,
) -> list[dict[str, Maybe]]:
    """:func:`sweep` of one tape for several groups of columns at once: group ``g`` has its own
    tangents ``groups[g] (k_g, *shape)`` and wanted parameters ``wanted[g]`` (``into``, ``alpha``,
    ``accumulate``: as there, per group), and returns its ``θ̄̇``. Each group's forward and reverse
    sweeps run through the nodes its own tangents reach (a zero tangent costs nothing: the nodes
    before a group's weights, and their adjoints, are skipped), and the loss's curvature is applied to
    every group's ``Ż`` in one call (``Σ k_g`` columns, ``batch`` at a time), so the loss's head is
    read once for all of them.

    One sweep of the groups' union computes the same diagonal blocks, ``H[w_g, w_g] v_g`` (to the
    GEMMs' rounding), but takes every group's columns through every group's nodes and returns every
    block of ``H[U, U]``; the per-tensor table asks for the diagonal ones only
    (:mod:`hessviz.whole.lockstep`)."""
    seed_curvature, second = SWEEP_RULES[term]
    spans = [_downstream(tape, g) for g in groups]
    dvals = [tangents([tape.nodes[span.start :]], [{}], g)[0] for span, g in zip(spans, groups)]
    seeds: list[Maybe] = [None] * len(groups)
    dZ = [d.get(tape.output) for d in dvals]
    present = [i for i, z in enumerate(dZ) if z is not None]
    if seed_curvature and present:
        Z = torch.cat([cast(Tensor, dZ[i]) for i in present])
        step = Z.shape[0] if batch is None else batch
        S = torch.cat([tape.loss_hvp(piece) for piece in Z.split(step)])
        for i, s in zip(present, S.split([cast(Tensor, dZ[i]).shape[0] for i in present])):
            seeds[i] = s
    return [
        adjoint_tangents(
            [tape],
            span,
            [d],
            g,
            [{tape.output: s}],
            second,
            w,
            into=i,
            alpha=alpha,
            accumulate=accumulate,
        )[0]
        for span, d, g, s, w, i in zip(spans, dvals, groups, seeds, wanted, into, strict=True)
    ]


def _downstream(tape: Tape, dparams: Mapping[str, Tensor]) -> LayerSpan:
    """The nodes from the first that reads a weight of ``dparams`` to the output: every node before it
    has a zero tangent and nothing of its adjoint is wanted, so a sweep of these tangents skips it (a
    last layer's weights: the nodes of one layer of 30, not a Python call per node of all of them)."""
    first = next((i for i, node in enumerate(tape.nodes) if any(p in dparams for p in node.params)), 0)
    return LayerSpan(tape.whole.input, tape.output, first, len(tape.nodes))
