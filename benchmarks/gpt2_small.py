"""A GPT-2-small-sized model (12 layers, d = 768, 12 heads, V = 50,257; random initialisation,
float32) under its next-token loss: hessviz against its peers, one method per fresh process.

Each method runs in its own subprocess (``--one METHOD``) so that its peak resident memory
(``ru_maxrss``) is its own; the driver prints one table with medians, ratios and the load average.
Parameters: every weight of the 12 blocks (``transformer.h.*``: 85 M), for every method (hessviz
differentiates layer weights; the embeddings are constants for all). Tokens: the UTF-8 bytes of a
fixed text (GPT-2's first 256 ids are its byte tokens; nothing is downloaded), ``B`` sequences of
``L``.

    python benchmarks/gpt2_small.py --tokens 4x128 --methods product     # one product and gradient
    python benchmarks/gpt2_small.py --tokens 1x32 --methods top5 --layers 11  # top-5, last block
    python benchmarks/gpt2_small.py --tokens 4x128 --ranks 1 2 4         # per-rank product, gloo
    python benchmarks/gpt2_small.py --tokens 1x32 --interleave --repeats 3  # hessviz / kept graph, same load

Methods: ``hessviz`` (``hv.model_hessian``, the full term and ``outer``), ``hessviz_checkpoint``
(the same with ``checkpoint=True``: each layer rebuilt per product), ``double_backward``
(the gradient's graph kept, then ``autograd.grad`` per product: the strongest plain-torch
baseline), ``curvlinops_hessian`` / ``curvlinops_ggn`` (``HessianLinearOperator``,
``GGNLinearOperator``), ``eigenthings`` (hessian-eigenthings' ``HessianOperator``). Top-5:
``hessviz`` (``matfree.top_eigenvalues``), ``eigenthings`` (its ``lanczos``), ``curvlinops``
(scipy ``eigsh`` on ``to_scipy()``), each to a relative residual tolerance of 1e-3
(``‖H u − θ u‖ ≤ 10⁻³ |θ|``; hessian-eigenthings runs a fixed 120 steps and reports which Ritz
values meet it). ``--layers 11``: every method differentiates the weights of those blocks only
(the loss is still the whole model's), so that a Lanczos basis of 85 M-entry vectors is not
needed on a small machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

TEXT = (
    "Exact closed-form Hessians of Transformers: every derivative formula written once per operation and "
    "composed by the first- and second-order chain rule, matrix-free products through whole models, "
    "spectra by Lanczos, and a map of which block of parameters curves the loss. "
) * 40
FOLDER = Path(tempfile.gettempdir()) / "hessviz-gpt2-small-random"
WORKERS = Path(tempfile.gettempdir()) / "hessviz-gpt2-small-ranks"
TOL = 1e-3
EIGENTHINGS_STEPS = 120
"""hessian-eigenthings' Lanczos runs a fixed number of steps (with full reorthogonalisation); this
many, about what hessviz's thick-restart Lanczos needs here (it reports which of the 5 Ritz values
meet ``TOL``)."""


def checkpoint() -> Path:
    """GPT-2 small's configuration with random weights (seed 0), saved once as safetensors."""
    if not (FOLDER / "model.safetensors").exists():
        import transformers

        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
        model.save_pretrained(FOLDER)
    return FOLDER


def token_ids(batch: int, length: int) -> torch.Tensor:
    data = torch.tensor(list(TEXT.encode()), dtype=torch.int64)
    return data[: batch * length].reshape(batch, length)


DEVICE = torch.device("cpu")


def rss() -> int:
    """Peak memory of this process so far, bytes: resident on the CPU, allocated on a GPU."""
    if DEVICE.type == "cuda":
        return torch.cuda.max_memory_allocated(DEVICE)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class HeapPeak:
    """The peak of the C heap's bytes in use (glibc's ``mallinfo2``: ``uordblks + hblkhd``), sampled
    every 0.5 ms by a thread from ``start()``, above the bytes in use then: the memory a method's
    tensors really hold, without the pages the allocator keeps after freeing them (which ``ru_maxrss``
    counts). ``None`` where there is no glibc or on a GPU."""

    def __init__(self):
        import ctypes
        import threading

        class Info(ctypes.Structure):
            _fields_ = [
                (n, ctypes.c_size_t)
                for n in (
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
                ).split()
            ]

        try:
            self.libc = ctypes.CDLL("libc.so.6")
            self.libc.mallinfo2.restype = Info
        except (OSError, AttributeError):
            self.libc = None
        self.base = self.peak = 0
        self.running = False
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def in_use(self) -> int:
        info = self.libc.mallinfo2()
        return info.uordblks + info.hblkhd

    def start(self) -> HeapPeak:
        if self.libc is not None and DEVICE.type == "cpu":
            self.base = self.peak = self.in_use()
            self.running = True
            self.thread.start()
        return self

    def _watch(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.in_use())
            time.sleep(0.0005)

    def stop(self) -> int | None:
        if not self.running:
            return None
        self.running = False
        self.thread.join()
        return self.peak - self.base


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def clock(f) -> float:
    sync()
    t = time.perf_counter()
    f()
    sync()
    return time.perf_counter() - t


