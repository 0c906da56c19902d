"""Top-5 of MiniLM layer 3 (real weights and text, L = 24): the torch Lanczos core on closed-form
products, scipy ``eigsh`` on the same products and scipy ``eigsh`` on kept-graph double backward
(the fastest peer of ``benchmarks/MATFREE.md``), alternating, ``ROUNDS`` rounds (default 3), wall
and CPU time with their medians; then ``k = 8`` products at once against one.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/lanczos_vs_eigsh.py [ROUNDS]
"""

import os
import statistics
import sys
import time

import torch

import hessviz as hv
from hessviz.matfree import peers, spectral
from hessviz.matfree.bench import interleaved
from hessviz.matfree.speed import real_case

torch.set_num_threads(1)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
cfg, params, X, Y = real_case(24)
res = hv.hessian(cfg, params, X, Y)
res.matvec(torch.zeros(res.size, dtype=X.dtype))
kept = peers.Counted(cfg, params, X, Y)


def ours(solver: str):
    return lambda: spectral.eigenpairs(res, "full", 5, "top", solver=solver).matvecs


methods = {"torch Lanczos, closed form": ours("torch"), "scipy eigsh, closed form": ours("scipy"),
           "scipy eigsh, kept graph": lambda: peers.scipy_top(kept, 5, 1e-8)[1]}
wall: dict[str, list[float]] = {n: [] for n in methods}
cpu: dict[str, list[float]] = {n: [] for n in methods}
for _ in range(ROUNDS):
    for name, run in methods.items():
        start, start_cpu = time.perf_counter(), time.process_time()
        n = run()
        wall[name].append(time.perf_counter() - start)
        cpu[name].append(time.process_time() - start_cpu)
        print(f"{name}: {wall[name][-1]:.1f} s (CPU {cpu[name][-1]:.1f} s), {n} products, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
peer = "scipy eigsh, kept graph"
peer_wall, peer_cpu = statistics.median(wall[peer]), statistics.median(cpu[peer])
for name in methods:
    print(f"median {name}: {statistics.median(wall[name]):.1f} s (CPU {statistics.median(cpu[name]):.1f} s); "
          f"kept-graph eigsh / this: {peer_wall / statistics.median(wall[name]):.2f}x wall, "
          f"{peer_cpu / statistics.median(cpu[name]):.2f}x CPU")
V = torch.randn(8, res.size, dtype=torch.float64).T
v = V[:, 0].contiguous()
t = interleaved({"one": lambda: res.matvec(v), "8 at once": lambda: res.matvec(V)}, 3)
print(f"one product {t['one']['median'] * 1e3:.1f} ms; 8 at once {t['8 at once']['median'] * 1e3:.1f} ms "
      f"({t['8 at once']['median'] / t['one']['median']:.2f}x one); load {os.getloadavg()[0]:.1f}")
