"""Old main against new main, alternated in one run: no regression from a refactor.

Each round runs the same probe under each of two git revisions (checked out into temporary
worktrees), one fresh process per revision per round, old and new alternating so that both see the
same machine load. The probe, on one Pre-LN block (float64, L = 64, d = 48, 4 heads, d_ff = 96,
GELU, cross-entropy; ``wrt = W_Q, W_V, W_1``: P' = 9,216), times:

* ``dense``: ``hv.hessian(...).full`` of ``W_Q, W_V`` (P' = 4,608), the dense closed-form term;
* ``first product``: ``hv.hessian(...)`` and its first product ``res.matvec(v)`` (the set-up a
  notebook pays once);
* ``dense + product``: one ``hv.hessian`` of ``W_Q, W_V``, its dense term and a product (the two
  engines at one point: one forward pass serves both since the dense engine folds the tape);
* ``product``: the median of 10 more products at the same point;
* ``top-5``: ``matfree.top_eigenvalues(res, "full", k=5, solver="torch")``.

It prints each revision's median over the rounds, the ratio new / old (< 1: new is faster) and the
load average at the start and the end::

    python benchmarks/old_vs_new.py a2fefb1 HEAD --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, statistics, time, torch
import hessviz as hv
from hessviz import matfree
torch.set_num_threads(int(__import__("os").environ.get("PROBE_THREADS", "1")))
cfg = hv.BlockConfig(seq_len=64, d_model=48, d_k=12, d_ff=96, n_heads=4, out_proj=True, norm="pre",
                     ln_affine=True, activation="gelu", loss="ce")
params = hv.init_params(cfg, seed=0)
X, Y = hv.sample_inputs(cfg, seed=0)
wrt = ("W_Q", "W_V", "W_1")
out = {}
t = time.perf_counter()
hv.hessian(cfg, params, X, Y, wrt=wrt[:2]).full
out["dense"] = time.perf_counter() - t
t = time.perf_counter()
res = hv.hessian(cfg, params, X, Y, wrt=wrt)
v = torch.ones(res.size, dtype=torch.float64)
res.matvec(v)
out["first product"] = time.perf_counter() - t
t = time.perf_counter()
res2 = hv.hessian(cfg, params, X, Y, wrt=wrt[:2])
res2.full
res2.matvec(torch.ones(res2.size, dtype=torch.float64))
out["dense + product"] = time.perf_counter() - t
times = []
for _ in range(10):
    t = time.perf_counter(); res.matvec(v); times.append(time.perf_counter() - t)
out["product"] = statistics.median(times)
t = time.perf_counter()
matfree.top_eigenvalues(res, "full", k=5, solver="torch")
out["top-5"] = time.perf_counter() - t
print(json.dumps(out))
"""


def worktree(rev: str, where: Path) -> Path:
    path = where / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), rev], check=True)
    return path


def probe(tree: Path) -> dict[str, float]:
    env = os.environ | {"PYTHONPATH": str(tree)}
    run = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tree, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {rev: worktree(rev, Path(tmp)) for rev in (a.old, a.new)}
        got: dict[str, list[dict[str, float]]] = {rev: [] for rev in trees}
        try:
            for r in range(a.rounds):
                for rev in trees if r % 2 == 0 else reversed(list(trees)):
                    got[rev].append(probe(trees[rev]))
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
                )
    load1 = os.getloadavg()[0]
    print(f"{a.rounds} rounds, old = {a.old}, new = {a.new}; load average {load0:.1f} -> {load1:.1f}")
    print(f"{'':16}{'old (s)':>12}{'new (s)':>12}{'new / old':>12}")
    for key in got[a.old][0]:
        old = statistics.median(x[key] for x in got[a.old])
        new = statistics.median(x[key] for x in got[a.new])
        print(f"{key:16}{old:12.4f}{new:12.4f}{new / old:12.2f}")


if __name__ == "__main__":
    main()
