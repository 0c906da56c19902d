r"""A batch's products in one sweep: the tapes of ``B`` sequences swept node by node, side by side.

A whole model's product is ``(1/B) Σ_β H_β V`` (:mod:`hessviz.whole.hessian`), each ``H_β V`` a
sweep of sequence ``β``'s tape (:meth:`~hessviz.products.tape.Tape.sweep`). The tapes have the
same nodes (same names, same weights), only their values differ. A linear map is token-wise: its
``B`` nodes are one map on the ``B·L`` stacked rows (:meth:`~hessviz.ops.linear.Linear.stacked`),
so running the tapes in lockstep turns ``B`` sets of GEMMs into one:

.. math::
    \dot y = \dot x W + x \dot W + \dot b \text{ on } B L \text{ rows}, \qquad
    \textstyle\sum_β \dot{\bar W}_β = [X; \dot X]^\top [\dot{\bar Y}; \bar Y]
    \text{ over } 2 B L \text{ rows},

the weight's product of the whole batch written once, scaled by ``alpha`` (``1/B``), into its
place in the output; every other node (attention, norms, activations) runs per sequence as in
:meth:`Tape.adjoint_tangents`, and its parameter products are summed over the sequences. The
rules and the skipping of zero tangents are :class:`~hessviz.products.tape.Tape`'s; only the order
of the floating-point sums differs from ``B`` separate sweeps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hessviz.block.terms import SWEEP_RULES
from hessviz.ops.base import Along, Maybe, Node, add
from hessviz.ops.linear import Linear
from hessviz.products.tape import Tape, collect, needs, output_seed


def same_nodes(tapes: Sequence[Tape]) -> bool:
    """Whether the tapes have the same nodes in the same order (names, kinds, output)."""
    first = tapes[0]
    return all(
        len(t.nodes) == len(first.nodes)
        and t.output == first.output
        and all(
            type(a) is type(b) and a.output == b.output and a.inputs == b.inputs and a.params == b.params
            for a, b in zip(t.nodes, first.nodes)
        )
        for t in tapes[1:]
    )


def _cat(pieces: list[Maybe]) -> Maybe:
    """``B`` tangents ``(k, L, n)`` as ``(k, B L, n)`` (``None`` when they are zero)."""
    if pieces[0] is None:
        return None
    return torch.cat(pieces, dim=1)


def _split(t: Maybe, B: int) -> list[Maybe]:
    """``(k, B L, n) -> B`` views ``(k, L, n)``."""
    return [None] * B if t is None else list(t.chunk(B, dim=1))


def tangents(
    nodes: Sequence[Sequence[Node]],
    dinputs: Sequence[dict[str, Maybe]],
    dparams: dict[str, Tensor],
) -> list[dict[str, Maybe]]:
    """Forward tangents of every value of ``B`` tapes' nodes (:meth:`Tape.tangents` of each), the
    nodes ``nodes[β]`` of sequence ``β`` the same across ``β``, from the tangents ``dinputs[β]`` of
    the values they read from outside and the weights' ``dparams (k, *shape)``; a linear map is one
    GEMM on the ``B·L`` stacked rows."""
    B = len(nodes)
    dvals: list[dict[str, Maybe]] = [dict(d) for d in dinputs]
    for i, node in enumerate(nodes[0]):
        dp = [dparams.get(p) for p in node.params]
        if isinstance(node, Linear):
            dx = _cat([d.get(node.inputs[0]) for d in dvals])
            y = node.stacked([n[i] for n in nodes], adjoints=False).tangent([dx], dp)
            for d, piece in zip(dvals, _split(y, B)):
                d[node.output] = piece
        else:
            for n, d in zip(nodes, dvals):
                d[node.output] = n[i].tangent([d.get(x) for x in node.inputs], dp)
    return dvals


def adjoint_tangents(
    tapes: Sequence[Tape],
    dvals: Sequence[dict[str, Maybe]],
    dparams: dict[str, Tensor],
    seeds: Sequence[dict[str, Maybe]],
    second: bool,
    wanted: Sequence[str],
    into: dict[str, Tensor],
    alpha: float,
    wanted_inputs: Sequence[str] = (),
) -> tuple[dict[str, Maybe], list[dict[str, Maybe]]]:
    """The tangent of the reverse sweep over the tapes' whole spans, side by side
    (:meth:`Tape.adjoint_tangents` of each): ``(Σ_β θ̄̇_β of wanted, per tape x̄̇ of wanted_inputs)``.

    ``seeds[β]`` holds tape ``β``'s adjoint tangents of its outputs. A product written into its view
    of ``into`` is already ``alpha Σ_β θ̄̇_β`` (the returned entry is that view); every other entry
    is the unscaled sum (:meth:`~hessviz.products.layout.Layout.gather` scales it)."""
    B, first = len(tapes), tapes[0]
    nodes = [t.nodes for t in tapes]
    dbars = [dict(s) for s in seeds]
    wanted_set = set(wanted) | set(wanted_inputs)
    upstream = first._closure(first.whole, frozenset(wanted_inputs))
    scaled = alpha != 1.0
    out: dict[str, Maybe] = {}
    written: set[str] = set()
    for i in reversed(range(len(first.nodes))):
        node = first.nodes[i]
        dgys = [db.pop(node.output, None) for db in dbars]
        dp = [dparams.get(p) for p in node.params]
        dxs = [[d.get(x) for x in node.inputs] for d in dvals]
        needed = needs(node, dgys[0], dxs[0], dp, second, upstream, wanted_set)  # the same for every tape
        if needed is None:
            continue
        need_x, need_p = needed
        if isinstance(node, Linear):
            dest = [into.get(p) if p not in out else None for p in node.params]
            stacked = node.stacked([n[i] for n in nodes], adjoints=True)
            (dgx,), dgp = stacked.adjoint_tangent(
                Along(_cat(dgys), [_cat([dx[0] for dx in dxs])], dp, second, need_x, need_p),
                dest=dest,
                **({"alpha": alpha} if scaled else {}),
            )
            dgxs = [[g] for g in _split(dgx, B)]
        else:
            dest = None
            dgxs, dgp = [], [None] * len(node.params)
            for n, dgy, dx in zip(nodes, dgys, dxs):
                gx, gp = n[i].adjoint_tangent(Along(dgy, dx, dp, second, need_x, need_p))
                dgxs.append(gx)
                dgp = [add(a, b) for a, b in zip(dgp, gp)]
        for db, gx in zip(dbars, dgxs):
            for name, g in zip(node.inputs, gx):
                db[name] = add(db.get(name), g)
        collect(out, written, node.params, dgp, dest, wanted_set, alpha)
    return out, [{name: db.get(name) for name in wanted_inputs} for db in dbars]


def seeds(
    tapes: Sequence[Tape], dvals: Sequence[dict[str, Maybe]], seed_curvature: bool
) -> list[dict[str, Maybe]]:
    """Each tape's seed ``Z̄̇ = ∇²_Z ℓ · Ż`` at its output (``None``: zero, or the term has none)."""
    return [{t.output: output_seed(t.loss_hvp, d[t.output], seed_curvature)} for t, d in zip(tapes, dvals)]


def sweep(
    tapes: Sequence[Tape],
    dparams: dict[str, Tensor],
    term: str,
    wanted: Sequence[str],
    into: dict[str, Tensor],
    alpha: float,
) -> dict[str, Maybe]:
    """``Σ_β θ̄̇_β`` of the ``wanted`` parameters over the tapes (:meth:`Tape.sweep` of each,
    summed), the tangents ``dparams (k, *shape)`` shared. A product written into its view of
    ``into`` is already ``alpha Σ_β θ̄̇_β`` (the returned entry is that view); every other entry
    is the unscaled sum (:meth:`~hessviz.products.layout.Layout.gather` scales it)."""
    seed_curvature, second = SWEEP_RULES[term]
    dvals = tangents([t.nodes for t in tapes], [{} for _ in tapes], dparams)
    return adjoint_tangents(
        tapes, dvals, dparams, seeds(tapes, dvals, seed_curvature), second, wanted, into, alpha
    )[0]
