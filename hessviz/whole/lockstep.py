r"""The top eigenvalues of several diagonal blocks ``H[t, t]`` of a whole model at once: one Lanczos
run per tensor (:func:`hessviz.matfree.lanczos.steps`, the run of
:func:`~hessviz.matfree.lanczos.extremes`), their products made together.

At each step every run still going asks for ``H_tt q_t``; the runs of one group (one layer's
tensors: :func:`groups`) are answered by one call. Two ways, the same numbers to round-off:

* **Split** (:func:`_split_products`, on the CPU): per sequence one
  :func:`~hessviz.products.tape.split_sweep`, each run's vector its own group of columns. A run's
  forward and reverse sweeps go through the nodes of its own tensor onward only (a zero tangent costs
  nothing) and give its own block's product only, while the objective's curvature, the head, is
  applied to every run's ``Ż`` in one call. SmolLM2's tied head, ``49152 × 576`` in float64, is most
  of a last-layer product, and its GEMMs run at a third of their cost a column at four columns
  (issue 47: four ``l29`` tensors' table 0.47 s against 0.53 s for the union's block below).
* **Union** (:func:`_shared_products`, a GPU's, replayed as one CUDA graph; a checkpointed model's;
  a classifier's head weights): the block ``H[U, U]``, ``U`` the union of the tensors of the runs
  still going, column ``j`` being ``q_{t_j}`` on ``t_j``'s entries and 0 elsewhere, of whose product
  only ``t_j``'s rows are read back,

  .. math::
      (H[U, U]\, (0, …, q_{t_j}, …, 0))[t_j] = H_{t_j t_j}\, q_{t_j}.

  Each column carries the tangents of the whole union (a zero tangent of another tensor is swept
  like any), which is why a group is one layer.

Either way a step costs one head for ``b`` columns instead of ``b`` heads, and a run leaves at the
step its own stopping test passes, with its own product count, so the union shrinks as runs converge.

Each run is :func:`~hessviz.matfree.lanczos.extremes`' own loop with the same arguments, so with
products equal to round-off (a column's product does not depend on the columns beside it, up to the
GEMMs' rounding) it takes the same steps and returns the same eigenvalue to round-off
(``tests/test_whole_hessian.py`` checks it against the one-tensor-at-a-time rows)"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator, Sequence

from torch import Tensor

from hessviz.losses import HEAD_NAMES
from hessviz.matfree.lanczos import Request, Ritz, steps
from hessviz.matfree.spectral import _operator
from hessviz.products import graphs
from hessviz.products.hessian_operator import HessianOperator
from hessviz.products.layout import Layout
from hessviz.products.operator import BATCH
from hessviz.products.tape import split_sweep
from hessviz.runtime import pages
from hessviz.whole.hessian import ModelHessian


def groups(res: ModelHessian, names: Sequence[str]) -> list[tuple[str, ...]]:
    """``names`` (as ``res.cfg`` spells them) grouped by layer, in their order of first appearance;
    the head's weights (``head.W``, ``head.b``) form a group of their own."""
    out: dict[object, list[str]] = {}
    for n in names:
        out.setdefault("head" if n in HEAD_NAMES else res.cfg.layer_of(n)[0], []).append(n)
    return [tuple(g) for g in out.values()]


def top_values(
    res: ModelHessian,
    names: Sequence[str],
    term: str,
    *,
    tol: float,
    seed: int,
    which: str = "top",
    bound: str = "residual",
    starts: dict[str, Tensor] | None = None,
    check: bool = False,
    progress: Callable[[int, str], None] | None = None,
) -> dict[str, Ritz]:
    """The ``which`` eigenvalue (``k = 1``) of each diagonal block ``H[t, t]`` of ``names`` (one
    group, as ``res.cfg`` spells them, each of size ≥ 2), every run's products shared
    (the module docstring). ``tol``, ``seed``, ``bound``, ``check``: as
    :func:`hessviz.matfree.spectral.eigenpairs` takes them, the same for each run; ``starts[t]``:
    run ``t``'s start (its gradient). ``progress(done, message)``: after each shared call and as
    each run ends, ``done`` the runs ended. Returns each tensor's :class:`Ritz` (``matvecs``: its
    own columns)."""
    starts = starts or {}
    like = res.products.X
    sizes = {t: res.param_size(t) for t in res.products.layout(tuple(names)).names}  # in θ' order
    runs: dict[str, Generator[Request, Tensor, Ritz]] = {}
    asked: dict[str, Request] = {}
    done: dict[str, Ritz] = {}
    for t in names:
        runs[t] = steps(
            sizes[t],
            1,
            which,
            tol=tol,
            seed=seed,
            like=like,
            ncv=None,
            max_restarts=300,
            vectors=False,
            check=check,
            reorth="auto",
            bound=bound,
            start=starts.get(t),
        )
        asked[t] = next(runs[t])
    calls, ops = 0, {}
    split = splits(res, names)
    if split:  # each run's own columns: its tensor's layout, made once
        lays = {t: res.products.layout((t,)).stack for t in names}
    else:
        shape = (len(names), sum(sizes.values()))  # k = 1: each run asks for one row at a time
        buffers = (like.new_zeros(shape), pages.empty(shape, like))
    while asked:
        products = (
            _split_products(res, term, asked, lays)
            if split
            else _shared_products(res, term, asked, sizes, ops, buffers)
        )
        calls += 1
        for t, HV in products.items():
            try:
                asked[t] = runs[t].send(HV)
            except StopIteration as stop:
                done[t] = stop.value
                del asked[t]
                if progress is not None:
                    progress(len(done), f"{t}: {done[t].matvecs} products")
        if progress is not None:
            progress(len(done), f"{calls} shared calls, {len(asked)} runs going")
    for t, r in done.items():
        if not r.converged:
            warnings.warn(
                f"{t}: Lanczos stopped after {r.restarts} restarts with residual "
                f"{float(r.residuals.max()):.2g} (tol {tol:g} relative)",
                RuntimeWarning,
                stacklevel=2,
            )
    return {t: done[t] for t in names}


