"""Issue 18's two bench rows, side by side in one process (CPU, float64).

    PYTHONPATH=. python scripts/bench_modern.py [--repeats N] [--threads T] [--out benchmarks/MODERN.md]

(a) the full Hessian of a Llama-style layer (``benchmarks.dense.LLAMA_LAYER``) against reverse-over-reverse
autograd (``jacrev`` of ``grad``), and the memory floor; (b) one HVP at a SmolLM2-135M-sized layer
(``benchmarks.matfree.SMOLLM``, L = 64) against double backward with the gradient's graph kept
across products (PyHessian's way) and against double backward per call. Prints and writes medians,
ratios and the load average.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import time
from pathlib import Path

import torch

from hessviz.bench import dense, matfree


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", choices=("both", "dense", "hvp"), default="both")
    p.add_argument("--out", type=Path, default=Path("benchmarks/MODERN.md"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    started, load = time.perf_counter(), os.getloadavg()
    print(f"load average at the start: {load}", flush=True)
    sections = []
    if a.only in ("both", "dense"):
        dense_md = dense.render([dense.llama_layer(a.repeats, torch.device("cpu"))], "")
        print(dense_md, flush=True)
        sections += [
            "## Full Hessian of a Llama-style layer (against reverse-over-reverse autograd)",
            "",
            dense_md,
            "",
        ]
    if a.only in ("both", "hvp"):
        hvp = matfree.smollm_hvp_row(64, max(a.repeats, 5))
        hvp_md = matfree.markdown([hvp]).split("\n\n| spectral")[0]
        print(hvp_md, flush=True)
        sections += ["## One HVP at a SmolLM2-135M-sized layer (L = 64)", "", hvp_md, ""]
    end = os.getloadavg()
    text = "\n".join(
        [
            "# Issue 18: modern decoder blocks (float64, CPU)",
            "",
            f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}; machine: {platform.machine()}, "
            f"{os.cpu_count()} cores, {a.threads} torch threads; torch {torch.__version__}",
            "- command: `PYTHONPATH=. python scripts/bench_modern.py "
            f"--repeats {a.repeats} --threads {a.threads} --only {a.only}`",
            f"- load average (1, 5, 15 min) at the start: {', '.join(f'{x:.1f}' for x in load)}; at the end: "
            f"{', '.join(f'{x:.1f}' for x in end)}; total {time.perf_counter() - started:.0f} s",
            "",
            *sections,
        ]
    )
    a.out.write_text(text)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
