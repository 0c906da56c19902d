"""Independent tasks on any :class:`concurrent.futures.Executor`: a process pool, or a Dask
``distributed`` client's ``client.get_executor()``, local or a real cluster's.

:func:`run_tasks` is the one way hessviz sends work out (the per-tensor table of
:mod:`hessviz.whole.table`, the claims of ``reproduce``): the executor is checked first
(:func:`check_executor`), every call runs under this process's torch thread count
(:func:`under_threads`, so a worker's numbers are this process's to the bit), the results come back
in the order of the calls, and an executor that is closed, broken or whose workers cannot import
hessviz is an :class:`~hessviz.errors.InputError` naming ``executor``.
"""

from __future__ import annotations

import concurrent.futures as cf
import pkgutil
from collections.abc import Callable, Sequence

import torch

from hessviz.errors import InputError

WORKER_CHECK = "hessviz.tasks:__name__"

CLOSED = "executor is closed (shut down), it takes no tasks: {}"

CANNOT_IMPORT = (
    "executor's workers cannot import hessviz ({}): install it where they run, or start them "
    "with this PYTHONPATH"
)


def check_executor(executor: object) -> None:
    """That ``executor`` is a :class:`concurrent.futures.Executor`, takes tasks, and that its workers
    import hessviz, before any task that needs it: the probe is the standard library's
    ``pkgutil.resolve_name`` of :data:`WORKER_CHECK` (a worker unpickles it without hessviz, then
    imports hessviz and answers a string). A task whose own pickle names hessviz would instead kill a
    process pool's worker (``BrokenProcessPool``) and say nothing of why. :class:`InputError` naming
    ``executor`` otherwise."""
    if not isinstance(executor, cf.Executor):
        raise InputError(
            f"executor must be a concurrent.futures.Executor (or None: in-process), got "
            f"{type(executor).__name__}"
        )
    try:
        probe = executor.submit(pkgutil.resolve_name, WORKER_CHECK)
    except RuntimeError as e:  # concurrent.futures and distributed after shutdown
        raise InputError(CLOSED.format(e)) from None
    try:
        probe.result()
    except ImportError as e:
        raise InputError(CANNOT_IMPORT.format(e)) from None
    except cf.BrokenExecutor as e:
        raise InputError(f"executor is broken (a worker died): {e}") from None


def under_threads(threads: int, fn: Callable, *args: object) -> object:
    """``fn(*args)`` under ``threads`` torch threads, the worker's own count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


def shipped(executor: cf.Executor, value: object) -> object:
    """What tasks get for a ``value`` all of them share: on a Dask ``distributed`` client's executor,
    a future of it sent to every worker once (``client.scatter(..., broadcast=True)``; each task then
    carries a key, not the value); on any other executor the value itself, pickled with each task."""
    import sys

    cfexecutor = sys.modules.get("distributed.cfexecutor")  # loaded whenever get_executor() was
    if cfexecutor is None or not isinstance(executor, cfexecutor.ClientExecutor):
        return value
    return executor._client.scatter(value, broadcast=True, hash=False)


_BUILT: dict[str, object] = {}
"""The last problem a worker built, by its token: the tasks of one table or density share it."""


def built(problem: object) -> object:
    """``problem.build()`` once per worker and problem (a picklable recipe with a ``token`` that names
    it across processes, :class:`hessviz.whole.hessian.Problem`); only the last one is kept."""
    res = _BUILT.get(problem.token)
    if res is None:
        res = problem.build()
        _BUILT.clear()
        _BUILT[problem.token] = res
    return res


def run_tasks(
    executor: cf.Executor,
    fn: Callable,
    calls: Sequence[tuple],
    shared: tuple = (),
    arrived: Callable[[int, object], None] | None = None,
) -> list:
    """``[fn(*shared, *args) for args in calls]``, each call one task on ``executor`` (checked first),
    all submitted at once, under this process's torch thread count; each of ``shared`` (a model's
    weights, say) :func:`shipped` once. ``arrived(i, result)`` is called as each result is collected,
    in order; an exception it raises, or a task's, cancels the tasks left."""
    check_executor(executor)
    threads = torch.get_num_threads()
    try:
        common = tuple(shipped(executor, v) for v in shared)
        futures = [executor.submit(under_threads, threads, fn, *common, *args) for args in calls]
    except RuntimeError as e:  # concurrent.futures and distributed after shutdown
        raise InputError(CLOSED.format(e)) from None
    out = []
    try:
        for i, f in enumerate(futures):
            out.append(f.result())
            if arrived is not None:
                arrived(i, out[-1])
    except BaseException as e:
        for f in futures:
            f.cancel()
        if not isinstance(e, ImportError):
            raise
        raise InputError(CANNOT_IMPORT.format(e)) from None
    return out