def on_device(model):
    """A hessviz ``Model`` with its layer weights and head on :data:`DEVICE`."""
    import dataclasses

    if DEVICE.type == "cpu":
        return model
    h = model.head
    head = dataclasses.replace(
        h, gamma=h.gamma.to(DEVICE), beta=h.beta.to(DEVICE), embedding=h.embedding.to(DEVICE)
    )
    return dataclasses.replace(model, params={k: v.to(DEVICE) for k, v in model.params.items()}, head=head)


LAYERS: list[int] | None = None
"""The blocks whose weights every method differentiates (``--layers``; ``None``: all 12)."""


def ours(name: str) -> bool:
    """Whether transformers' parameter ``name`` is one of the differentiated weights."""
    if not name.startswith("transformer.h."):
        return False
    return LAYERS is None or int(name.split(".")[2]) in LAYERS


def hessviz_names(model) -> list[str] | None:
    """hessviz's names of the same weights (``None``: every layer weight)."""
    if LAYERS is None:
        return None
    return [n for n in model.cfg.param_names if int(n.split(".")[0][1:]) in LAYERS]


def hf_model():
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(
        checkpoint(), attn_implementation="eager", dtype=torch.float32
    ).eval()
    for name, p in model.named_parameters():
        p.requires_grad_(ours(name))
    return model, [p for n, p in model.named_parameters() if ours(n)]


