"""Independent tasks on any :class:`concurrent.futures.Executor`: a process pool, or a Dask
``distributed`` client's ``client.get_executor()``, local or a real cluster's.

:func:`run_tasks` is the one way hessviz sends work out (the per-tensor table of
:mod:`hessviz.whole.table`, the claims of ``reproduce``): the executor is checked first
(:func:`check_executor`), every call runs under this process's torch thread count
(:func:`under_threads`, so a worker's numbers are this process's to the bit), the results come back
in the order of the calls, and an executor that is closed, broken or whose workers cannot import
hessviz is an :class:`~hessviz.errors.InputError` naming ``executor``. :func:`usable_cores` is how many
workers (or heavy slots) this process can keep busy.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import pkgutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hessviz.errors import InputError

WORKER_CHECK = "hessviz.runtime.tasks:__name__"

CLOSED = "executor is closed (shut down), it takes no tasks: {}"

CANNOT_IMPORT = (
    "executor's workers cannot import hessviz ({}): install it where they run, or start them "
    "with this PYTHONPATH"
)

CGROUP_ROOT = "/sys/fs/cgroup"
"""Where the cgroup file systems are mounted (v2 unified, or v1 with a ``cpu`` controller folder)."""


def usable_cores(
    root: str | os.PathLike = CGROUP_ROOT, membership: str | os.PathLike = "/proc/self/cgroup"
) -> int:
    """The cores this process can keep busy, at least 1: the CPUs it may run on
    (``os.sched_getaffinity``: ``taskset -c 0``, a cpuset), capped by its cgroup's CPU quota, where
    ``os.cpu_count()`` counts every core of the machine whatever a container or ``taskset`` allows.

    The quota, ``q`` µs of CPU time per period of ``p`` µs, lets the process use ``q/p`` cores; a
    partial core counts as one (``ceil(q/p)``). It is read from cgroup v2's ``cpu.max`` (``"max
    100000"``: no quota, ``"150000 100000"``: 2 cores) or cgroup v1's ``cpu.cfs_quota_us`` and
    ``cpu.cfs_period_us`` (``-1``: no quota), in the process's own cgroup (``membership``, the
    format of ``/proc/self/cgroup``) and every cgroup above it up to ``root``, the smallest one
    holding: a parent's quota binds its children. Files that are missing or unreadable mean no
    quota there.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        cores = os.cpu_count() or 1
    quota = cgroup_cores(root, membership)
    return max(1, cores if quota is None else min(cores, math.ceil(quota)))


def cgroup_cores(
    root: str | os.PathLike = CGROUP_ROOT, membership: str | os.PathLike = "/proc/self/cgroup"
) -> float | None:
    """The CPU quota of this process's cgroups in cores (``1.5`` for ``"150000 100000"``), the
    smallest on the way up to ``root``; ``None`` where no cgroup sets one (:func:`usable_cores`)."""
    return min(_cgroup_quotas(Path(root), Path(membership)), default=None)


def _cgroup_quotas(root: Path, membership: Path) -> list[float]:
    """Every CPU quota, in cores, of the process's cgroups and of their ancestors up to the mount
    point: v2's unified hierarchy (``root``, or ``root/unified`` beside v1 controllers) for the
    line ``0::/path``, v1's ``cpu`` controller (``root/cpu,cpuacct`` or ``root/cpu``) for
    ``4:cpu,cpuacct:/path``."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return []
    quotas = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            unified = root if (root / "cgroup.controllers").exists() else root / "unified"
            bases, files = [unified], ("cpu.max",)
        elif "cpu" in controllers.split(","):
            bases, files = [root / controllers, root / "cpu"], ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        base = next((b for b in bases if b.is_dir()), None)
        if base is None:
            continue
        folder = base / path.strip("/")  # a path from outside a container's namespace: read up to base
        while True:
            quota = _quota(folder, files)
            if quota is not None:
                quotas.append(quota)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return quotas


def _quota(folder: Path, files: tuple[str, ...]) -> float | None:
    """The CPU quota of one cgroup folder in cores, or ``None`` (no quota, no file, or not a number)."""
    try:
        if len(files) == 1:
            quota, period = (folder / files[0]).read_text().split()[:2]
        else:
            quota, period = ((folder / f).read_text().strip() for f in files)
        q, p = int(quota), int(period)
    except (OSError, ValueError):  # "max", -1 below, no file, a short line
        return None
    return q / p if q > 0 and p > 0 else None


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
