"""Top-5 of MiniLM layer 3 (real weights and text, L = 24): the torch Lanczos core on closed-form
products, scipy ``eigsh`` on the same products and scipy ``eigsh`` on kept-graph double backward
(the fastest peer of ``benchmarks/MATFREE.md``), alternating, ``ROUNDS`` rounds (default 3), wall
and CPU time with their medians; then ``k = 8`` products at once against one.

Two settings, each run side by side:

* **the same residual tolerance** ``tol = 1e-8`` for all (``‖Hu − θu‖ ≤ tol·|θ|``), as before;
* **the same accuracy**: every one of the five eigenvalues within ``1e-8`` relative of a tight
  reference (the torch core at a residual tolerance of 1e-12), the issue's criterion. The torch core
  stops on its eigenvalue bound (``bound="value"``, ``tol = 1e-8``; its first pass partially
  reorthogonalised, as by default, then fully, then with no check product: ``eigsh`` here returns
  the values alone too); ``eigsh`` has only a residual tolerance, so it gets the loosest of
  1e-3 … 1e-7 that meets the criterion (found first, then timed).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/lanczos_vs_eigsh.py [ROUNDS]
"""

import os
import statistics
import sys
import time

import numpy as np
import torch

import hessviz as hv
from hessviz.bench import peers
from hessviz.bench.matfree import interleaved
from hessviz.bench.matfree_spectra import real_case
from hessviz.matfree import spectral

torch.set_num_threads(1)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
ACCURACY = 1e-8
cfg, params, X, Y = real_case(24)
res = hv.hessian(cfg, params, X, Y)
res.matvec(torch.zeros(res.size, dtype=X.dtype))
kept = peers.Counted(cfg, params, X, Y)
tight = spectral.eigenpairs(res, "full", 5, "top", solver="torch", tol=1e-12).values[::-1]


def within(values) -> float:
    """The largest relative distance of the five values from the tight reference."""
    return float(np.max(np.abs(np.sort(np.asarray(values))[::-1] - tight) / np.abs(tight)))


def ours(solver: str, **kw):
    def run():
        r = spectral.eigenpairs(res, "full", 5, "top", solver=solver, **kw)
        return r.matvecs, within(r.values)

    return run


def eigsh_kept(tol: float):
    def run():
        vals, n = peers.scipy_top(kept, 5, tol)
        return n, within(vals)

    return run


matched = next(t for t in (1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8) if eigsh_kept(t)()[1] <= ACCURACY)
print(
    f"tight reference {np.round(tight, 6).tolist()}; eigsh's loosest tol within {ACCURACY:g}: {matched:g}; "
    f"load {os.getloadavg()[0]:.1f}",
    flush=True,
)
settings = {
    "same residual tolerance 1e-8": {
        "torch Lanczos, closed form": ours("torch"),
        "scipy eigsh, closed form": ours("scipy"),
        "scipy eigsh, kept graph": eigsh_kept(1e-8),
    },
    f"same accuracy (eigenvalues within {ACCURACY:g})": {
        "torch Lanczos, closed form, value bound 1e-8": ours("torch", bound="value", tol=ACCURACY),
        "the same, full reorthogonalisation": ours("torch", bound="value", tol=ACCURACY, reorth="full"),
        "the same, partial, values only (no check product)": ours(
            "torch", bound="value", tol=ACCURACY, check=False
        ),
        f"scipy eigsh, closed form, tol {matched:g}": ours("scipy", tol=matched),
        f"scipy eigsh, kept graph, tol {matched:g}": eigsh_kept(matched),
    },
}
for title, methods in settings.items():
    print(f"-- {title}", flush=True)
    wall: dict[str, list[float]] = {n: [] for n in methods}
    cpu: dict[str, list[float]] = {n: [] for n in methods}
    for _ in range(ROUNDS):
        for name, run in methods.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            n, err = run()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            print(
                f"{name}: {wall[name][-1]:.1f} s (CPU {cpu[name][-1]:.1f} s), {n} products, "
                f"within {err:.1e} of the reference, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    peer = list(methods)[-1]
    peer_wall, peer_cpu = statistics.median(wall[peer]), statistics.median(cpu[peer])
    for name in methods:
        mid = statistics.median(wall[name])
        print(
            f"median {name}: {mid:.1f} s (CPU {statistics.median(cpu[name]):.1f} s); "
            f"kept-graph eigsh / this: {peer_wall / statistics.median(wall[name]):.2f}x wall, "
            f"{peer_cpu / statistics.median(cpu[name]):.2f}x CPU"
        )
V = torch.randn(8, res.size, dtype=torch.float64).T
v = V[:, 0].contiguous()
t = interleaved({"one": lambda: res.matvec(v), "8 at once": lambda: res.matvec(V)}, 3)
print(
    f"one product {t['one']['median'] * 1e3:.1f} ms; 8 at once {t['8 at once']['median'] * 1e3:.1f} ms "
    f"({t['8 at once']['median'] / t['one']['median']:.2f}x one); load {os.getloadavg()[0]:.1f}"
)
