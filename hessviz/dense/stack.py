r"""The dense Hessian of a stack of blocks, and of any loss whose curvature couples tokens.

A stack is ``X_b = f_b(X_{b−1}; θ_b)``, ``b = 1 … N``, with the loss ``ℓ`` on ``Z = X_N``. Per
block, everything is closed form:

* ``A_b = ∂X_b/∂X_{b−1}`` (``L·d × L·d``) and ``J_b = ∂X_b/∂θ_b`` (``L·d × P_b``);
* ``T_b(G)``, the second derivative of ``⟨G, f_b⟩`` in ``(X_{b−1}, θ_b)``, with parts
  ``T^{XX}`` (``L·d × L·d``), ``T^{θX}`` (``P_b × L·d``) and ``T^{θθ}`` (``P_b × P_b``).

The loss seen at a layer boundary is a gradient ``G_b`` and a curvature split into an outer
part ``C_b`` (the loss Hessian carried through Jacobians) and a functional part ``F_b`` (every
second derivative of the model after the boundary). It starts at ``Z`` as
``G_N = ∇_Z ℓ``, ``C_N = ∇²_Z ℓ``, ``F_N = 0`` and is pulled back block by block:

.. math::
    G_{b−1} = A_b^\top G_b, \qquad C_{b−1} = A_b^\top C_b A_b, \qquad
    F_{b−1} = A_b^\top F_b A_b + T_b^{XX}(G_b).

Attention mixes tokens, so below the last block ``C_b`` and ``F_b`` couple every pair of tokens:
they are dense ``(L·d × L·d)``. At ``Z`` the curvature of the built-in losses (and of a
token-wise :class:`~hessviz.losses.CustomLoss`) is block diagonal, ``(L, d, d)``
(:class:`~hessviz.dense.chain.TokenCurvature`); a dense custom loss is ``(L·d × L·d)`` already. Both
kinds are one thing here, a :class:`Boundary`: a gradient and a curvature that multiplies a
tangent of the boundary value (:meth:`Boundary.times`) and sandwiches a Jacobian
(:meth:`Boundary.sandwich`), per term.

With the term weights ``(co, cf)`` of :data:`hessviz.block.terms.TERMS` and ``S_b = co·C_b + cf·F_b``,
every block of ``H`` is

.. math::
    H[θ_b, θ_b] &= J_b^\top S_b J_b + cf·T_b^{θθ}(G_b), \\
    H[θ_b, θ_a] &= M_b K^{(a)}_{b−1} \quad (a < b), \qquad
    M_b = J_b^\top S_b A_b + cf·T_b^{θX}(G_b), \qquad
    K^{(a)}_{b−1} = ∂X_{b−1}/∂θ_a = A_{b−1} ⋯ A_{a+1} J_a,

(check: ``∂/∂θ_a`` of ``J_bᵀ G_b`` is ``[T_b^{θX} + J_bᵀ (C_b + F_b) A_b] ∂X_{b−1}/∂θ_a``), and
``S_{b−1} = A_bᵀ S_b A_b + cf·T_b^{XX}(G_b)`` is the same recursion per term.

How each piece is computed:

* ``M_b``, ``S_{b−1}`` and ``A_b``: one sweep of block ``b``'s nodes on the matrix-free tape
  (:meth:`~hessviz.products.tape.Tape.tangents`, :func:`~hessviz.products.tape.adjoint_tangents`,
  the hand-written forward-over-reverse rules of every node) with the identity as the ``L·d``
  tangent columns of ``X_{b−1}``, the adjoint-tangent seed ``S_b Ż_b`` at the block's output,
  and the second-order parts on iff ``cf ≠ 0``: the forward tangents are the columns of ``A_b``,
  the input adjoint tangents those of ``S_{b−1}``, the weight adjoint tangents those of ``M_b``.
  The first-order adjoints in the tape are ``∂ℓ/∂·`` of the whole stack, so ``G_b`` is built in.
* ``J_b``: the one-block Jacobian (:func:`hessviz.dense.assembly.dense_jacobian`).
* ``T_b^{θθ}(G_b)``: the one-block dense engine's functional term with ``G_b`` as the loss
  gradient (:func:`hessviz.dense.assembly.assemble`, zero loss curvature).
* The last block with a token-wise curvature at ``Z``: the one-block engine unchanged, every
  term (so a stack's last layer, and one block, keep their speed).

Costs: one sweep of ``L·d`` columns per block and term below the last; ``J_bᵀ S_b J_b`` and each
cross block are matrix products with inner dimension ``L·d``; ``K`` is accumulated forward, one
product per block. Only the wanted columns of ``J_a`` and rows of ``M_b`` (names, head slices)
enter the products; the ``A``'s of the layers between are always needed. Each cross block is
formed once and mirrored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import final

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.block.terms import TERMS
from hessviz.block.weights import layer_params
from hessviz.dense import assembly
from hessviz.dense.chain import TokenCurvature
from hessviz.dense.engine import ClosedFormEngine, memo
from hessviz.dense.record import BlockRecord, fold
from hessviz.losses import Loss
from hessviz.products.layout import Layout
from hessviz.products.tape import Tape, adjoint_tangents
from hessviz.runtime import pages


@dataclass(frozen=True)
class Boundary:
    """The loss seen at one layer boundary for one term: gradient ``g (L, d)`` and curvature
    ``S``, token-wise ``(L, d, d)`` or dense ``(L·d, L·d)`` (``None`` for zero)."""

    g: Tensor
    S: Tensor | None

    @property
    def token_wise(self) -> bool:
        return self.S is not None and self.S.ndim == 3

    def times(self, dZ: Tensor) -> Tensor | None:
        """``S Ż`` for tangents ``Ż (k, L, d)``."""
        if self.S is None:
            return None
        if self.token_wise:
            return torch.einsum("tij,ktj->kti", self.S, dZ)
        k = dZ.shape[0]
        return (dZ.reshape(k, -1) @ self.S).reshape(dZ.shape)  # S symmetric

    def sandwich_into(self, out: Tensor, J: Tensor, sizes: list[int], accumulate: bool) -> None:
        """``out (+)= Jᵀ S J`` for ``J (L·d, p)`` whose columns are chunks of ``sizes``: the upper
        tiles, one product per chunk; the tiles off the diagonal mirrored."""
        if self.S is None:
            if not accumulate:
                out.zero_()
            return
        if self.token_wise:
            L, d, _ = self.S.shape
            SJ = torch.bmm(self.S, J.reshape(L, d, -1)).reshape(L * d, -1)
        else:
            SJ = self.S @ J
        start = 0
        for size in sizes:  # row chunk: its upper part, then mirrored
            rows, rest, below = slice(start, start + size), slice(start, None), slice(start + size, None)
            if accumulate:
                out[rows, rest].addmm_(J[:, rows].T, SJ[:, rest])
            else:
                torch.mm(J[:, rows].T, SJ[:, rest], out=out[rows, rest])
            out[below, rows].copy_(out[rows, below].T)
            start += size


@final
class StackHessian(ClosedFormEngine):
    """The dense term :attr:`term` in ``names`` (and its blocks alone) of the Hessian of a stack, or
    of one block under a loss whose curvature couples tokens, from the tape of its forward pass (see
    the module docstring).

    ``loss`` is the block's :class:`~hessviz.losses.Loss`, made once by the caller (``cfg.loss`` on its
    target, or a checked :class:`CustomLoss`); ``like`` gives the dtype and device. What one term
    sweeps (the maps ``A_b``, the Jacobians, each term's boundaries) is kept for the others
    (:func:`~hessviz.dense.engine.memo`).
    """

    def __init__(
        self,
        cfg: BlockConfig,
        names: tuple[str, ...],
        params: dict[str, Tensor],
        tape: Tape | Callable[[], Tape],
        loss: Loss,
        like: Tensor,
        needed: int,
        term: str = "full",
    ):
        super().__init__(cfg, names, like, needed, term)
        self.params, self.loss = params, loss
        self._tape = tape
        self.N = cfg.n_layers
        self.token_wise = loss.token_wise

    @cached_property
    def tape(self) -> Tape:
        """The whole tape, every token (given, or built on first use from the callable given: one
        tape for the siblings, which the callable keeps)."""
        return self._tape() if callable(self._tape) else self._tape

    @cached_property
    def Z(self) -> Tensor:
        """``Z (L, d)``: the dtype, device and shape every dense piece takes."""
        return self.tape.values[self.tape.output]

    @cached_property
    def Ld(self) -> int:
        return self.Z.numel()

    # ------------------------------------------------------------------ one block at a time

    @memo
    def record(self, b: int) -> BlockRecord:
        """Layer ``b`` read by the dense engine from the tape's nodes (stages built when asked)."""
        return fold(
            self.cfg.layer(b), layer_params(self.cfg, self.params, b), self.tape.values, self.tape.layers[b]
        )

    def gradient(self, b: int) -> Tensor:
        """``G_b = ∂ℓ/∂X_b``, at the output of layer ``b``."""
        return self.tape.adjoints[self.tape.layers[b].output]

    @memo
    def loss_curvature(self) -> Tensor:
        """``∇²_Z ℓ``: ``(L, d, d)`` when token-wise, else ``(L·d, L·d)``."""
        Z = self.tape.values[self.tape.output]
        if self.token_wise:
            return self.loss.at(Z).token_curvature()
        return self.loss.dense_hessian()

    @memo
    def jacobian(self, b: int, local: tuple[str, ...]) -> Tensor:
        """``J_b (L·d, P_b')`` for block-local names of layer ``b``."""
        return assembly.dense_jacobian(self.cfg.layer(b), self.record(b), local)

    def input_tangents(self, b: int) -> dict[str, Tensor | None]:
        """Forward tangents of every value of layer ``b`` along the identity on ``X_{b−1}``:
        ``L·d`` columns (the columns of ``A_b`` at the output). Not kept: ``L·d`` times every
        activation of the block, recomputed per sweep rather than held by the result."""
        span = self.tape.layers[b]
        eye = torch.eye(self.Ld, dtype=self.Z.dtype, device=self.Z.device)
        return self.tape.tangents(span, {span.input: eye.reshape(self.Ld, *self.Z.shape)}, {})

    @memo
    def A(self, b: int) -> Tensor:
        """``A_b = ∂X_b/∂X_{b−1}``, ``(L·d, L·d)``."""
        out = self.input_tangents(b)[self.tape.layers[b].output]
        assert out is not None  # X_b reaches X_b through its residual or its attention
        return out.reshape(self.Ld, self.Ld).T

    # ------------------------------------------------------------------ the backward pass over blocks

    @memo
    def boundary(self, b: int, term: str) -> Boundary:
        """The loss at the output of layer ``b`` for ``term``: ``S_b = co·C_b + cf·F_b``."""
        co, _ = TERMS[term]
        if b == self.N - 1:
            return Boundary(self.gradient(b), self.loss_curvature() if co else None)
        return Boundary(self.gradient(b), self._sweep(term, b + 1)[0])

    def mixed(self, b: int, term: str) -> dict[str, Tensor]:
        """``M_b`` by weight of layer ``b ≥ 1``: ``name -> (L·d, *shape)`` (column ``j`` of ``M_b``)."""
        return self._sweep(term, b)[1]

    @memo
    def _sweep(self, term: str, b: int) -> tuple[Tensor | None, dict[str, Tensor]]:
        """One tape sweep of layer ``b ≥ 1``: ``(S_{b−1} (L·d, L·d), M_b by weight)``."""
        co, cf = TERMS[term]
        span = self.tape.layers[b]
        outside = self.boundary(b, term)
        dvals = self.input_tangents(b)
        seed = outside.times(dvals[span.output])
        weights = self.cfg.layer_names(b)
        prods, (inputs,) = adjoint_tangents(
            [self.tape], span, [dvals], {}, [{span.output: seed}], bool(cf), weights, (span.input,)
        )
        S = inputs[span.input]
        if S is not None:
            S = S.reshape(self.Ld, self.Ld)
            S = 0.5 * (S + S.T)
        return S, {n: p for n, p in prods.items() if p is not None}

    # ------------------------------------------------------------------ blocks of H

    def _rows_of_M(self, b: int, names: tuple[str, ...], term: str) -> Tensor:
        """``M_b`` restricted to ``names`` of layer ``b``: ``(P', L·d)``."""
        return Layout(self.cfg, names).gather(self.mixed(b, term), self.Ld, self.Z).T

    @memo
    def K(self, a: int, names: tuple[str, ...], c: int) -> Tensor:
        """``∂X_c/∂θ_a = A_c ⋯ A_{a+1} J_a`` for ``names`` of layer ``a ≤ c``: ``(L·d, P_a')``."""
        if c == a:
            return self.jacobian(a, tuple(self.cfg.layer_of(n)[1] for n in names))
        return self.A(c) @ self.K(a, names, c - 1)

    def diagonal(self, b: int, names: tuple[str, ...], term: str, out: Tensor | None = None) -> Tensor:
        """``H[θ_b, θ_b]`` for ``names`` (in θ order) of layer ``b`` (written into ``out`` if given)."""
        _, cf = TERMS[term]
        local = tuple(self.cfg.layer_of(n)[1] for n in names)
        if out is None:
            size = sum(self.cfg.param_size(n) for n in names)
            out = pages.empty((size, size), self.Z)
        rec = self.record(b)
        if b == self.N - 1 and self.token_wise:  # the one-block engine unchanged
            cur = assembly.pulled(rec, TokenCurvature(self.gradient(b), self.loss_curvature()))
            return assembly.assemble(self.cfg.layer(b), local, cur, term, self.Z, out)
        outside = self.boundary(b, term)
        if cf:  # T_b^{θθ}(G_b): the functional term
            G = outside.g  # with G_b as the loss gradient
            L, d = G.shape
            cur = assembly.pulled(rec, TokenCurvature(G, G.new_zeros(L, d, d)))
            assembly.assemble(self.cfg.layer(b), local, cur, "functional", self.Z, out)
        sizes = [self.cfg.param_size(n) for n in names]
        outside.sandwich_into(out, self.jacobian(b, local), sizes, accumulate=bool(cf))
        return out

    def cross(
        self,
        b: int,
        rows: tuple[str, ...],
        a: int,
        cols: tuple[str, ...],
        term: str,
        out: Tensor | None = None,
    ) -> Tensor:
        """``H[rows of layer b, cols of layer a]`` for ``a < b``: ``M_b K^{(a)}_{b−1}`` (into ``out``)."""
        return torch.mm(self._rows_of_M(b, rows, term), self.K(a, cols, b - 1), out=out)

    # ------------------------------------------------------------------ the matrix

    def _form(self) -> Tensor:
        """The ``(P', P')`` term: diagonal blocks per layer, each cross block once and mirrored."""
        names, term = self.names, self.term
        by_layer: dict[int, list[str]] = {}
        for n in names:
            by_layer.setdefault(self.cfg.layer_of(n)[0], []).append(n)
        offsets = self.cfg.offsets(names)
        span = {b: slice(offsets[ns[0]].start, offsets[ns[-1]].stop) for b, ns in by_layer.items()}
        size = sum(self.cfg.param_size(n) for n in names)
        H = pages.empty((size, size), self.Z)
        layers = sorted(by_layer)
        for i, b in enumerate(layers):
            self.diagonal(b, tuple(by_layer[b]), term, H[span[b], span[b]])
            for a in layers[:i]:
                block = self.cross(b, tuple(by_layer[b]), a, tuple(by_layer[a]), term, H[span[b], span[a]])
                H[span[a], span[b]].copy_(block.T)
        return H

    def _alone(self, a: str, b: str) -> Tensor:
        """The ``(|a|, |b|)`` block of two names (or head slices): one diagonal block of their
        layer, or just the cross block of two layers."""
        term = self.term
        (la, _), (lb, _) = self.cfg.layer_of(a), self.cfg.layer_of(b)
        if la == lb:
            names = self.cfg.sort_names(tuple(dict.fromkeys((a, b))))
            H = self.diagonal(la, names, term)
            offsets = self.cfg.offsets(names)
            return H[offsets[a], offsets[b]]
        if la > lb:
            return self.cross(la, (a,), lb, (b,), term)
        return self.cross(lb, (b,), la, (a,), term).T
