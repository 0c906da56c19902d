r"""The closed-form Hessian of the loss in the weights, assembled unit by unit.

The fold of the tape's forward pass (:func:`hessviz.dense.record.fold`) gives the attention and the
token-wise rest
of the block ``T: SA → Z``. The loss gradient ``g_Z`` and Hessian ``N_Z`` in ``Z`` are pulled
back through ``T`` (:mod:`hessviz.dense.chain`) to ``g_SA`` and ``N_SA = J_Tᵀ N_Z J_T + Q_T(g_Z)``,
each split into its outer and functional part. With ``J^a`` the Jacobian of ``SA`` in an
attention unit (or an input parameter of the attention) and ``J^q`` that of ``Z`` in a
parameter of ``T``, every block is one recipe:

.. math::
    H_{aa'} &= \sum_t J^{a\top}_t N^{SA}_t J^{a'}_t + ∂^2_{aa'}(g_{SA}^\top SA), \\
    H_{aq}  &= \sum_t J^{a\top}_t \big(J_{T,t}^\top N^Z_t J^{q}_t + \text{mixed}^T_q(g_Z)_t\big), \\
    H_{qq'} &= \sum_t J^{q\top}_t N^Z_t J^{q'}_t + ∂^2_{qq'}(g_Z^\top T),

and, for a parameter ``β`` of the branch ``B`` on ``X`` (``Z = T(SA) + B(X)``, the parallel block's
``FFN(ln2(X))``, Jacobian ``J^β``), ``H_{ββ'} = Σ_t J^{β⊤}_t N^Z_t J^{β'}_t + ∂²_{ββ'}(g_Zᵀ B)``,
``H_{aβ} = Σ_t J^{a⊤}_t J_{T,t}^⊤ N^Z_t J^β_t`` and ``H_{qβ} = Σ_t J^{q⊤}_t N^Z_t J^β_t``
(:func:`_branch_contributions`: no second derivative of ``Z`` pairs ``β`` with another weight);
a list of :class:`~hessviz.ops.contributions.Sandwich` (GEMMs over tokens of Kronecker-factored
Jacobians), :class:`~hessviz.ops.contributions.Diagonal` and
:class:`~hessviz.ops.contributions.Dense` pieces. ``outer``, ``functional`` and ``full`` are the
same recipe with the weights of :data:`hessviz.block.terms.TERMS`: the outer weight keeps the
loss Hessian ``N_Z`` (and everything it reaches through Jacobians), the functional weight
keeps every second derivative of the model (``Q_T``, the mixed terms, the attention's own).

Pieces are addressed by the components' references; :mod:`hessviz.block.weights` places each
unit's block in the matrix (a head of a whole weight is a strided view of it).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import final

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.block.terms import TERMS, check_term
from hessviz.block.weights import Unit, units, units_of
from hessviz.dense.chain import TokenCurvature
from hessviz.dense.engine import ClosedFormEngine, memo
from hessviz.dense.record import BlockRecord
from hessviz.losses import Loss
from hessviz.ops.contributions import Piece, Ref, Sandwich
from hessviz.ops.kron import Factored, MiddleCache, sandwich_into
from hessviz.runtime import pages


@dataclass(frozen=True)
class Curvature:
    """Gradients and curvatures of the loss at ``Z`` and at ``SA``, token by token."""

    record: BlockRecord
    at_Z: TokenCurvature
    at_SA: TokenCurvature


def backward(rec: BlockRecord, loss: Loss) -> Curvature:
    """Loss gradient and Hessian in ``Z``, pulled back through ``T`` to ``SA``; ``loss`` token-wise."""
    at = loss.at(rec.Z)
    return pulled(rec, TokenCurvature(at.grad, at.token_curvature()))


def pulled(rec: BlockRecord, at_Z: TokenCurvature) -> Curvature:
    """The token-wise curvature ``at_Z`` at the block's output, pulled back through ``T`` to ``SA``."""
    return Curvature(rec, at_Z, at_Z if rec.stage is None else at_Z.pull(rec.stage.map))


def attention_jacobians(rec: BlockRecord, refs: tuple[Ref, ...]) -> dict[Ref, Factored]:
    """``∂SA/∂θ`` of the attention's units among ``refs``; zero ones (``b_K``) left out."""
    att = set(rec.attention.units)
    out = {r: rec.attention.jacobian(r) for r in refs if r in att}
    return {r: J for r, J in out.items() if J is not None}


