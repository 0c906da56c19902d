"""Calibrate ``hessviz.checks.cost.TERM_S``: one dense closed-form term's CPU on one thread, warm, against
the cost model's shape ``P² (1 + L d/512)(1 + (H − 1)/5)`` (after the fixed per-pair work ``PAIR_S``).

    python benchmarks/term_cost.py

Prints, per block, the median of three ``hv.hessian(...).full`` (process CPU) and the ``TERM_S`` it
implies; ``benchmarks/COST.md`` keeps a run.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

import hessviz as hv
from hessviz.checks import cost

BLOCKS = (
    dict(seq_len=8, d_model=24, d_k=8, d_ff=48),
    dict(seq_len=16, d_model=32, d_k=32, d_ff=64),
    dict(seq_len=8, d_model=48, d_k=48, d_ff=96),
    dict(
        seq_len=16,
        d_model=32,
        d_k=8,
        n_heads=4,
        out_proj=True,
        bias=True,
        ln_affine=True,
        d_ff=64,
        norm="pre",
    ),
    dict(seq_len=32, d_model=24, d_k=24, d_ff=48),
    dict(seq_len=64, d_model=32, d_k=8, n_heads=4, out_proj=True, d_ff=64, norm="pre"),
    dict(seq_len=16, d_model=48, d_k=12, n_heads=4, out_proj=True, d_ff=96, bias=True, ln_affine=True),
)


def term_seconds(cfg: hv.BlockConfig, repeats: int = 3) -> float:
    """The median process CPU of ``hv.hessian(...).full``, after one warm-up call."""
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0)
    hv.hessian(cfg, params, X, Y).full  # noqa: B018 (warm-up: the term is formed when read)
    times = []
    for _ in range(repeats):
        start = time.process_time()
        hv.hessian(cfg, params, X, Y).full  # noqa: B018
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}; TERM_S in hessviz.checks.cost: {cost.TERM_S:.2e}")
    for kwargs in BLOCKS:
        cfg = hv.BlockConfig(**kwargs)
        P, L, d, H, n = cfg.num_params, cfg.seq_len, cfg.d_model, cfg.n_heads, len(cfg.param_names)
        shape = P * P * (1 + L * d / 512) * (1 + (H - 1) / 5)
        pairs = cost.PAIR_S * n * (n + 1) / 2 * L * d / 256
        seconds = term_seconds(cfg)
        print(
            f"P {P:6d}  L {L:3d}  d {d:3d}  H {H}  measured {seconds:.3f} s  "
            f"implied TERM_S {(seconds - pairs) / shape:.2e}"
        )


if __name__ == "__main__":
    main()
