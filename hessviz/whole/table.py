r"""The per-tensor table of a whole model: for each chosen tensor (layer × weight, or × head), the top
eigenvalue and the trace of its diagonal Hessian block and its gradient norm.

>>> import torch, hessviz as hv
>>> from hessviz.whole.table import tensor_table
>>> model = hv.load_model("pydoc-llama")
>>> res = hv.model_hessian(model, torch.tensor([5, 9, 23, 7]), wrt=("l3.ln2_gamma", "l3.W_2"))
>>> [r.name for r in tensor_table(res, trace_samples=6).rows]
['l3.ln2_gamma', 'l3.W_2']

Each row is :func:`hessviz.matfree.block_table` of one diagonal block ``H[t, t]`` (exact from the
dense block up to ``exact_limit`` entries; else Lanczos with ``k = 1`` on the block's products and a
Hutch++ trace from ``trace_samples`` products; ``trace_samples = 0``: no trace, NaN, the top eigenvalue
alone) and ``‖∂ℓ/∂t‖`` (the mean over the sequences).

``executor``: any :class:`concurrent.futures.Executor` (a process pool, a Dask ``distributed``
client's ``client.get_executor()``); at most ``tasks`` tasks of several tensors each, by
:func:`hessviz.runtime.tasks.run_tasks`, which sends the picklable :class:`~hessviz.whole.hessian.Problem`
(scattered to a Dask cluster's workers once; a worker builds its Hessian once and keeps the last one)
and runs them under this process's torch thread count. Without one the rows run here, one after another, on
``res`` itself. Same ``seed``, same numbers to the bit either way (every random draw is seeded
per block; the products do not depend on where they run).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hessviz.errors import ConfigError, InputError
from hessviz.losses import HEAD_NAMES
from hessviz.matfree.lanczos import check_bound
from hessviz.matfree.spectral import SCIPY_BELOW, BlockStats, BlockTable, Progress, block_table, eigenpairs
from hessviz.runtime.tasks import built, run_tasks
from hessviz.whole import lockstep
from hessviz.whole.hessian import ModelHessian, Problem, _public


@dataclass(frozen=True)
class TensorRow(BlockStats):
    """A :class:`~hessviz.matfree.spectral.BlockStats` row and the tensor's gradient norm."""

    grad_norm: float
    """``‖∂ℓ/∂t‖``, Frobenius."""


@dataclass(frozen=True)
class TensorTable(BlockTable):
    """A :class:`~hessviz.matfree.spectral.BlockTable` of :class:`TensorRow` s, and where it ran."""

    where: str = "in-process"


@dataclass(frozen=True)
class Options:
    term: str
    trace_samples: int
    exact_limit: int
    tol: float
    seed: int
    which: str = "top"
    bound: str = "residual"


def tensor_names(res: ModelHessian, by_head: bool = False) -> tuple[str, ...]:
    """Every tensor of ``res.names``, each headed weight split into its heads when ``by_head``."""
    cfg, out = res.cfg, []
    for name in res.names:
        if by_head and "[" not in name and name not in HEAD_NAMES and cfg.is_headed(name) and cfg.n_heads > 1:
            out.extend(cfg.head_names(name))
        else:
            out.append(name)
    return tuple(out)


