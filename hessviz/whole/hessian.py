r"""``hv.model_hessian``: products with the Hessian of a whole model under its own objective.

A batch ``ids (B, L)`` of equal-length sequences has the objective
``ℓ = (1/B) Σ_β ℓ_β(Z_β)``, ``Z_β`` the last layer's output for sequence ``β`` (each sequence its
own embeddings ``X0_β`` through the same weights). For ``"next_token"`` this is the mean over the
``B·(L−1)`` predicted tokens, as ``…ForCausalLM(labels=ids)`` computes it. So

.. math::
    H = \frac1B \sum_β H_β, \qquad H_β = ∇^2_θ\, ℓ_β(\mathrm{stack}(X0_β; θ)),

and each ``H_β`` is the existing stack machinery: ``hv.hessian(stack cfg, params, X0_β,
loss=hv.CustomLoss(∇_Z ℓ_β, ∇²_Z ℓ_β))`` with the objective's closed form in ``Z``
(:mod:`hessviz.losses`). A product ``H V`` is the ``B`` per-sequence matrix-free products
(one tape sweep each), summed in order with weight ``1/B``; nothing of size ``P × P`` is formed.
The terms split at ``Z``: ``outer`` carries the objective's curvature in ``Z`` (final norm and head
included), ``functional`` the layers' second derivatives.

:class:`ModelHessian` answers ``names``, ``size``, ``operator`` (a :class:`BatchOperator`; ``matvec``,
``linear_operator`` and ``block_operator`` over it, :class:`~hessviz.result.OperatorResult`),
``gradient``, and the spectral tools of :mod:`hessviz.matfree`
(``top_eigenvalues``, ``eigenpairs``, ``density``, ``trace``, ``block_table``) take it as they
take a one-block result: they read its ``cfg``, ``names`` and ``products``.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import final

import numpy as np
import torch
from torch import Tensor

from hessviz.api import _tape_gradient, forward, hessian, hessian_bytes
from hessviz.block.config import BlockConfig
from hessviz.block.terms import check_term
from hessviz.dense.stack import StackHessian
from hessviz.errors import ConfigError, InputError
from hessviz.losses import HEAD_B, HEAD_NAMES, HEAD_W, Classifier, CustomLoss, HeadTerms, LMHead, Loss
from hessviz.losses.names import name as objective_name
from hessviz.losses.names import whole_objective
from hessviz.products import graphs, lockstep
from hessviz.products import tape as sweeps
from hessviz.products.block import build_at_output
from hessviz.products.checkpoint import Checkpoints
from hessviz.products.hessian_operator import HessianOperator, ProductsOperator
from hessviz.products.layout import Layout
from hessviz.products.operator import BATCH, MatrixFreeHessian, TapeOperator, sweep_in_batches
from hessviz.products.tape import Tape, adjoint_tangents
from hessviz.result import HessianResult, OperatorResult
from hessviz.runtime import pages
from hessviz.whole.model import Model
from hessviz.whole.ranks import ONE, Ranks, agree, all_succeeded, ranks


class WholeLayout:
    """The columns of ``θ'`` for a whole model's names: the stack's :class:`Layout` first, then the
    classifier's ``head.W`` ``(d, C)`` and ``head.b`` ``(C,)`` named among them, in that order."""

    def __init__(self, stack: Layout, heads: tuple[str, ...], shapes: dict[str, tuple[int, ...]]):
        self.stack, self.heads = stack, heads
        self.names = stack.names + heads
        self.shapes = {h: shapes[h] for h in heads}
        self.columns, start = {}, stack.size
        for h in heads:
            n = int(np.prod(self.shapes[h]))
            self.columns[h] = slice(start, start + n)
            start += n
        self.size = start


