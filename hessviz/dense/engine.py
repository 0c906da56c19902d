r"""The dense terms as one more engine: :class:`DenseEngine`, an operator whose matrix is formed.

A dense engine is one term (``full``, ``outer`` or ``functional``) of the ``(P', P')`` Hessian in
``names`` (whole weights and head slices, θ order), and an operator like any other: its
:meth:`~HessianOperator._matmat` is ``V Hᵀ`` with ``H`` the formed term, its
:meth:`~DenseEngine.dense` is ``H`` (formed the first time, under the memory guard, and kept), and
its :meth:`~HessianOperator.block` ``H[a, b]`` is a
:class:`~hessviz.products.hessian_operator.DenseOperator`: computed alone (only the units of ``a``
and ``b``) where the engine can and the term is not formed, else read from the term. A subclass
writes :meth:`~DenseEngine._form` (the term) and :meth:`~DenseEngine._alone` (a block alone, or
``None``); the three are final:

* :class:`~hessviz.dense.assembly.DenseHessian`: one block under a token-wise loss (the
  Kronecker-factored fold);
* :class:`~hessviz.dense.stack.StackHessian`: a stack, or a loss whose curvature couples tokens;
* :class:`~hessviz.dense.autograd.AutogradHessian`: the autograd reference (``torch.func``).

The three terms of one result are *siblings* (:meth:`~DenseEngine.sibling`): one engine's state
seen with another term. They share what is formed (:attr:`~DenseEngine.formed`, the terms by name)
and what the engine keeps across terms (:func:`memo`: a block's pulled-back curvature, a stack's
per-layer maps), so ``full`` is ``outer + functional`` once both are formed and nothing is
computed twice. A :class:`~hessviz.result.HessianResult` holds one sibling per term.
"""

from __future__ import annotations

import copy
import functools
from abc import abstractmethod
from typing import ClassVar, final

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig, parse_name
from hessviz.block.terms import PARTS_FIRST, check_term
from hessviz.errors import ConfigError
from hessviz.products.hessian_operator import DenseOperator, HessianOperator, Names, head_blocks
from hessviz.runtime import pages
from hessviz.runtime.memory import check_fits

SIZE_ADVICE = "lower seq_len, d_model, d_k or d_ff, or pass fewer names in wrt"
"""What to do when a dense result is over the memory limit."""


def memo(method):
    """Cache a dense engine's method by its arguments in the store its siblings share
    (:attr:`DenseEngine.kept`): what one term computes, another term reuses."""

    @functools.wraps(method)
    def cached(self, *args):
        key = (method.__name__, args)
        if key not in self.kept:
            self.kept[key] = method(self, *args)
        return self.kept[key]

    return cached