def row(
    res: ModelHessian, name: str, opts: Options, progress: Progress | None = None
) -> tuple[TensorRow, int]:
    """One tensor's row, computed on ``res``, and the product columns it took (``progress`` as
    :func:`hessviz.matfree.block_table` calls it)."""
    public, size = _public(res.cfg, name), res.param_size(name)
    gradient = res.stack_gradient((name,))[name].reshape(-1)  # θ' order: the Lanczos start
    grad = float(torch.linalg.vector_norm(gradient))
    if opts.trace_samples == 0 and size <= opts.exact_limit:  # exact, any `which`
        Hb = (
            res.matvec(
                torch.eye(size, dtype=res.products.X.dtype, device=res.products.X.device),
                opts.term,
                rows=(name,),
                cols=(name,),
            )
            .to(torch.float64)
            .cpu()
        )
        vals = torch.linalg.eigvalsh(0.5 * (Hb + Hb.T))
        top = vals[-1] if opts.which == "top" else vals[vals.abs().argmax()]
        return TensorRow(public, size, float(top), float(vals.sum()), 0.0, True, grad), size
    if opts.trace_samples == 0:  # the top eigenvalue only
        top = eigenpairs(
            res,
            opts.term,
            1,
            opts.which,
            names=(name,),
            seed=opts.seed,
            tol=opts.tol,
            progress=progress,
            bound=opts.bound,
            start=gradient,
            check=opts.bound == "residual",
        )
        return TensorRow(public, size, float(top.values[-1]), math.nan, math.nan, False, grad), top.matvecs
    table = block_table(
        res,
        opts.term,
        (name,),
        trace_samples=opts.trace_samples,
        exact_limit=opts.exact_limit,
        tol=opts.tol,
        seed=opts.seed,
        progress=progress,
        bound=opts.bound,
        starts={name: gradient},
        check=opts.bound == "residual",
    )
    stats = table.rows[0]
    return TensorRow(
        public, stats.size, stats.top, stats.trace, stats.trace_stderr, stats.exact, grad
    ), table.matvecs


def shared(res: ModelHessian, name: str, opts: Options) -> bool:
    """Whether ``name``'s row is a Lanczos run of the torch core alone (the top eigenvalue, no trace,
    not exact, not scipy's), which :func:`rows` runs in lockstep with its layer's
    (:mod:`hessviz.whole.lockstep`)."""
    size = res.param_size(name)
    scipy = opts.bound == "residual" and size < SCIPY_BELOW
    return opts.trace_samples == 0 and size > max(opts.exact_limit, 1) and not scipy


def rows(
    res: ModelHessian, names: Sequence[str], opts: Options, progress: Progress | None = None
) -> list[tuple[TensorRow, int]]:
    """:func:`row` of each of ``names``, in order, and the product columns each took. The rows that
    are a Lanczos run alone (:func:`shared`) run a layer at a time in lockstep, each step's products
    of the layer's runs in one call (:func:`hessviz.whole.lockstep.top_values`, the gradient the
    start, each run leaving when it has converged); the others one after another. ``progress(done,
    total, message)`` as each row ends (and within the runs)."""
    got: dict[str, tuple[TensorRow, int]] = {}
    total = len(names)

    def report(message: str) -> None:
        if progress is not None:
            progress(len(got), total, message)

    lock = [n for n in names if shared(res, n, opts)]
    grads = res.stack_gradient(tuple(dict.fromkeys(lock))) if lock else {}
    for group in lockstep.groups(res, lock):
        starts = {n: grads[n].reshape(-1) for n in group}  # θ' order: the Lanczos starts
        base = len(got)
        ritz = lockstep.top_values(
            res,
            group,
            opts.term,
            tol=opts.tol,
            seed=opts.seed,
            which=opts.which,
            bound=opts.bound,
            starts=starts,
            check=opts.bound == "residual",
            progress=None if progress is None else lambda d, m, base=base: progress(base + d, total, m),
        )
        for n in group:
            r = ritz[n]
            grad = float(torch.linalg.vector_norm(starts[n]))
            public, size = _public(res.cfg, n), res.param_size(n)
            got[n] = TensorRow(public, size, float(r.values[0]), math.nan, math.nan, False, grad), r.matvecs
        report(f"{', '.join(_public(res.cfg, n) for n in group)} done")
    for n in names:
        if n in got:
            continue
        public = _public(res.cfg, n)
        step = None if progress is None else lambda _d, _t, message, p=public: report(f"{p}: {message}")
        got[n] = row(res, n, opts, step)
        report(f"{public} done")
    return [got[n] for n in names]


def remote_rows(problem: Problem, names: tuple[str, ...], opts: Options) -> list[tuple[TensorRow, int]]:
    """:func:`rows` of ``names`` on a worker, on the Hessian built from ``problem`` (once per
    worker and problem)."""
    return rows(built(problem), names, opts)


TASKS = 32
"""Tasks a table is split into on an executor, at most: outside Dask each carries the problem, and
so every layer's weights (81 MiB pickled for MiniLM in float64), so one task per tensor would pickle
and send them hundreds of times (558 for MiniLM's per-head table)."""


