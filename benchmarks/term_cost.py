"""Calibrate ``hessviz.cost.TERM_S``: one dense closed-form term's CPU on one thread, warm, against
the cost model's shape ``P² (1 + L d/512)(1 + (H − 1)/5)`` (after the fixed per-pair work ``PAIR_S``).

    python benchmarks/term_cost.py

Prints, per block, the median of three ``hv.hessian(...).full`` (process CPU) and the ``TERM_S`` it
implies; ``benchmarks/COST.md`` keeps a run.
"""

import statistics
import time

import torch

import hessviz as hv
from hessviz import cost

torch.set_num_threads(1)
cfgs = [
    hv.BlockConfig(seq_len=8, d_model=24, d_k=8, d_ff=48),
    hv.BlockConfig(seq_len=16, d_model=32, d_k=32, d_ff=64),
    hv.BlockConfig(seq_len=8, d_model=48, d_k=48, d_ff=96),
    hv.BlockConfig(
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
    hv.BlockConfig(seq_len=32, d_model=24, d_k=24, d_ff=48),
    hv.BlockConfig(seq_len=64, d_model=32, d_k=8, n_heads=4, out_proj=True, d_ff=64, norm="pre"),
    hv.BlockConfig(
        seq_len=16,
        d_model=48,
        d_k=12,
        n_heads=4,
        out_proj=True,
        d_ff=96,
        norm="post",
        bias=True,
        ln_affine=True,
    ),
]
for cfg in cfgs:
    p = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0)
    hv.hessian(cfg, p, X, Y).full
    ts = []
    for _ in range(3):
        s = time.process_time()
        hv.hessian(cfg, p, X, Y).full
        ts.append(time.process_time() - s)
    P, L, d, H = cfg.num_params, cfg.seq_len, cfg.d_model, cfg.n_heads
    n = len(cfg.param_names)
    shape = P * P * (1 + L * d / 512) * (1 + (H - 1) / 5)
    pair = cost.PAIR_S * n * (n + 1) / 2 * L * d / 256
    m = statistics.median(ts)
    print(
        f"P={P:6d} L={L} d={d} H={H} n={n} meas {m:.3f} pairpart {pair:.3f} implied TERM_S {(m - pair) / shape:.2e}  (m/shape {m / shape:.2e})"
    )
