r"""``hv.model_hessian``: products with the Hessian of a whole model under its own objective.

A batch ``ids (B, L)`` of equal-length sequences has the objective
``ℓ = (1/B) Σ_β ℓ_β(Z_β)``, ``Z_β`` the last layer's output for sequence ``β`` (each sequence its
own embeddings ``X0_β`` through the same weights). For ``"next_token"`` this is the mean over the
``B·(L−1)`` predicted tokens, as ``…ForCausalLM(labels=ids)`` computes it. So

.. math::
    H = \frac1B \sum_β H_β, \qquad H_β = ∇^2_θ\, ℓ_β(\mathrm{stack}(X0_β; θ)),

and each ``H_β`` is the existing stack machinery: ``hv.hessian(stack cfg, params, X0_β,
loss=hv.CustomLoss(∇_Z ℓ_β, ∇²_Z ℓ_β))`` with the objective's closed form in ``Z``
(:mod:`hessviz.whole.objective`). A product ``H V`` is the ``B`` per-sequence matrix-free products
(one tape sweep each), summed in order with weight ``1/B``; nothing of size ``P × P`` is formed.
The terms split at ``Z``: ``outer`` carries the objective's curvature in ``Z`` (final norm and head
included), ``functional`` the layers' second derivatives.

:class:`ModelHessian` answers ``names``, ``size``, ``matvec``, ``linear_operator``,
``block_operator``, ``gradient``, and the spectral tools of :mod:`hessviz.matfree`
(``top_eigenvalues``, ``eigenpairs``, ``density``, ``trace``, ``block_table``) take it as they
take a one-block result: they read its ``cfg``, ``names`` and ``products``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator
from torch import Tensor

from hessviz.api import _tape_gradient, forward, hessian
from hessviz.config import BlockConfig
from hessviz.errors import ConfigError, InputError
from hessviz.matfree.layout import Layout
from hessviz.matfree.operator import MatrixFreeHessian
from hessviz.pretrained.objectives import LMHead
from hessviz.result import HessianResult
from hessviz.terms import check_term
from hessviz.whole.model import Model
from hessviz.whole.objective import Classifier, sequence_loss

OBJECTIVES = ("next_token",)
"""The objectives named by a string; a :class:`~hessviz.whole.objective.Classifier` is the other kind."""


class BatchProducts(MatrixFreeHessian):
    """``(1/B) Σ_β H_β V``: the per-sequence products of ``parts``, summed in order.

    Answers what :class:`~hessviz.matfree.operator.MatrixFreeHessian` does (``layout``,
    ``product``, ``matvec``, ``linear_operator``) for the stack ``cfg``."""

    def __init__(self, cfg: BlockConfig, parts: list[MatrixFreeHessian], names: tuple[str, ...]):
        self.cfg, self.parts, self.names = cfg, parts, names
        self.X = parts[0].X
        self.weight = 1.0 / len(parts)
        self.matvecs = 0

    def product(self, V: Tensor, term: str, rows: Layout, cols: Layout) -> Tensor:
        out = None
        for part in self.parts:
            p = part.product(V, term, rows, cols)
            out = p.mul_(self.weight) if out is None else out.add_(p, alpha=self.weight)
        self.matvecs += V.shape[0]
        return out


@dataclass(frozen=True, eq=False)
class Problem:
    """Everything a whole-model Hessian is built from, picklable (what an executor's worker gets):
    the stack ``cfg`` fitted to the ids, its weights, the ids ``(B, L)``, the embeddings' outputs,
    the objective, the model's head (``None`` for an encoder) and the checked names."""

    cfg: BlockConfig
    params: dict[str, Tensor] = field(repr=False)
    ids: Tensor
    X0: list[Tensor] = field(repr=False)
    objective: str | Classifier
    head: LMHead | None = field(repr=False)
    names: tuple[str, ...]
    token: str = field(default_factory=lambda: uuid.uuid4().hex, repr=False)
    """Names this problem across processes (a worker builds it once per token)."""

    def build(self) -> ModelHessian:
        parts, values = [], []
        for b, X0 in enumerate(self.X0):
            Z = forward(self.cfg, self.params, X0)
            loss, value = sequence_loss(self.objective, Z, self.ids[b], b, self.head)
            parts.append(hessian(self.cfg, self.params, X0, loss=loss, wrt=self.names))
            values.append(value)
        return ModelHessian(self, parts, torch.stack(values).mean())


class ModelHessian:
    """Products with the Hessian of a whole model's objective in ``names`` (see the module docstring).

    ``names`` are the public names (``l{i}.W_Q[h]``); ``cfg`` and ``products`` are the stack's own
    (for a one-layer model ``cfg`` spells its names without the ``l0.`` prefix)."""

    def __init__(self, problem: Problem, parts: list[HessianResult], value: Tensor):
        self.problem, self.parts, self.value = problem, parts, value
        self.cfg = problem.cfg
        self.names = problem.names
        self.products = BatchProducts(self.cfg, [r.products for r in parts], self.names)

    @property
    def size(self) -> int:
        return sum(self.cfg.param_size(n) for n in self.names)

    @property
    def public_names(self) -> tuple[str, ...]:
        return tuple(_public(self.cfg, n) for n in self.names)

    def _names(self, names: Sequence[str] | str | None) -> tuple[str, ...] | None:
        return None if names is None else _internal(self.cfg, names)

    def matvec(self, v: Tensor | np.ndarray, term: str = "full", rows: Sequence[str] | None = None,
               cols: Sequence[str] | None = None) -> Tensor:
        """``H v`` for ``v (P',)`` or ``(P', k)``; ``rows``/``cols`` restrict to a block."""
        return self.products.matvec(v, term, self._names(rows), self._names(cols))

    def linear_operator(self, term: str = "full") -> LinearOperator:
        """``term`` over ``names`` as a float64 scipy ``LinearOperator``."""
        return self.products.linear_operator(term)

    def block_operator(self, rows: Sequence[str] | str, cols: Sequence[str] | str | None = None,
                       term: str = "full") -> LinearOperator:
        """``H[rows, cols]`` (``cols`` defaults to ``rows``: a diagonal block) as a ``LinearOperator``."""
        r = self._names(rows)
        return self.products.linear_operator(term, r, r if cols is None else self._names(cols))

    def gradient(self, names: Sequence[str] | str | None = None) -> dict[str, Tensor]:
        """``∂ℓ/∂W`` per name (public names; default ``names``), the mean over the sequences."""
        inner = self.names if names is None else self._names(names)
        return {_public(self.cfg, n): t for n, t in self.stack_gradient(inner).items()}

    def stack_gradient(self, inner: tuple[str, ...]) -> dict[str, Tensor]:
        """:meth:`gradient` for names as ``cfg`` spells them (checked, θ order), keyed the same way."""
        out: dict[str, Tensor] = {}
        for res in self.parts:
            g = _tape_gradient(self.cfg, res.products.tape, inner)
            for n, t in g.items():
                out[n] = t / len(self.parts) if n not in out else out[n].add_(t, alpha=1.0 / len(self.parts))
        return out

    def dense(self, term: str = "full") -> Tensor:
        """The dense ``(P', P')`` term, only on request and under the memory guard of each sequence's
        :class:`~hessviz.result.HessianResult`."""
        check_term(term)
        return sum(getattr(r, term) for r in self.parts) / len(self.parts)

    @cached_property
    def info(self) -> str:
        B, L = self.problem.ids.shape
        objective = self.problem.objective
        what = objective if isinstance(objective, str) else f"Classifier({objective.pooling})"
        return f"{what} over {B} × {L} tokens, {len(self.names)} tensors, P' = {self.size}"


def _public(cfg: BlockConfig, name: str) -> str:
    return name if cfg.is_stack else f"l0.{name}"


def _internal(cfg: BlockConfig, names: Sequence[str] | str) -> tuple[str, ...]:
    """Public names (``l{i}.…``) as the stack ``cfg`` spells them, checked and in θ order."""
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names:
        raise ConfigError("wrt must name at least one layer weight, e.g. 'l0.W_Q' or 'l0.W_Q[1]'")
    head = [n for n in names if isinstance(n, str) and n.startswith("head.")]
    if head:
        raise ConfigError(f"wrt name {head[0]!r}: the head's weights as parameters are not computed yet; "
                          "wrt takes layer weights (l{i}.…), the Classifier's W and b stay constants")
    if not cfg.is_stack:
        bad = [n for n in names if not (isinstance(n, str) and n.startswith("l0."))]
        if bad:
            raise ConfigError(f"wrt name {bad[0]!r} is not a layer weight of this one-layer model: names are "
                              "'l0.W_Q', 'l0.W_Q[1]', …")
        names = tuple(n[3:] for n in names)
    return cfg.sort_names(names)


def problem(model: Model, ids: object, objective: str | Classifier = "next_token",
            wrt: Sequence[str] | str | None = None) -> Problem:
    """The checked inputs of :func:`model_hessian`, embeddings computed."""
    if not isinstance(model, Model):
        raise InputError(f"model must be hv.load_model(source)'s Model, got {type(model).__name__}")
    if isinstance(objective, Classifier):
        ids = model.check_ids(ids)
        objective.check_model(model.cfg.d_model, ids.shape[0], model.causal)
    elif objective in OBJECTIVES:
        if model.head is None:
            raise InputError(f"objective='next_token' needs a decoder's LM head; {model.name!r} is an "
                             "encoder without one: use objective=hv.Classifier(W, b, labels, pooling)")
        ids = model.check_ids(ids, need=2)
    else:
        raise InputError(f"objective must be 'next_token' or an hv.Classifier(W, b, labels, pooling), got "
                         f"{objective!r}")
    cfg = dataclasses.replace(model.cfg, seq_len=ids.shape[1])
    names = cfg.param_names if wrt is None else _internal(cfg, wrt)
    return Problem(cfg, model.params, ids, model.embed(ids), objective, model.head, names)


def model_hessian(model: Model, ids: object, objective: str | Classifier = "next_token",
                  wrt: Sequence[str] | str | None = None) -> ModelHessian:
    """The Hessian of ``model``'s ``objective`` on ``ids`` (``(L,)`` or ``(B, L)``) in the layer
    weights ``wrt`` (``l{i}.W_Q[h]``; default every layer weight), as products."""
    return problem(model, ids, objective, wrt).build()
