"""Top-5 of MiniLM layer 3 (real weights and text, L = 24): the torch Lanczos core on closed-form
products against scipy ``eigsh`` on kept-graph double backward (the fastest peer of
``benchmarks/MATFREE.md``), alternating, two rounds; then ``k = 8`` products at once against one.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/lanczos_vs_eigsh.py
"""

import os
import time

import torch

import hessviz as hv
from hessviz.matfree import peers, spectral
from hessviz.matfree.bench import interleaved
from hessviz.matfree.speed import real_case

torch.set_num_threads(1)
cfg, params, X, Y = real_case(24)
res = hv.hessian(cfg, params, X, Y)
res.matvec(torch.zeros(res.size, dtype=X.dtype))
kept = peers.Counted(cfg, params, X, Y)
for _ in range(2):
    for name, run in (("torch Lanczos, closed form", lambda: spectral.eigenpairs(res, "full", 5, "top",
                                                                                 solver="torch").matvecs),
                      ("scipy eigsh, kept graph", lambda: peers.scipy_top(kept, 5, 1e-8)[1])):
        start = time.perf_counter()
        n = run()
        print(f"{name}: {time.perf_counter() - start:.1f} s, {n} products, load {os.getloadavg()[0]:.1f}")
V = torch.randn(8, res.size, dtype=torch.float64).T
v = V[:, 0].contiguous()
t = interleaved({"one": lambda: res.matvec(v), "8 at once": lambda: res.matvec(V)}, 3)
print(f"one product {t['one']['median'] * 1e3:.1f} ms; 8 at once {t['8 at once']['median'] * 1e3:.1f} ms "
      f"({t['8 at once']['median'] / t['one']['median']:.2f}x one); load {os.getloadavg()[0]:.1f}")