class Logits(torch.nn.Module):
    """The model as curvlinops takes it: a module ``ids (B, L) -> logits (B·(L−1), V)`` of the predicted
    positions (targets ``ids[:, 1:]``), so its mean cross-entropy is the next-token loss."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids).logits
        return logits[:, :-1].reshape(-1, logits.shape[-1])


def next_token_loss(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
    )


def one(method: str, kind: str, ids: torch.Tensor, repeats: int) -> dict:
    """Time one method in this process: ``kind`` ``product`` (the gradient, then ``repeats``
    products) or ``top5``."""
    out: dict = {"method": method, "kind": kind}
    gen = torch.Generator().manual_seed(0)
    if method.startswith("hessviz"):
        import hessviz as hv
        from hessviz import matfree

        model = on_device(hv.load_model(checkpoint(), dtype=torch.float32))
        out["rss_model"] = rss()
        heap = HeapPeak().start()
        state = {}

        def gradient():
            state["res"] = hv.model_hessian(
                model, ids, wrt=hessviz_names(model), checkpoint=method == "hessviz_checkpoint"
            )
            state["res"].gradient()

        out["gradient_s"] = clock(gradient)
        res = state["res"]
        out["P"] = res.size
        if kind == "product":
            v = torch.randn(res.size, generator=gen).to(DEVICE)
            out["product_s"] = [clock(lambda: res.matvec(v)) for _ in range(repeats)]
            out["ggn_product_s"] = [clock(lambda: res.matvec(v, "outer"))]
        else:
            top = {}
            out["top5_s"] = clock(lambda: top.update(v=matfree.top_eigenvalues(res, "full", k=5, tol=TOL)))
            out["rss_peak_top5"] = rss()
            out["top5"], out["products"] = top["v"].tolist(), res.products.matvecs
    else:
        model, params = hf_model()
        model.to(DEVICE)
        ids = ids.to(DEVICE)
        out["rss_model"] = rss()
        heap = HeapPeak().start()
        out["P"] = sum(p.numel() for p in params)
        if method == "double_backward":
            state = {}

            def gradient():
                loss = next_token_loss(model, ids)
                state["g"] = torch.autograd.grad(loss, params, create_graph=True)

            out["gradient_s"] = clock(gradient)
            vs = [torch.randn(p.shape, generator=gen).to(DEVICE) for p in params]
            hvp = lambda: torch.autograd.grad(state["g"], params, vs, retain_graph=True)  # noqa: E731
            out["product_s"] = [clock(hvp) for _ in range(repeats)]
        elif method.startswith("curvlinops"):
            import curvlinops

            cls = (  # top-5 ("curvlinops") is of the Hessian, as hessviz's and hessian-eigenthings'
                curvlinops.GGNLinearOperator
                if method == "curvlinops_ggn"
                else curvlinops.HessianLinearOperator
            )
            data = [(ids, ids[:, 1:].reshape(-1))]
            op = cls(Logits(model), torch.nn.CrossEntropyLoss(), params, data, check_deterministic=False)
            if kind == "product":
                out["gradient_s"] = clock(op.gradient_and_loss)
                v = torch.randn(out["P"], generator=gen).to(DEVICE)
                out["product_s"] = [clock(lambda: op @ v) for _ in range(repeats)]
            else:
                import numpy as np
                from scipy.sparse.linalg import eigsh

                sop = op.to_scipy()
                count = {"n": 0}
                mv = sop.matvec

                def counted(x):  # ARPACK in float64 (in float32 it returned 2.5 for a top of 27.1)
                    count["n"] += 1
                    return mv(x.astype(np.float32)).astype(np.float64)

                from scipy.sparse.linalg import LinearOperator

                lin = LinearOperator(sop.shape, matvec=counted, dtype=np.float64)
                t = time.perf_counter()
                vals = eigsh(
                    lin, k=5, which="LA", tol=TOL, v0=np.random.default_rng(0).standard_normal(out["P"])
                )[0]
                out["top5_s"], out["top5"], out["products"] = (
                    time.perf_counter() - t,
                    sorted(map(float, vals))[::-1],
                    count["n"],
                )
        elif method == "eigenthings":
            import hessian_eigenthings as he

            op = he.HessianOperator(
                model,
                [ids],
                lambda m, b: next_token_loss(m, b),
                param_filter=lambda n, p: ours(n),
            )
            if kind == "product":
                v = torch.randn(out["P"], generator=gen).to(DEVICE)
                out["product_s"] = [clock(lambda: op.matvec(v)) for _ in range(repeats)]
            else:  # a fixed number of steps (its `tol` only flags convergence): reported
                t = time.perf_counter()
                r = he.lanczos(
                    op, k=5, which="LA", tol=TOL, seed=0, max_iter=EIGENTHINGS_STEPS, reorthogonalize=True
                )
                out["top5_s"] = time.perf_counter() - t
                out["top5"] = r.eigenvalues.tolist()
                out["products"] = r.iterations
                out["converged"] = int(r.converged.sum())
        else:
            raise SystemExit(f"unknown method {method!r}")
    out["rss_peak"] = rss()
    out["heap_peak"] = heap.stop()
    return out


def interleaved(ids: torch.Tensor, repeats: int) -> dict:
    """hessviz's product and double backward's, alternated in one process, so both see the same load
    of the moment (the fairest comparison on a shared machine; no memory column)."""
    import hessviz as hv

    res = hv.model_hessian(on_device(hv.load_model(checkpoint(), dtype=torch.float32)), ids)
    v = torch.randn(res.size, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    model, params = hf_model()
    model.to(DEVICE)
    grads = torch.autograd.grad(next_token_loss(model, ids.to(DEVICE)), params, create_graph=True)
    vs = [torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE) for p in params]
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(clock(lambda: res.matvec(v)))
        theirs.append(clock(lambda: torch.autograd.grad(grads, params, vs, retain_graph=True)))
    return {
        "hessviz_s": ours,
        "double_backward_s": theirs,
        "ratio_of_medians": statistics.median(theirs) / statistics.median(ours),
    }


def rank_product(rank: int, world: int, init: str, ids: torch.Tensor, out: str) -> None:
    """One gloo rank: its share of ``ids``, the union batch's product timed twice on every rank."""
    import torch.distributed as dist

    import hessviz as hv

    torch.set_num_threads(max(1, 2 // world))
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600)
    )
    mine = ids[rank::world]
    model = hv.load_model(checkpoint(), dtype=torch.float32)
    res = hv.model_hessian(model, mine)
    v = torch.randn(res.size, generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(2):
        dist.barrier()
        t = time.perf_counter()
        hv_ = res.matvec(v)
        times.append(time.perf_counter() - t)
    Path(out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "world": world,
                "sequences": int(mine.shape[0]),
                "product_s": times,
                "checksum": float(hv_.double().norm()),
                "rss_peak": rss(),
            }
        )
    )
    dist.destroy_process_group()