def dense_jacobian(cfg: BlockConfig, rec: BlockRecord, names: tuple[str, ...]) -> Tensor:
    """``∂ vec_r(Z)/∂θ'`` of one block, ``(L*d, P')``: each unit's factored Jacobian, chained to
    ``Z``, written into its columns."""
    L, d = rec.Z.shape
    out = pages.empty((L * d, sum(cfg.param_size(n) for n in names)), rec.Z)
    offsets = cfg.offsets(names)
    us = units(cfg, names)
    at_sa = attention_jacobians(rec, tuple(u.ref for u in us))
    for u in us:
        target = u.rows_of(out[:, offsets[u.name]], 1)  # (L*d, rows, cols)
        if u.ref in at_sa:
            J = at_sa[u.ref] if rec.stage is None else at_sa[u.ref].lmul(rec.stage.map.jac)  # ∂Z/∂SA · ∂SA/∂θ
        elif rec.stage is not None and u.ref in rec.stage.jacobians:
            J = rec.stage.jacobians[u.ref]
        elif rec.branch is not None and u.ref in rec.branch.jacobians:  # Z = T(SA) + B(X)
            J = rec.branch.jacobians[u.ref]
        else:  # b_K: exactly zero
            target.zero_()
            continue
        J.dense_into(target)
    return out


def contributions(cur: Curvature, refs: tuple[Ref, ...], term: str) -> list[Piece]:
    """Every piece of the ``term`` Hessian whose two units are both in ``refs``."""
    co, cf = TERMS[check_term(term)]
    rec, T = cur.record, cur.record.stage
    J_sa = attention_jacobians(rec, refs)
    att = list(J_sa)
    stg = [r for r in refs if T is not None and r in T.jacobians]
    g_Z = cur.at_Z.g
    out: list[Piece] = _branch_contributions(cur, refs, J_sa, stg, co, cf)
    if att:
        N_sa = cur.at_SA.select(co, cf)
        out += [Sandwich(a, b, J_sa[a], N_sa, J_sa[b]) for i, a in enumerate(att) for b in att[i:]]
        if cf:
            out += rec.attention.functional(cur.at_SA.g, tuple(att))
    if stg and T is not None:  # stg is empty without T
        J_t = T.jacobians
        if co:
            N_z = cur.at_Z.select(co, 0.0)
            out += [Sandwich(a, b, J_t[a], N_z, J_t[b]) for i, a in enumerate(stg) for b in stg[i:]]
            across = T.map.jac.transpose(-1, -2) @ N_z  # J_Tᵀ N_Z, (L, d, d)
            out += [Sandwich(a, b, J_sa[a], across, J_t[b]) for a in att for b in stg]
        if cf:
            out += T.functional(g_Z)
            if att:
                mixed = T.mixed(g_Z)
                out += [Sandwich(a, b, J_sa[a], None, mixed[b]) for a in att for b in stg if b in mixed]
    wanted = set(refs)
    return [p for p in out if p.a in wanted and p.b in wanted]


def _branch_contributions(
    cur: Curvature, refs: tuple[Ref, ...], J_sa: dict[Ref, Factored], stg: list[Ref], co: float, cf: float
) -> list[Piece]:
    """The pieces of the branch ``B`` on ``X`` (``Z = T(SA) + B(X)``, :mod:`hessviz.dense.record`) whose
    units are in ``refs``: its own block ``Σ_t J^{B⊤} N^Z J^B + ∂²_{θ_B}(g_Zᵀ B)``, and its pairs with
    the attention's and ``T``'s weights, which meet it only through the loss curvature
    (``Σ_t J^{a⊤} J_T^⊤ N^Z J^B``, ``Σ_t J^{q⊤} N^Z J^B``): ``Z`` is a sum of two functions of
    disjoint weights of the constant ``X``, so no second derivative of the model couples them."""
    B = cur.record.branch
    brn = [r for r in refs if B is not None and r in B.jacobians]
    if not brn or B is None:  # brn is empty without B
        return []
    J_b, T = B.jacobians, cur.record.stage
    out: list[Piece] = []
    if co:
        N_z = cur.at_Z.select(co, 0.0)
        out += [Sandwich(a, b, J_b[a], N_z, J_b[b]) for i, a in enumerate(brn) for b in brn[i:]]
        if J_sa:
            across = N_z if T is None else T.map.jac.transpose(-1, -2) @ N_z  # J_Tᵀ N_Z
            out += [Sandwich(a, b, J_sa[a], across, J_b[b]) for a in J_sa for b in brn]
        if T is not None:  # stg is empty without T
            out += [Sandwich(a, b, T.jacobians[a], N_z, J_b[b]) for a in stg for b in brn]
    if cf:
        out += B.functional(cur.at_Z.g)
    return out


