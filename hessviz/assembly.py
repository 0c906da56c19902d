r"""The closed-form Hessian of the loss in the weights, assembled block by block.

One forward pass (:func:`hessviz.block.trace`) and one token-wise backward pass of
gradients and curvatures (:mod:`hessviz.chain`) give, per token,

* at ``R`` (the sum before ``post``): ``g_R`` and ``N_R``,
* at ``SA`` (the attention output): ``g_SA`` and ``N_SA``,

each curvature split into its outer and functional part. Every block of

.. math::
    H = \sum_t \begin{bmatrix} J^{SA}_t & \\ & I \end{bmatrix}^\top
        \begin{bmatrix} N^{SA}_t & D_t^\top N^R_t J^f_t \\ \cdot & J^{f\top}_t N^R_t J^f_t \end{bmatrix}
        \begin{bmatrix} J^{SA}_t & \\ & I \end{bmatrix}
        + \text{(second derivatives inside attention and the FFN)}

is then a :class:`~hessviz.contributions.Sandwich` of Kronecker-factored Jacobians
(``J^{SA}`` of attention in its weights, ``J^f`` of the FFN branch in its weights,
``D = ∂R/∂SA``) or a sparse :class:`~hessviz.contributions.Diagonal`. ``outer``,
``functional`` and ``full`` differ only in which parts of the curvatures enter and
whether the model's own second derivatives are added: three views of one recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from hessviz import losses, memory
from hessviz.block import BlockTrace
from hessviz.chain import TokenCurvature
from hessviz.config import ATTENTION_PARAMS, FFN_PARAMS, BlockConfig
from hessviz.contributions import Diagonal, Sandwich
from hessviz.kron import sandwich_into
from hessviz.result import TERMS, check_term


@dataclass(frozen=True)
class Curvature:
    """Gradients and curvatures of the loss at ``Z``, ``R`` and ``SA``, token by token."""

    trace: BlockTrace
    at_Z: TokenCurvature
    at_R: TokenCurvature
    at_SA: TokenCurvature


def backward(cfg: BlockConfig, tr: BlockTrace, Y: Tensor) -> Curvature:
    """Loss gradient and Hessian in ``Z``, pulled back through ``post`` and ``SA → R``."""
    at_Z = TokenCurvature(losses.gradient(cfg.loss, tr.Z, Y), losses.hessian(cfg.loss, tr.Z, Y))
    at_R = at_Z.pull(tr.post)
    return Curvature(tr, at_Z, at_R, at_R.pull(tr.sa_to_r))


def contributions(cur: Curvature, names: tuple[str, ...], term: str) -> list[Sandwich | Diagonal]:
    """Every piece of the ``term`` Hessian whose two parameters are both in ``names``."""
    co, cf = TERMS[check_term(term)]
    tr = cur.trace
    att = [n for n in ATTENTION_PARAMS if n in names]
    ffn = [n for n in FFN_PARAMS if n in names] if tr.ffn is not None else []
    J_sa = tr.attention.jacobian if att else {}
    out: list[Sandwich | Diagonal] = []

    if att:
        N_sa = cur.at_SA.select(co, cf)
        out += [Sandwich(a, b, J_sa[a], N_sa, J_sa[b]) for i, a in enumerate(att) for b in att[i:]]
        if cf:
            out += tr.attention.functional(cur.at_SA.g)
    if ffn:
        J_f = tr.ffn.jacobian
        N_r = cur.at_R.select(co, cf)
        across = tr.sa_to_r.jac.transpose(-1, -2) @ N_r            # Dᵀ N_R, (L, d, d)
        out += [Sandwich(a, b, J_sa[a], across, J_f[b]) for a in att for b in ffn]
        out += [Sandwich(a, b, J_f[a], N_r, J_f[b]) for i, a in enumerate(ffn) for b in ffn[i:]]
        if cf:
            mixed = tr.ffn.mixed(cur.at_R.g)
            to_y = tr.sa_to_y.transpose(-1, -2)                    # (∂Y/∂SA)ᵀ
            out += [Sandwich(a, b, J_sa[a], to_y, mixed[b]) for a in att for b in ffn]
            out += tr.ffn.functional(cur.at_R.g)
    return [c for c in out if c.a in names and c.b in names]


def write_block(block: Tensor, pieces: list[Sandwich | Diagonal], mirror: Tensor | None = None) -> None:
    """Write the sum of ``pieces`` into ``block`` (and its transpose into ``mirror``):
    the dense sandwiches summed slice by slice and written once, then the sparse
    pieces added on their diagonals."""
    dense = [(c.Ja, c.N, c.Jb) for c in pieces if c.dense]
    if dense:
        sandwich_into(block, dense, mirror)
    else:
        for target in (block, mirror):
            if target is not None:
                target.zero_()
    for piece in pieces:
        if not piece.dense:
            piece.add_to(block, mirror)


def assemble(cfg: BlockConfig, names: tuple[str, ...], pieces: list[Sandwich | Diagonal],
             like: Tensor) -> Tensor:
    """The ``(P', P')`` matrix: each upper block and its mirror image written from the same pieces."""
    offsets = cfg.offsets(names)
    size = sum(cfg.param_size(n) for n in names)
    H = memory.empty(size, size, dtype=like.dtype, device=like.device)
    for i, a in enumerate(names):
        for b in names[i:]:
            mirror = H[offsets[b], offsets[a]] if a != b else None
            write_block(H[offsets[a], offsets[b]], [c for c in pieces if (c.a, c.b) == (a, b)], mirror)
    return H