def splits(res: ModelHessian, names: Sequence[str]) -> bool:
    """Whether a step's products go through :func:`_split_products` (each run's columns swept alone,
    the head shared): the CPU (a GPU replays the union's sweep as one CUDA graph instead), tapes kept
    whole (not checkpointed), and layer weights only (a classifier's ``head.W`` / ``head.b`` have
    their own product, :func:`~hessviz.whole.hessian.head_product`)."""
    batch = res.products
    return (
        not graphs.enabled(batch.X) and batch.checkpoints is None and not any(n in HEAD_NAMES for n in names)
    )


def _split_products(
    res: ModelHessian, term: str, asked: dict[str, Request], lays: dict[str, Layout]
) -> dict[str, Tensor]:
    """Every run's asked ``H_tt V_t``, ``(1/B) Σ_β`` over the sequences: per sequence one
    :func:`~hessviz.products.tape.split_sweep`, each run's rows its own group of columns (swept
    through the nodes of its own tensor onward, its own tensor's product alone), the objective's
    curvature applied to every run's ``Ż`` in one call; then summed over the ranks. Into each run's
    ``out`` when it gave one. ``lays[t]``: run ``t``'s tensor's columns (``res.products.layout((t,))``'s
    stack)."""
    batch = res.products
    names = list(asked)
    outs = {
        t: V.new_empty(V.shape[0], lays[t].size) if dest is None else dest for t, (V, dest) in asked.items()
    }
    if not batch.parts:  # a rank without sequences: its share is 0
        for o in outs.values():
            o.zero_()
    for b, part in enumerate(batch.parts):
        got = split_sweep(
            part.sweep_tape,
            [lays[t].scatter(asked[t][0]) for t in names],
            term,
            [lays[t].bases for t in names],
            [lays[t].destinations(outs[t]) for t in names],
            batch.weight,
            b > 0,
            BATCH,
        )
        for t, prods in zip(names, got):
            V = asked[t][0]
            lays[t].gather(prods, V.shape[0], V, outs[t], batch.weight, b > 0)
            part.matvecs += V.shape[0]
    for t in names:
        batch.ranks.all_reduce_(outs[t])
    return outs


def _shared_products(
    res: ModelHessian,
    term: str,
    asked: dict[str, Request],
    sizes: dict[str, int],  # in θ' order
    ops: dict[tuple[str, ...], HessianOperator],
    buffers: tuple[Tensor, Tensor],
) -> dict[str, Tensor]:
    """Every run's asked ``H_tt V_t`` from one call of ``H[U, U]`` (``U``: the asking runs' tensors):
    each run's rows placed on its tensor's entries of zero columns, its tensor's rows of their
    products read back (into the run's ``out`` when it gave one). ``ops``: the operators built so
    far, by union. ``buffers``: ``(W, HW)``, each ``(b, P')`` for the first call's ``b`` columns and
    the whole group's ``P'``; a call's columns and products are their leading ``(b, |U|)`` views
    (unit-stride rows), ``W`` zero outside what a call writes, which it zeroes again after the call
    (a tensor's entries each, never the whole buffer)."""
    union = tuple(t for t in sizes if t in asked)  # θ' order of the union
    offsets, at = {}, 0
    for t in union:
        offsets[t] = slice(at, at + sizes[t])
        at += sizes[t]
    width = sum(V.shape[0] for V, _ in asked.values())
    if union not in ops:
        ops[union] = _operator(res, term, union, union)
    W, HW = buffers[0][:width, :at], buffers[1][:width, :at]
    rows, r = {}, 0
    for t, (V, _) in asked.items():
        rows[t] = slice(r, r + V.shape[0])
        W[rows[t], offsets[t]] = V
        r += V.shape[0]
    ops[union].apply(W, out=HW)
    out = {}
    for t, (_, dest) in asked.items():
        W[rows[t], offsets[t]] = 0.0
        got = HW[rows[t], offsets[t]]
        out[t] = got.clone() if dest is None else dest.copy_(got)
    return out
