"""The slow app views of issue 33, before and after, side by side in one run (one torch thread, as
the app runs): the spectral norm of a dense term (dense ``eigvalsh`` of the Gram matrix or of the
symmetrised term, as before, against :func:`hessviz.matfree.spectra.matrix_norm`'s Lanczos), the LayerNorm-
collapse block view's points, and the Hessian map's heatmap reductions (``max |H|`` through a
``|H|`` temporary and tiles reduced down the rows first, as before, against now). Alternating,
``ROUNDS`` rounds (default 3); CPU seconds, medians and ratios, and the load average.

    PYTHONPATH=. python benchmarks/app_views.py [ROUNDS]
"""

import os
import statistics
import sys
import time

import numpy as np
import torch

import hessviz as hv
from hessviz.experiments.ln_collapse import post_ln_inputs
from hessviz.matfree.spectra import matrix_norm
from hessviz.plots import scale

torch.set_num_threads(1)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def dense_norm(M: torch.Tensor) -> float:
    """The route before: every eigenvalue of the symmetrised term."""
    return float(torch.linalg.eigvalsh(0.5 * (M + M.T)).abs().max())


def ln_point(norm, cfg, params, X, Y, sigma: float) -> None:
    """One σ point of the LayerNorm-collapse block view: three whole terms' norms and the W_Q block's."""
    res = hv.hessian(cfg, params, post_ln_inputs(cfg, params, X, sigma), Y)
    for t in ("full", "outer", "functional"):
        norm(res.term(t))
    norm(res.block("W_Q", "W_Q", "full"))


def old_tiles(M, starts):
    hi = np.maximum.reduceat(np.maximum.reduceat(M, starts, axis=0), starts, axis=1)
    lo = np.minimum.reduceat(np.minimum.reduceat(M, starts, axis=0), starts, axis=1)
    return np.where(np.abs(hi) >= np.abs(lo), hi, lo), float(np.max(np.abs(M)))


def new_tiles(M, starts):
    return scale.tile_extremes(M, starts, starts), scale.max_abs(M)


def main() -> None:
    print(f"load average at start: {os.getloadavg()}")
    cfg = hv.BlockConfig(seq_len=8, d_model=16, d_k=8, d_ff=32, norm="post")
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0, input_norm=1.0)
    wide = hv.BlockConfig(seq_len=8, d_model=64, d_k=8, d_ff=32)  # the map at d = 64: P = 9,216
    H = hv.hessian(wide, hv.init_params(wide, seed=0), *hv.sample_inputs(wide, seed=0)).term("full").numpy()
    starts = np.arange(0, H.shape[0], 64)
    a, b = old_tiles(H, starts), new_tiles(H, starts)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
    rows = {
        "LN collapse point, dense norms": [],
        "LN collapse point, Lanczos norms": [],
        "map d=64 heatmap, before": [],
        "map d=64 heatmap, now": [],
    }
    for _ in range(ROUNDS):
        for sigma in (1.0, 1e-2, 1e-4):
            rows["LN collapse point, dense norms"].append(
                cpu(lambda s=sigma: ln_point(dense_norm, cfg, params, X, Y, s))
            )
            rows["LN collapse point, Lanczos norms"].append(
                cpu(lambda s=sigma: ln_point(lambda M: matrix_norm(M, symmetric=True), cfg, params, X, Y, s))
            )
        rows["map d=64 heatmap, before"].append(cpu(lambda: old_tiles(H, starts)))
        rows["map d=64 heatmap, now"].append(cpu(lambda: new_tiles(H, starts)))
    med = {k: statistics.median(v) for k, v in rows.items()}
    for k, v in med.items():
        print(f"{k:36s} median {v:7.3f} s CPU over {len(rows[k])}")
    dense, lanczos = med["LN collapse point, dense norms"], med["LN collapse point, Lanczos norms"]
    print(
        f"LN collapse point: {dense / lanczos:.1f}× less CPU; the default view's 26 points ≈ "
        f"{26 * lanczos:.1f} s"
    )
    print(
        f"heatmap reductions: {med['map d=64 heatmap, before'] / med['map d=64 heatmap, now']:.1f}× less CPU"
    )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