def ranks(worlds: list[int], ids: torch.Tensor) -> list[dict]:
    import torch.multiprocessing as mp

    rows = []
    for world in worlds:
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(
                rank_product, nprocs=world, args=(world, f"file://{tmp}/rdv", ids, tmp), start_method="spawn"
            )
            got = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
        rows.append(
            {
                "world": world,
                "per_rank_product_s": [min(g["product_s"]) for g in got],
                "checksums": [g["checksum"] for g in got],
                "rss_peak": [g["rss_peak"] for g in got],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="4x128", help="BxL")
    ap.add_argument("--methods", choices=("product", "top5"), default="product")
    ap.add_argument("--only", nargs="*", help="a subset of the methods")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ranks", type=int, nargs="*", help="gloo process counts for the per-rank product")
    ap.add_argument(
        "--interleave", action="store_true", help="hessviz and double backward alternated in one process"
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="append the rows to this file")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (peak memory is then max_memory_allocated)")
    ap.add_argument(
        "--layers", type=int, nargs="*", help="differentiate these blocks' weights only (default: all 12)"
    )
    a = ap.parse_args()
    global DEVICE, LAYERS
    DEVICE = torch.device(a.device)
    LAYERS = a.layers
    B, L = map(int, a.tokens.lower().split("x"))
    ids = token_ids(B, L)
    if a.one:
        print(json.dumps(one(a.one, a.methods, ids, a.repeats)))
        return
    checkpoint()
    print(
        f"# GPT-2-small-sized, random init, float32, {B} x {L} tokens, {a.device}, "
        f"torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()}, "
        f"blocks {'all' if a.layers is None else a.layers}",
        flush=True,
    )
    if a.interleave:
        rows = [interleaved(ids, a.repeats)]
        print(json.dumps(rows[0]))
    elif a.ranks:
        rows = ranks(a.ranks, ids)
    else:
        methods = {
            "product": [
                "hessviz",
                "hessviz_checkpoint",
                "double_backward",
                "curvlinops_hessian",
                "curvlinops_ggn",
                "eigenthings",
            ],
            "top5": ["hessviz", "eigenthings", "curvlinops"],
        }[a.methods]
        rows = []
        for m in a.only or methods:
            cmd = [
                sys.executable,
                __file__,
                "--one",
                m,
                "--methods",
                a.methods,
                "--tokens",
                a.tokens,
                "--repeats",
                str(a.repeats),
                "--device",
                a.device,
                *(["--layers", *map(str, a.layers)] if a.layers else []),
            ]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                print(f"{m}: failed\n{r.stderr[-2000:]}", flush=True)
                continue
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
        report(rows)
    print(f"# load average after: {os.getloadavg()}")
    if a.json:
        with a.json.open("a") as fh:
            fh.write(
                json.dumps(
                    {
                        "tokens": a.tokens,
                        "kind": "interleave" if a.interleave else "ranks" if a.ranks else a.methods,
                        "loadavg": os.getloadavg(),
                        "rows": rows,
                    }
                )
                + "\n"
            )


def report(rows: list[dict]) -> None:
    mine = next((r for r in rows if r["method"] == "hessviz"), None)
    key = "product_s" if "product_s" in rows[0] else "top5_s"
    print(
        f"\n| method | P | gradient s | {key.replace('_s', '')} s (median) | × hessviz's time | "
        "peak RSS GiB | peak − model GiB | heap in use, peak − model GiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = r.get(key)
        t = statistics.median(t) if isinstance(t, list) else t
        base = mine.get(key) if mine else None
        base = statistics.median(base) if isinstance(base, list) else base
        ratio = f"{t / base:.2f}" if base and t else "–"
        g = r.get("gradient_s")
        heap = "–" if r.get("heap_peak") is None else f"{r['heap_peak'] / 2**30:.2f}"
        print(
            f"| {r['method']} | {r['P']:,} | {'–' if g is None else f'{g:.2f}'} | {t:.2f} | {ratio} | "
            f"{r['rss_peak'] / 2**30:.2f} | {(r['rss_peak'] - r['rss_model']) / 2**30:.2f} | "
            f"{heap} |"
        )
        if "top5" in r:
            ref = mine.get("top5") if mine else None
            notes = [f"products {r.get('products', '?')}"]
            if "converged" in r:
                notes.append(f"{r['converged']}/5 meet the tolerance")
            if ref and r is not mine:
                worst = max(abs(x - y) / abs(y) for x, y in zip(sorted(r["top5"]), sorted(ref)))
                notes.append(f"max relative difference to hessviz's {worst:.1e}")
            values = ", ".join(f"{x:.6g}" for x in sorted(r["top5"])[::-1])
            print(f"|   top-5 | {values} | {' | '.join(notes)} |")


if __name__ == "__main__":
    main()
