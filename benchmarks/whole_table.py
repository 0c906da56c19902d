"""Side by side: the per-tensor table of a whole model in-process and on a two-worker Dask
``LocalCluster`` (loopback), same seed; prints each time, the ratio, whether the rows are
bit-identical, and the load average before and after.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/whole_table.py [--model pydoc-llama] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import hessviz as hv
from hessviz.whole.table import tensor_table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="pydoc-llama")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    model = hv.load_model(args.model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.family.vocab_size, (args.batch, args.tokens), generator=gen)
    res = hv.model_hessian(model, ids)
    opts = dict(trace_samples=6, seed=0)
    print(f"{args.model}: {res.info}; torch threads {torch.get_num_threads()}; load {os.getloadavg()}")
    here, there, rows = [], [], {}
    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        ) as cluster,
        Client(cluster) as client,
    ):
        executor = client.get_executor()
        for _ in range(args.repeats):
            t = time.perf_counter()
            rows["here"] = tensor_table(res, **opts).rows
            here.append(time.perf_counter() - t)
            t = time.perf_counter()
            rows["there"] = tensor_table(res, executor=executor, **opts).rows
            there.append(time.perf_counter() - t)
    a, b = statistics.median(here), statistics.median(there)
    print(f"in-process         median {a:7.2f} s  ({len(rows['here'])} tensors)")
    print(f"{args.workers}-worker cluster   median {b:7.2f} s  ratio in-process/cluster {a / b:.2f}")
    print(f"bit-identical rows: {rows['here'] == rows['there']}; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