def write_block(
    block: Tensor, pieces: list[Piece], mirror: Tensor | None = None, cache: MiddleCache | None = None
) -> None:
    """Write the sum of ``pieces`` into the 4-d ``block`` (and its transpose into ``mirror``):
    the dense sandwiches summed slice by slice and written once, then the sparse pieces
    added; no piece (a zero block, e.g. two different heads' softmax terms) writes zeros."""
    dense = [(c.Ja, c.N, c.Jb) for c in pieces if isinstance(c, Sandwich)]  # the dense pieces
    if dense:
        sandwich_into(block, dense, mirror, cache)
    else:
        for target in (block, mirror):
            if target is not None:
                target.zero_()
    for piece in pieces:
        if not isinstance(piece, Sandwich):
            piece.add_to(block, mirror)


def _by_pair(pieces: list[Piece], order: dict[Ref, int]) -> dict[tuple[Ref, Ref], list[Piece]]:
    """Pieces bucketed by their (ordered) pair of units, each seen from the earlier unit."""
    out: dict[tuple[Ref, Ref], list[Piece]] = defaultdict(list)
    for p in pieces:
        if order[p.a] > order[p.b]:
            p = p.transposed()
        out[(p.a, p.b)].append(p)
    return out


def assemble(
    cfg: BlockConfig,
    names: tuple[str, ...],
    cur: Curvature,
    term: str,
    like: Tensor,
    out: Tensor | None = None,
) -> Tensor:
    """The ``(P', P')`` matrix: each upper unit block and its mirror image written from the same
    pieces (into ``out``, e.g. a diagonal block of a stack's matrix, when given)."""
    us = units(cfg, names)
    order = {u.ref: k for k, u in enumerate(us)}
    pieces = _by_pair(contributions(cur, tuple(order), term), order)
    offsets = cfg.offsets(names)
    size = sum(cfg.param_size(n) for n in names)
    H = pages.empty((size, size), like) if out is None else out
    cache = MiddleCache()
    for i, a in enumerate(us):
        for b in us[i:]:
            block = Unit.view(H[offsets[a.name], offsets[b.name]], a, b)
            mirror = Unit.view(H[offsets[b.name], offsets[a.name]], b, a) if b is not a else None
            write_block(block, pieces.get((a.ref, b.ref), []), mirror, cache)
    return H


def assemble_block(cfg: BlockConfig, a: str, b: str, cur: Curvature, term: str, like: Tensor) -> Tensor:
    """The ``(|a|, |b|)`` block of two names alone: only their units' pieces are formed."""
    ua, ub = units_of(cfg, a), units_of(cfg, b)
    refs = tuple(dict.fromkeys(u.ref for u in ua + ub))
    order = {r: k for k, r in enumerate(sorted(refs, key=_theta_order(cfg)))}
    pieces = _by_pair(contributions(cur, refs, term), order)
    out = torch.empty(cfg.param_size(a), cfg.param_size(b), dtype=like.dtype, device=like.device)
    cache = MiddleCache()
    for x in ua:
        for y in ub:
            view = Unit.view(out, x, y)
            if order[x.ref] <= order[y.ref]:
                write_block(view, pieces.get((x.ref, y.ref), []), cache=cache)
            else:
                write_block(view.permute(2, 3, 0, 1), pieces.get((y.ref, x.ref), []), cache=cache)
    return out


def _theta_order(cfg: BlockConfig):
    """Sort key of units in θ order (heads of one weight by head)."""
    position = {u.ref: k for k, u in enumerate(units(cfg, cfg.param_names))}
    return position.__getitem__


@final
class DenseHessian(ClosedFormEngine):
    """The closed-form engine of one block under a token-wise loss: the term :attr:`term` in
    ``names`` (and its blocks alone) assembled from the Kronecker-factored pieces of the forward
    record ``rec`` of ``X``.

    The curvature pulled back to ``SA`` (:func:`backward`, ``O(L d³)``) is formed when a term or
    block is first asked for, and shared by the three terms (:func:`~hessviz.dense.engine.memo`)."""

    def __init__(
        self,
        cfg: BlockConfig,
        names: tuple[str, ...],
        rec: BlockRecord,
        loss: Loss,
        X: Tensor,
        needed: int,
        term: str = "full",
    ):
        super().__init__(cfg, names, X, needed, term)
        self.record, self.loss, self.X = rec, loss, X

    @memo
    def curvature(self) -> Curvature:
        return backward(self.record, self.loss)

    def _form(self) -> Tensor:
        """:func:`assemble`."""
        return assemble(self.cfg, self.names, self.curvature(), self.term, self.X)

    def _alone(self, a: str, b: str) -> Tensor:
        """:func:`assemble_block`."""
        return assemble_block(self.cfg, a, b, self.curvature(), self.term, self.X)
