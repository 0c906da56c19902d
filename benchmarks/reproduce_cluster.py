"""``reproduce``'s slow claims in-process, on a two-worker Dask ``LocalCluster``, side by side,
and on a two-process ``ProcessPoolExecutor``: wall time of each, the ratio, and whether every measured
number (the wall-clock readings aside) is the same to the bit.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/reproduce_cluster.py [CLAIM ...]

Default claims: the two Tomihari & Sato protocols (``gini_protocol``, ``optimizers_protocol``), the
slow part of ``hessviz reproduce``. One torch thread per process; the cluster's workers have one
thread each, on loopback.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from hessviz.experiments.report import run_claims


def numbers(results) -> list[dict]:
    """Each claim's entry without its wall-clock readings (``seconds…`` keys, and the note quoting them)."""
    out = []
    for r in results:
        rec = r.entry()
        rec["measured"] = {k: v for k, v in rec["measured"].items() if not k.startswith("seconds")}
        rec.pop("note")
        out.append(rec)
    return out


def timed(ids: tuple[str, ...], executor=None) -> tuple[float, list]:
    t = time.perf_counter()
    results = run_claims(False, ids, executor=executor)
    return time.perf_counter() - t, results


def main(ids: tuple[str, ...]) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from distributed import Client, LocalCluster

    print(
        f"claims {', '.join(ids)}; torch threads {torch.get_num_threads()}; load {os.getloadavg()}",
        flush=True,
    )
    a, here = timed(ids)
    print(
        f"in-process {a:.1f} s ({', '.join(f'{r.id} {r.seconds:.1f} s' for r in here)}); "
        f"load {os.getloadavg()}",
        flush=True,
    )
    runs = {}
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs["two-process ProcessPoolExecutor"] = timed(ids, pool)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster,
        Client(cluster) as client,
    ):
        runs["two-worker LocalCluster"] = timed(ids, client.get_executor())
    for name, (b, there) in runs.items():
        same = numbers(here) == numbers(there)
        each = ", ".join(f"{r.id} {r.seconds:.1f} s" for r in there)
        print(
            f"{name} {b:.1f} s ({each}); ratio {a / b:.2f}; "
            f"every number but the timings bit-identical {same}; load {os.getloadavg()}",
            flush=True,
        )


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or ("gini_protocol", "optimizers_protocol"))
