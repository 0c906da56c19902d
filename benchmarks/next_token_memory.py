"""The next-token objective at GPT-2 small's vocabulary in bounded memory: hessviz's chunked closed form
(:class:`hessviz.losses.NextToken`) against the same objective through torch's ``cross_entropy`` with
the gradient's graph kept (the logits materialised), one sequence of curvlinops' length, in one run.

For each chunk size: the C heap's peak bytes in use above those before (glibc ``mallinfo2``, sampled
every 0.5 ms: :class:`benchmarks.gpt2_small.HeapPeak`) for the objective at its point (value and
gradient) and for one product of ``k`` columns, the times, and how far the float32 numbers are from a
float64 evaluation (unchunked) of the same closed form: the float32 floor, whatever the chunk.

    python benchmarks/next_token_memory.py                 # L = 1024, k = 1 and 8, chunks 1024 … 16
    python benchmarks/next_token_memory.py --length 256 --columns 1

The head is GPT-2 small's (random initialisation, seed 0: :func:`benchmarks.gpt2_small.checkpoint`):
final LayerNorm, tied unembedding ``E (50,257, 768)``; ``Z`` is a seeded normal ``(L, 768)``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt2_small import TEXT, HeapPeak, checkpoint  # noqa: E402

import hessviz as hv  # noqa: E402
from hessviz.losses import LMHead, NextToken  # noqa: E402


def measured(f) -> tuple[object, float, int]:
    """``(f(), seconds, heap peak above the start in bytes)``."""
    gc.collect()
    heap = HeapPeak().start()
    t = time.perf_counter()
    out = f()
    seconds = time.perf_counter() - t
    return out, seconds, heap.stop() or 0


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def kept_graph(Z: torch.Tensor, ids: torch.Tensor, head, dZ: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same objective by autograd, logits materialised: value, gradient, and ``k`` products with the
    gradient's graph kept (double backward)."""
    Z = Z.detach().requires_grad_(True)
    h = torch.nn.functional.layer_norm(Z, (Z.shape[1],), head.gamma, head.beta, head.eps)
    logits = h[:-1] @ head.embedding.T
    value = torch.nn.functional.cross_entropy(logits, ids[1:])
    (g,) = torch.autograd.grad(value, Z, create_graph=True)
    products = torch.stack([torch.autograd.grad(g, Z, d, retain_graph=True)[0] for d in dZ])
    return value.detach(), g.detach(), products


def columns(
    run, dZs: dict[int, torch.Tensor], repeats: int, exact: NextToken, exact_products: dict[int, torch.Tensor]
) -> tuple[str, str]:
    """The table's product cells of one method, ``run(dZ) -> (value, gradient, products)`` timed for
    each ``k`` (median of ``repeats``, the heap's peak over them), and its error cell against the
    float64 ``exact`` objective and its ``exact_products`` by ``k``: the value's and the gradient's, and
    the worst product's over ``k``."""
    cells, errors = [], []
    for k, dZ in dZs.items():
        times, peaks = [], []
        for _ in range(repeats):
            (value, grad, out), t, m = measured(lambda dZ=dZ: run(dZ))
            times.append(t)
            peaks.append(m)
        cells.append(f"{statistics.median(times):.3f}, {max(peaks) / 2**20:.0f}")
        errors.append(relative(out, exact_products[k]))
    err = (
        f"{abs(float(value) - float(exact.value)) / abs(float(exact.value)):.1e}, "
        f"{relative(grad, exact.grad):.1e}, {max(errors):.1e}"
    )
    return " | ".join(cells), err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--columns", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--chunks", type=int, nargs="*", default=[1024, 256, 64, 16])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    head = hv.load_model(checkpoint(), dtype=torch.float32).head
    L, d, V = a.length, head.embedding.shape[1], head.embedding.shape[0]
    data = torch.tensor(list(TEXT.encode()), dtype=torch.int64)
    ids = data[:L]
    gen = torch.Generator().manual_seed(0)
    Z = torch.randn(L, d, generator=gen)
    dZs = {k: torch.randn(k, L, d, generator=gen) for k in a.columns}
    print(
        f"# next-token objective, GPT-2 small's head (V = {V:,}, d = {d}), L = {L}, float32, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()}"
    )
    print(f"# one chunk of logits: chunk × V × 4 B; the whole sequence's logits {L * V * 4 / 2**20:.0f} MiB")

    head64 = LMHead(
        head.gamma.double(), head.beta.double(), head.eps, head.embedding.double(), head.norm_type
    )
    exact = NextToken(Z.double(), ids, head64, chunk=L)
    exact_products = {k: exact.product(dZ.double()) for k, dZ in dZs.items()}

    print(
        "\n| method | chunk | at the point: s, heap MiB | "
        + " | ".join(f"product k = {k}: s, heap MiB" for k in a.columns)
        + " | rel. error vs float64 (value, gradient, product) |"
    )
    print("|---|---|---|" + "---|" * len(a.columns) + "---|")
    for chunk in a.chunks:
        loss, t0, m0 = measured(lambda c=chunk: NextToken(Z, ids, head, chunk=c))
        cells, err = columns(
            lambda dZ, loss=loss: (loss.value, loss.grad, loss.product(dZ)),
            dZs,
            a.repeats,
            exact,
            exact_products,
        )
        print(f"| hessviz `NextToken` | {chunk} | {t0:.3f}, {m0 / 2**20:.0f} | {cells} | {err} |")
        del loss
    cells, err = columns(lambda dZ: kept_graph(Z, ids, head, dZ), dZs, a.repeats, exact, exact_products)
    print(f"| `cross_entropy`, graph kept (value, gradient, products) | – | – | {cells} | {err} |")
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