@final
class BatchOperator(ProductsOperator):
    """A whole model's engine, ``(k, |cols|) -> (k, |rows|)``: ``(1/B) Σ_β H_β V``, the per-sequence
    products scaled and added into one output in order (the weights' products by their GEMMs, in
    place: no per-sequence ``P'``-sized vector; in one lockstep or checkpointed sweep when the
    tapes allow), then summed over the ranks. With the head's weights among the names, the ``full``
    term only (:func:`head_product`)."""

    products: BatchProducts
    row_layout: WholeLayout
    col_layout: WholeLayout

    def _matmat(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        batch, term, rows, cols = self.products, self.term, self.row_layout, self.col_layout
        if rows.heads or cols.heads:
            if term != "full":
                named = ", ".join(dict.fromkeys(rows.heads + cols.heads))
                raise ConfigError(
                    f"term {term!r} with the head's weights ({named}): "
                    "the outer/functional split is at Z, which the head's weights are not "
                    "behind; use term='full'"
                )
            total = None
            for part, terms in zip(batch.parts, batch.terms):
                p = (
                    torch.cat([head_product(part, terms, c, rows, cols) for c in V.split(BATCH)])
                    if V.shape[0]
                    else V.new_zeros(0, rows.size)
                )
                total = p.mul_(batch.weight) if total is None else total.add_(p, alpha=batch.weight)
            total = _zero(V, rows, out) if total is None else total if out is None else out.copy_(total)
        else:  # every sequence's product scaled and added into one (k, P') output, in place
            total = _zero(V, rows, out) if not batch.parts else out
            if total is None:
                total = pages.empty((V.shape[0], rows.size), V)
            if batch.parts and (batch.checkpoints is not None or batch.lockstep(V)):
                self._lockstep(V, rows.stack, cols.stack, total)
            else:
                for b, one in enumerate(self._sequences):
                    one.scaled(V, total, batch.weight, accumulate=b > 0)
            for part in batch.parts:
                part.matvecs += V.shape[0]
        return batch.ranks.all_reduce_(total)

    @cached_property
    def _sequences(self) -> list[TapeOperator]:
        """Each sequence's closed-form engine on this operator's layer rows and columns."""
        rows, cols = self.row_layout.stack.names, self.col_layout.stack.names
        return [TapeOperator(part, self.term, rows, cols) for part in self.products.parts]

    def _lockstep(self, V: Tensor, rows: Layout, cols: Layout, out: Tensor) -> None:
        """``out = (1/B) Σ_β H_β V`` over this rank's sequences in one lockstep sweep per ``BATCH``
        columns (:func:`hessviz.products.tape.sweep` of the tapes side by side; checkpointed,
        :meth:`hessviz.products.checkpoint.Checkpoints.sweep`)."""
        batch, term = self.products, self.term
        if batch.checkpoints is not None:
            swept = batch.checkpoints.sweep
        else:
            swept = functools.partial(sweeps.sweep, [p.sweep_tape for p in batch.parts])

        def sweep(dparams: dict[str, Tensor], wanted: tuple[str, ...], into: dict[str, Tensor]) -> dict:
            return swept(dparams, term, wanted, into, batch.weight)

        sweep_in_batches(V, out, rows, cols, sweep, batch.weight)


@final
class BatchProducts:
    """A whole model's products at its point (a :class:`~hessviz.products.hessian_operator.Products`):
    the per-sequence states ``parts`` of the stack ``cfg`` (each a
    :class:`~hessviz.products.operator.MatrixFreeHessian`), the names (a classifier's ``head.W`` /
    ``head.b`` among them: ``terms``, each sequence's :class:`~hessviz.losses.HeadTerms`; ``head``,
    the classifier's ``W (d, C)``, ``None`` for ``"next_token"``), the weight ``1/B`` (``B`` counts
    every rank's sequences), the ranks ``ranks`` (:mod:`hessviz.whole.ranks`) and, checkpointed, the
    :class:`~hessviz.products.checkpoint.Checkpoints`. Its engine is :class:`BatchOperator`. ``like``
    gives the dtype and device (a rank without sequences has no ``X``)."""

    engine = BatchOperator

    def __init__(
        self,
        cfg: BlockConfig,
        parts: list[MatrixFreeHessian],
        names: tuple[str, ...],
        terms: list[HeadTerms | None] | None = None,
        *,
        like: Tensor,
        head: Tensor | None = None,
        sequences: int | None = None,
        ranks: Ranks = ONE,
        checkpoints: Checkpoints | None = None,
    ):
        self.cfg, self.parts, self.names = cfg, parts, names
        self.checkpoints = checkpoints
        self.terms = terms or [None] * len(parts)
        self.X = parts[0].X if parts else like
        first = self.terms[0] if parts else None
        self.head = head if head is not None or first is None else first.W
        self.weight = 1.0 / (len(parts) if sequences is None else sequences)
        self.ranks = ranks
        self.matvecs = 0
        self._same_nodes: bool | None = None

    def layout(self, names: Sequence[str] | None = None) -> WholeLayout:
        stack, heads = _partition(self.names if names is None else names)
        if heads and self.head is None:
            raise ConfigError(f"wrt name {heads[0]!r}: only an hv.Classifier objective has a head W and b")
        shapes = {} if self.head is None else {HEAD_W: tuple(self.head.shape), HEAD_B: (self.head.shape[1],)}
        return WholeLayout(Layout(self.cfg, self.cfg.sort_names(stack)), heads, shapes)

    def lockstep(self, V: Tensor) -> bool:
        """Whether the sequences' sweeps can run as one (:mod:`hessviz.products.lockstep`): tapes of
        the same nodes, and no CUDA-graph replay to keep (a GPU's per-sequence replays)."""
        if len(self.parts) < 2:
            return False
        if any(p.replay for p in self.parts) and graphs.enabled(V):
            return False
        if self._same_nodes is None:
            self._same_nodes = lockstep.same_nodes([p.sweep_tape for p in self.parts])
        return self._same_nodes


def _zero(V: Tensor, rows: WholeLayout, out: Tensor | None) -> Tensor:
    """The product of a rank without sequences: zeros, ``(k, |rows|)`` (into ``out`` when given)."""
    return V.new_zeros(V.shape[0], rows.size) if out is None else out.zero_()


def head_product(
    part: MatrixFreeHessian, terms: HeadTerms, V: Tensor, rows: WholeLayout, cols: WholeLayout
) -> Tensor:
    """``(k, |cols|) -> (k, |rows|)`` of one sequence with the head's weights among the names: the
    stack's tangents ``Ż`` of ``V``'s layer columns, the sweep seeded with ``∇²_Z ℓ Ż`` plus the mixed
    seed of the head's columns (:meth:`HeadTerms.seed`) for the layer rows, :meth:`HeadTerms.head_part`
    for the head's rows. The sequence's whole tape (every token: the head terms pool over them) is
    read only when a layer's weights are among the rows or columns."""
    k = V.shape[0]
    V = V.contiguous()
    head = {h: V[:, cols.columns[h]].reshape(k, *cols.shapes[h]) for h in cols.heads}
    dW, db = head.get(HEAD_W), head.get(HEAD_B)
    dparams = cols.stack.scatter(V[:, : cols.stack.size].contiguous()) if cols.stack.size else {}
    tape = part.tape if dparams or rows.stack.size else None
    dvals = tape.tangents(tape.whole, {}, dparams) if dparams else {}
    dZ = dvals.get(tape.output) if dparams else None
    out = V.new_zeros(k, rows.size)
    if rows.stack.size:
        seed = None if dZ is None else tape.loss_hvp(dZ)
        mixed = terms.seed(dW, db, terms.w.shape[0])
        seed = mixed if seed is None else (seed if mixed is None else seed + mixed)
        prods = adjoint_tangents(
            [tape], tape.whole, [dvals], dparams, [{tape.output: seed}], True, rows.stack.bases
        )[0]
        out[:, : rows.stack.size] = rows.stack.gather(prods, k, V)
    if rows.heads:
        got = terms.head_part(None if dZ is None else terms.pooled(dZ), dW, db)
        for h in rows.heads:
            out[:, rows.columns[h]] = got[h].reshape(k, -1)
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
    objective: Loss
    head: LMHead | None = field(repr=False)
    names: tuple[str, ...]
    token: str = field(default_factory=lambda: uuid.uuid4().hex, repr=False)
    """Names this problem across processes (a worker builds it once per token)."""
    heads: tuple[str, ...] = ()
    """The classifier's weights among the names (``"head.W"``, ``"head.b"``), after the layers'."""
    checkpoint: bool = False
    """Keep each layer's input only and rebuild the layers per product (:meth:`build`)."""

    def build(self, ranks: Ranks = ONE, sequences: int | None = None) -> ModelHessian:
        """The :class:`ModelHessian` of these sequences; over ``ranks``, of the union of every
        rank's, ``sequences`` in all (default: these alone). Over several ranks its ``value`` is this
        rank's share until :func:`model_hessian` sums it (after every rank has built its part).
        With :attr:`checkpoint` (a stack), the sequences keep their layers' inputs only and each
        product rebuilds the layers (:class:`~hessviz.products.checkpoint.Checkpoints`)."""
        parts, values, terms = [], [], []
        points = None
        if self.checkpoint and self.cfg.is_stack:
            got: list[dict[str, object]] = [{} for _ in self.X0]
            points = Checkpoints(self.cfg, self.params, self.X0, lambda b, Z: self._loss_at(b, got[b])(Z))
            for b, (X0, loss) in enumerate(zip(self.X0, points.losses)):
                parts.append(self._part(X0, loss))
                values.append(got[b]["value"])
                terms.append(got[b]["head"])
        else:
            fused: dict = {}  # the concatenated weights, one copy for every sequence's tape
            for b, X0 in enumerate(self.X0):
                part, value, head = self.sequence(b, X0, fused)
                parts.append(part)
                values.append(value)
                terms.append(head)
        like = next(iter(self.params.values()))
        sequences = len(parts) if sequences is None else sequences
        value = (torch.stack(values).sum() if values else like.new_zeros(())) / sequences
        return ModelHessian(self, parts, value, terms, ranks=ranks, sequences=sequences, checkpoints=points)

    def sequence(
        self, b: int, X0: Tensor, fused: dict | None = None
    ) -> tuple[HessianResult, Tensor, HeadTerms | None]:
        """Sequence ``b``'s :class:`HessianResult`, objective value and head terms.

        A stack is built from one forward pass of nodes
        (:func:`~hessviz.products.block.build_at_output`): its ``Z`` gives the objective and its
        nodes the tape, with no dense-path forward and no second check of the model's weights
        (checked once when loaded). A one-layer model goes through ``hv.hessian`` (whose dense
        engine it may take)."""
        if not self.cfg.is_stack:
            Z = forward(self.cfg, self.params, X0)
            loss, value, head = self.objective.sequence_terms(Z, self.ids[b], b, self.head)
            return hessian(self.cfg, self.params, X0, loss=loss, wrt=self._wrt), value, head
        got: dict[str, object] = {}
        tape, loss = build_at_output(self.cfg, self.params, X0, self._loss_at(b, got), fused)
        return self._part(X0, loss, tape), got["value"], got["head"]

    @property
    def _wrt(self) -> tuple[str, ...]:
        return self.names or self.cfg.param_names[:1]  # the tape is the same whatever is named

    def _loss_at(self, b: int, got: dict[str, object]) -> Callable[[Tensor], CustomLoss]:
        """Sequence ``b``'s objective as a function of its ``Z``, its value and head terms put in ``got``."""

        def loss_at(Z: Tensor) -> CustomLoss:
            loss, got["value"], got["head"] = self.objective.sequence_terms(Z, self.ids[b], b, self.head)
            own = type(self.objective).__dict__.get("exact_curvature", False)  # not a subclass's
            return loss.checked(self.cfg.seq_len, self.cfg.d_model, Z.dtype, Z.device, Z, probe=not own)

        return loss_at

    def _part(self, X0: Tensor, loss: CustomLoss, tape: Tape | None = None) -> HessianResult:
        """A stack sequence's :class:`HessianResult` under its objective ``loss``: its products'
        tape ``tape`` when built already, else built when first read (the dense terms, a head's
        rows)."""
        products = MatrixFreeHessian(self.cfg, self.params, X0, loss, self._wrt)
        if tape is not None:
            products.__dict__["tape"] = tape  # the cached property, already built
        needed = hessian_bytes(self.cfg, self._wrt, X0.element_size(), "closed_form")
        tape_of = functools.partial(getattr, products, "tape")
        engine = StackHessian(self.cfg, self._wrt, self.params, tape_of, loss, X0, needed)
        return HessianResult(self.cfg, self._wrt, engine, method="closed_form", products=products)


@final
class ModelHessian(OperatorResult):
    """Products with the Hessian of a whole model's objective in ``names`` (see the module docstring).

    ``names`` are the public names (``l{i}.W_Q[h]``); ``cfg`` and ``products`` are the stack's own
    (for a one-layer model ``cfg`` spells its names without the ``l0.`` prefix)."""

    def __init__(
        self,
        problem: Problem,
        parts: list[HessianResult],
        value: Tensor,
        terms: list[HeadTerms | None] | None = None,
        *,
        ranks: Ranks = ONE,
        sequences: int | None = None,
        checkpoints: Checkpoints | None = None,
    ):
        self.problem, self.parts, self.value = problem, parts, value
        self.cfg = problem.cfg
        self.names = problem.names + problem.heads
        self.terms = terms or [None] * len(parts)
        self.ranks = ranks
        self.sequences = len(parts) if sequences is None else sequences
        """Sequences of the whole batch (every rank's)."""
        objective = problem.objective
        self.products = BatchProducts(
            self.cfg,
            [r.products for r in parts],
            self.names,
            self.terms,
            like=next(iter(problem.params.values())),
            sequences=self.sequences,
            ranks=ranks,
            head=objective.W if isinstance(objective, Classifier) else None,
            checkpoints=checkpoints,
        )

    @property
    def size(self) -> int:
        return self.products.layout().size

    def param_size(self, name: str) -> int:
        """Entries of one name (a layer weight or slice as ``cfg`` spells it, or ``head.W``/``head.b``)."""
        return self.products.layout((name,)).size

    @property
    def public_names(self) -> tuple[str, ...]:
        return tuple(_public(self.cfg, n) for n in self.names)

    def _names(self, names: Sequence[str] | str | None) -> tuple[str, ...] | None:
        return None if names is None else _internal(self.cfg, names)

    def operator(self, term: str = "full") -> HessianOperator:
        """``term`` over :attr:`names` as a :class:`~hessviz.products.hessian_operator.HessianOperator`
        ``(P', P')``, its names and blocks in the public spelling (``l{i}.W_Q[h]``, ``head.W``)."""
        check_term(term)
        names = self.public_names
        return BatchOperator(
            self.products,
            term,
            names,
            names,
            functools.partial(_internal, self.cfg),
            functools.partial(_public, self.cfg),
            source=self,
        )

    def gradient(self, names: Sequence[str] | str | None = None) -> dict[str, Tensor]:
        """``∂ℓ/∂W`` per name (public names; default ``names``), the mean over the sequences."""
        inner = self.names if names is None else self._names(names)
        return {_public(self.cfg, n): t for n, t in self.stack_gradient(inner).items()}

    def stack_gradient(self, inner: tuple[str, ...]) -> dict[str, Tensor]:
        """:meth:`gradient` for names as ``cfg`` spells them (checked, θ order; ``head.W``, ``head.b``
        last), keyed the same way."""
        stack, heads = _partition(inner)
        layout = self.products.layout(stack + heads)  # refuses head names without a head
        flat = self.products.X.new_zeros(layout.size)
        w = 1.0 / self.sequences
        layers = flat[: layout.stack.size]  # the layers' columns come first
        if stack and self.products.checkpoints is not None:
            self._checkpointed_gradient(self.products.checkpoints, stack, layers, w)
        elif stack:
            scratch = flat.new_empty(layout.stack.size)  # one sequence's, reused
            for res in self.parts:
                _tape_gradient(self.cfg, res.products.sweep_tape, stack, out=scratch)
                layers.add_(scratch, alpha=w)
        for terms in self.terms:
            for h in heads:
                flat[layout.columns[h]].add_(terms.gradient[h].reshape(-1), alpha=w)
        self.ranks.all_reduce_(flat)
        out = {h: flat[layout.columns[h]].reshape(layout.shapes[h]) for h in heads}
        out |= {n: flat[cols].reshape(self.cfg.shape_of(n)) for n, cols in self.cfg.offsets(stack).items()}
        return out

    def _checkpointed_gradient(
        self, points: Checkpoints, stack: tuple[str, ...], flat: Tensor, w: float
    ) -> None:
        """``flat (P',) += w Σ_β ∂ℓ_β/∂θ`` of the layer names ``stack`` (θ order), each layer's
        tapes rebuilt once for all its names (:meth:`Checkpoints.tapes`)."""
        offsets = self.cfg.offsets(stack)
        by_layer: dict[int, list[str]] = {}
        for n in stack:
            by_layer.setdefault(self.cfg.layer_of(n)[0], []).append(n)
        for layer, names in by_layer.items():
            for tape in points.tapes(layer):
                for n, g in _tape_gradient(self.cfg, tape, tuple(names)).items():
                    flat[offsets[n]].add_(g.reshape(-1), alpha=w)

    def dense(self, term: str = "full") -> Tensor:
        """The dense ``(P', P')`` term, only on request and under the memory guard of each sequence's
        :class:`~hessviz.result.HessianResult`."""
        check_term(term)
        if self.problem.heads:
            raise ConfigError(
                "dense is the layers' Hessian only; with head.W / head.b among the names take "
                "res.matvec(torch.eye(res.size))"
            )
        total = (
            sum(getattr(r, term) for r in self.parts) / self.sequences
            if self.parts
            else self.products.X.new_zeros(self.size, self.size)
        )
        return self.ranks.all_reduce_(total)

    @cached_property
    def info(self) -> str:
        B, L = self.sequences, self.problem.ids.shape[1]
        objective = self.problem.objective
        return (
            f"{objective_name(objective)} over {B} × {L} tokens, {len(self.names)} tensors, P' = {self.size}"
        )


def _public(cfg: BlockConfig, name: str) -> str:
    return name if cfg.is_stack or name in HEAD_NAMES else f"l0.{name}"


def _partition(names: Sequence[str] | str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Names as ``cfg`` spells them split into ``(layer names, head names in HEAD_NAMES order)``."""
    names = (names,) if isinstance(names, str) else tuple(names)
    return tuple(n for n in names if n not in HEAD_NAMES), tuple(h for h in HEAD_NAMES if h in names)


def _split(cfg: BlockConfig, names: Sequence[str] | str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Public names as ``(layer names as cfg spells them, checked and in θ order; head names in
    HEAD_NAMES order)``."""
    names = (names,) if isinstance(names, str) else tuple(names)
    heads = [n for n in names if isinstance(n, str) and n.startswith("head.")]
    for h in heads:
        if h not in HEAD_NAMES:
            raise ConfigError(
                f"wrt name {h!r}: the head's parameters are {', '.join(map(repr, HEAD_NAMES))} "
                "(an hv.Classifier's W and b)"
            )
    if len(set(heads)) != len(heads):
        raise ConfigError(f"wrt must not repeat a name, got {names}")
    rest = tuple(n for n in names if n not in heads)
    stack = _internal(cfg, rest) if rest or not heads else ()
    return stack, tuple(h for h in HEAD_NAMES if h in heads)


def _internal(cfg: BlockConfig, names: Sequence[str] | str) -> tuple[str, ...]:
    """Public names (``l{i}.…``) as the stack ``cfg`` spells them, checked and in θ order (names
    already in ``cfg``'s spelling pass; ``head.W``/``head.b`` go last, see :func:`_split`)."""
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names:
        raise ConfigError("wrt must name at least one layer weight, e.g. 'l0.W_Q' or 'l0.W_Q[1]'")
    if any(isinstance(n, str) and n.startswith("head.") for n in names):
        stack, heads = _split(cfg, names)
        return stack + heads
    if not cfg.is_stack:
        bad = [n for n in names if not (isinstance(n, str) and n.startswith("l0."))]
        if bad:
            raise ConfigError(
                f"wrt name {bad[0]!r} is not a layer weight of this one-layer model: names are "
                "'l0.W_Q', 'l0.W_Q[1]', …"
            )
        names = tuple(n[3:] for n in names)
    return cfg.sort_names(names)


def problem(
    model: Model,
    ids: object,
    objective: str | Loss = "next_token",
    wrt: Sequence[str] | str | None = None,
    empty: bool = False,
    checkpoint: bool = False,
) -> Problem:
    """The checked inputs of :func:`model_hessian`, embeddings computed; ``empty``: ``ids`` of shape
    ``(0, L)`` (a rank without sequences) are allowed; ``checkpoint``: :attr:`Problem.checkpoint`.
    The objective becomes an object here, once (:func:`~hessviz.losses.names.whole_objective`):
    nothing below reads the string."""
    if not isinstance(model, Model):
        raise InputError(f"model must be hv.load_model(source)'s Model, got {type(model).__name__}")
    if not isinstance(checkpoint, bool):
        raise InputError(f"checkpoint must be True or False, got {checkpoint!r}")
    objective = whole_objective(objective)
    need = 1 if isinstance(objective, Classifier) else 2
    if (
        empty
        and isinstance(ids, Tensor)
        and ids.dim() == 2
        and ids.shape[0] == 0
        and not ids.is_floating_point()
    ):
        ids = model.check_ids(torch.zeros(1, ids.shape[1], dtype=torch.int64), need=need)[:0]
    else:
        ids = model.check_ids(ids, need=need)
    if isinstance(objective, Classifier):
        objective.check_model(model.cfg.d_model, ids.shape[0], model.causal)
    elif model.head is None or model.head.embedding.shape[0] == 0:
        raise InputError(
            f"objective='next_token' needs a decoder's LM head; {model.name!r} has none "
            "(an encoder, a base model or a classifier): use objective=hv.Classifier(W, b, "
            "labels, pooling)"
        )
    cfg = dataclasses.replace(model.cfg, seq_len=ids.shape[1])
    names, heads = (cfg.param_names, ()) if wrt is None else _split(cfg, wrt)
    if heads and not isinstance(objective, Classifier):
        raise ConfigError(
            f"wrt name {heads[0]!r}: objective {objective_name(objective)!r} has no head W and b; name them "
            "with objective=hv.Classifier(W, b, labels, pooling)"
        )
    device = next(iter(model.params.values())).device  # the embeddings are read on the host
    X0 = [x.to(device) for x in model.embed(ids)]
    return Problem(
        cfg, model.params, ids, X0, objective, model.head, names, heads=heads, checkpoint=checkpoint
    )


def model_hessian(
    model: Model,
    ids: object,
    objective: str | Loss = "next_token",
    wrt: Sequence[str] | str | None = None,
    group: object | None = None,
    checkpoint: bool = False,
) -> ModelHessian:
    """The Hessian of ``model``'s ``objective`` on ``ids`` (``(L,)`` or ``(B, L)``) in the layer
    weights ``wrt`` (``l{i}.W_Q[h]``; default every layer weight) and, for a :class:`Classifier`,
    its ``"head.W"`` / ``"head.b"`` when named (after the layers' in ``θ'``), as products.

    ``checkpoint=True`` keeps of each sequence only its layers' inputs and their outputs' adjoints,
    and every product and gradient rebuilds one layer at a time
    (:mod:`hessviz.products.checkpoint`): the memory of one layer's activations instead of every
    layer's (at GPT-2 small's size, ≈ 2.2 MB per token → ≈ 0.2), for ≈ 1.8× the time per product.
    The same numbers either way. (The dense terms and a classifier head's rows build the whole
    tape when asked.)

    When ``torch.distributed`` is initialised, ``ids`` (and a classifier's labels) are this rank's
    sequences (``(0, L)`` for none) and the result is that of every rank's sequences in ``group``
    (default: the world), the same on every rank (:mod:`hessviz.whole.ranks`). Every rank must
    call this with the same ``wrt``, objective, dtype and sequence length: otherwise every rank
    raises the same :class:`~hessviz.errors.InputError`, before any product."""
    where = ranks(group)
    try:
        prob, error = problem(model, ids, objective, wrt, empty=where.spread, checkpoint=checkpoint), None
    except (InputError, ConfigError) as e:
        if not where.spread:
            raise
        prob, error = None, e
    fields = (
        None
        if prob is None
        else {
            "sequences": prob.ids.shape[0],
            "sequence length": prob.ids.shape[1],
            "wrt": prob.names + prob.heads,
            "objective": describe(prob.objective),
            "dtype": model.dtype,
            "model": dataclasses.replace(model.cfg, seq_len=1),
        }
    )
    counts = agree(where, fields, error)
    if sum(counts) == 0:
        raise InputError("ids: every rank's batch is empty; at least one sequence is needed")
    try:
        res, error = prob.build(where, sum(counts)), None
    except (InputError, ConfigError) as e:
        if not where.spread:
            raise
        res, error = None, e
    all_succeeded(where, error, "building the sequences' tapes")
    res.value = where.all_reduce_(res.value.reshape(1))[0]
    return res


def describe(objective: Loss) -> str:
    """The objective as the ranks compare it: its name, or a classifier's pooling, shape and a digest
    of its ``W`` and ``b`` (not its labels: each rank has its own)."""
    if not isinstance(objective, Classifier):
        return objective_name(objective)
    w = torch.cat([objective.W.detach().reshape(-1), objective.b.detach().reshape(-1)]).to(torch.float64)
    return (
        f"Classifier({objective.pooling}, W {tuple(objective.W.shape)}, sum {float(w.sum()):.17g}, "
        f"square sum {float((w * w).sum()):.17g})"
    )