class DenseEngine(HessianOperator):
    """The formed term ``term`` of the Hessian in ``names`` of ``cfg`` (see the module docstring).

    ``like`` gives the dtype and device; ``needed`` is the estimated peak bytes of forming one term,
    checked against the memory limit before one is formed. A subclass sets :attr:`order` and
    :attr:`label` and writes :meth:`_form` and :meth:`_alone`."""

    order: ClassVar[Names]
    """The cheapest order in which to form all three terms."""
    label: ClassVar[str]
    """How the terms are computed, in the memory guard's message (``"closed_form"``, ``"autograd"``)."""

    def __init__(self, cfg: BlockConfig, names: Names, like: Tensor, needed: int, term: str = "full"):
        size = sum(cfg.param_size(n) for n in names)
        super().__init__(names, names, (size, size), like.dtype, like.device, check_term(term))
        self.cfg, self.names, self.needed = cfg, names, needed
        self.offsets = cfg.offsets(names)
        self.formed: dict[str, Tensor] = {}
        """The terms formed so far, by name (shared by the siblings)."""
        self.kept: dict[tuple, object] = {}
        """What :func:`memo` keeps across terms (shared by the siblings)."""

    # ------------------------------------------------------------------ what a subclass writes

    @abstractmethod
    def _form(self) -> Tensor:
        """The ``(P', P')`` matrix of :attr:`term` over :attr:`names`."""

    @abstractmethod
    def _alone(self, a: str, b: str) -> Tensor | None:
        """The ``(|a|, |b|)`` block of :attr:`term` for two covered names or head slices, computed
        alone; ``None`` where the engine has nothing cheaper than the term it is read from."""

    # ------------------------------------------------------------------ written once for all

    @final
    def sibling(self, term: str) -> DenseEngine:
        """This engine's operator of ``term``: the same state, sharing :attr:`formed` and :attr:`kept`."""
        twin = copy.copy(self)  # a shallow copy: the two stores are the same objects
        twin.term = check_term(term)
        return twin

    @final
    def dense(self) -> Tensor:
        """The ``(P', P')`` term, formed the first time it is asked for (under the memory guard) and
        kept; ``full`` is ``outer + functional`` when both are formed already."""
        formed, term = self.formed, self.term
        if term not in formed:
            if term == "full" and {"outer", "functional"} <= formed.keys():
                outer, functional = formed["outer"], formed["functional"]
                formed[term] = torch.add(outer, functional, out=pages.empty(tuple(outer.shape), outer))
            else:
                size = self.shape[0]
                check_fits(
                    f"a dense Hessian term ({size} x {size}, {self.label})",
                    self.needed,
                    self.device,
                    SIZE_ADVICE,
                )
                formed[term] = self._form()
        return formed[term]

    @final
    def _matmat(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        return torch.matmul(V, self.dense().T, out=out)

    @final
    def covered(self, name: str) -> str:
        """``name`` if it is one of :attr:`names` or a head slice of one of them, else
        :class:`~hessviz.errors.ConfigError`."""
        base = parse_name(self.cfg.check_name(name)).base
        if name not in self.offsets and base not in self.offsets:
            raise ConfigError(
                f"parameter {name!r} is not in this result's names {self.names}; "
                "compute the Hessian with it (or its whole weight) in wrt"
            )
        return name

    @final
    def _index(self, names: Names) -> slice | Tensor:
        """Rows of ``names`` in the term: one name's slice, or a head's entries inside its whole
        weight; several names' rows one after another."""
        parts: list[slice | Tensor] = []
        for name in names:
            if name in self.offsets:
                parts.append(self.offsets[name])
            else:
                base = parse_name(name).base
                parts.append(self.cfg.head_indices(name) + self.offsets[base].start)
        if len(parts) == 1:
            return parts[0]
        return torch.cat([torch.arange(p.start, p.stop) if isinstance(p, slice) else p for p in parts])

    @final
    def _block(self, rows: Names, cols: Names) -> HessianOperator:
        for name in rows + cols:
            self.covered(name)
        sizes = {n: self.cfg.param_size(n) for n in rows + cols}
        if len(rows) == len(cols) == 1 and self.term not in self.formed:
            alone = self._alone(rows[0], cols[0])
            if alone is not None:
                return DenseOperator(alone, rows, cols, sizes, self.term)
        matrix, r, c = self.dense(), self._index(rows), self._index(cols)
        block = matrix[r][:, c] if isinstance(c, Tensor) else matrix[r, c]
        return DenseOperator(block, rows, cols, sizes, self.term)

    @final
    def _transpose(self) -> HessianOperator:
        return self  # a term over names × names is symmetric

    @final
    def block_names(self, by_head: bool = True) -> Names:
        return head_blocks(self.cfg, self.names, by_head)


class ClosedFormEngine(DenseEngine):
    """A closed-form dense engine (:class:`~hessviz.dense.assembly.DenseHessian`,
    :class:`~hessviz.dense.stack.StackHessian`): ``outer`` and ``functional`` are assembled, ``full``
    is their sum."""

    order = PARTS_FIRST
    label = "closed_form"