def task_names(names: Sequence[str], tasks: int) -> list[tuple[str, ...]]:
    """``names`` dealt round-robin into ``min(tasks, len(names))`` groups, so that each group holds
    tensors of every depth (a block low in the model costs a sweep through every layer above it).

    >>> task_names(["a", "b", "c", "d", "e"], 2)
    [('a', 'c', 'e'), ('b', 'd')]
    """
    n = min(tasks, len(names))
    return [tuple(names[i::n]) for i in range(n)]


def tensor_table(
    res: ModelHessian,
    term: str = "full",
    tensors: Sequence[str] | None = None,
    *,
    by_head: bool = False,
    trace_samples: int = 30,
    exact_limit: int = 256,
    tol: float = 1e-6,
    seed: int = 0,
    executor: cf.Executor | None = None,
    tasks: int = TASKS,
    progress: Progress | None = None,
    which: str = "top",
    bound: str = "residual",
) -> TensorTable:
    """The per-tensor table of ``res`` (see the module docstring); ``tensors`` defaults to
    :func:`tensor_names` (names or head slices of ``res.names``).

    ``progress(done, total, message)``: called in-process within each row's products (``done`` rows
    of ``total``) and as each row ends, on an executor as each task's rows arrive; an exception
    it raises (a visitor who left) stops the table there.

    ``tasks``: on an executor, the rows go out as at most this many tasks (:func:`task_names`), each
    sending the problem once; use at least the number of workers.

    ``which="magnitude"`` (with ``trace_samples=0``): the ``top`` column holds the eigenvalue of largest
    magnitude, what PyHessian's power iteration reports as the top eigenvalue (blocks up to
    ``exact_limit`` entries exactly, so that a block that is exactly 0, a key bias's, is 0).

    Each Lanczos run starts from the tensor's gradient (computed for its column anyway, and in a
    loss's valley often leaning on the top directions: 16 % fewer products on MiniLM's 22-tensor
    table at ``tol = 1e-3``), the seeded random vector mixed in. ``tol`` bounds each top eigenvalue's
    residual (``bound="residual"``) or, with ``bound="value"``, its error itself
    (:func:`hessviz.matfree.lanczos.value_error`): ``tol = 1e-3`` then gives every top eigenvalue to
    about 1e-3 relative, what the paper's table asks, and skips the check product (the value is the
    Ritz value either way; :func:`hessviz.matfree.spectral.eigenpairs`, ``check``)."""
    if which not in ("top", "magnitude"):
        raise ConfigError(f"which must be 'top' or 'magnitude', got {which!r}")
    if which != "top" and trace_samples != 0:
        raise ConfigError("which='magnitude' needs trace_samples=0 (the eigenvalue alone)")
    if not isinstance(res, ModelHessian):
        raise InputError(f"res must be hv.model_hessian(...)'s result, got {type(res).__name__}")
    names = tensor_names(res, by_head) if tensors is None else res._names(tensors)
    if tensors is not None and len(names) != len(tuple(tensors)):
        raise ConfigError("tensors must name each tensor once")
    opts = Options(term, trace_samples, exact_limit, tol, seed, which, check_bound(bound))
    start = time.perf_counter()
    if executor is None:
        done = rows(res, names, opts, progress)
        return TensorTable([r for r, _ in done], term, sum(m for _, m in done), time.perf_counter() - start)
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise ConfigError(f"tasks must be an integer >= 1, got {tasks!r}")
    groups = task_names(names, tasks)
    count = 0

    def arrived(i: int, rows: list) -> None:
        nonlocal count
        count += len(rows)
        if progress is not None:
            progress(count, len(names), f"{_public(res.cfg, groups[i][-1])} done")

    parts = run_tasks(executor, remote_rows, [(g, opts) for g in groups], (res.problem,), arrived)
    got = {n: r for g, rows in zip(groups, parts) for n, r in zip(g, rows)}
    done = [got[n] for n in names]
    return TensorTable(
        [r for r, _ in done],
        term,
        sum(m for _, m in done),
        time.perf_counter() - start,
        type(executor).__name__,
    )
