r"""The top eigenvalues of several diagonal blocks ``H[t, t]`` of a whole model at once: one Lanczos
run per tensor (:func:`hessviz.matfree.lanczos.steps`, the run of
:func:`~hessviz.matfree.lanczos.extremes`), their products made together.

At each step every run still going asks for ``H_tt q_t``. The runs of one group (one layer's
tensors: :func:`groups`) hand their vectors over as the columns of **one** call of the block
``H[U, U]``, ``U`` the union of the tensors of the runs still going: column ``j`` is ``q_{t_j}`` on
``t_j``'s entries and 0 elsewhere, and of its product only ``t_j``'s rows are read back,

.. math::
    (H[U, U]\, (0, …, q_{t_j}, …, 0))[t_j] = H_{t_j t_j}\, q_{t_j}.

So a step costs one sweep of ``b`` columns instead of ``b`` sweeps of one: the layers above the
group and the objective's head are read once for all of them (SmolLM2's tied head, ``49152 × 576``
in float64, is most of a last-layer product; 4 columns in one call cost about 2× one). Each column
still carries the tangents of the whole union (a zero tangent of another tensor is swept like any),
which is why a group is one layer and why the union shrinks as runs converge: a run leaves at the
step its own stopping test passes, with its own product count.

Each run is :func:`~hessviz.matfree.lanczos.extremes`' own loop with the same arguments, so with
products equal to round-off (a column's product does not depend on the columns beside it, up to the
GEMMs' rounding) it takes the same steps and returns the same eigenvalue to round-off
(``tests/test_table.py`` checks it against the one-tensor-at-a-time rows).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator, Sequence

from torch import Tensor

from hessviz.losses import HEAD_NAMES
from hessviz.matfree.lanczos import Request, Ritz, steps
from hessviz.matfree.spectral import _operator
from hessviz.products.hessian_operator import HessianOperator
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
    shape = (len(names), sum(sizes.values()))  # k = 1: each run asks for one row at a time
    buffers = (like.new_zeros(shape), pages.empty(shape, like))
    while asked:
        products = _shared_products(res, term, asked, sizes, ops, buffers)
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
