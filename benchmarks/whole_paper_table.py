"""The paper's per-tensor table (Tomihari & Sato's gradient heterogeneity) on MiniLM, side by side:
hessviz (closed-form products through the whole model, Lanczos k = 1 from the tensor's gradient,
stopped when each top eigenvalue is within 1e-3 relative by its error bound) against PyHessian's method
(power iteration per tensor, tolerance 1e-3, at most 100 iterations, on double-backward products
through ``transformers``' ``BertModel`` with the graph kept).

The tensors: layers first / middle / last × {attention-output LN γ (``ln1_gamma``), ``W_Q``, ``W_K``,
``W_V``, ``W_1``, output LN γ (``ln2_gamma``), ``W_2``} and the classifier's weight (``head.W``):
22 tensors. The objective: an ``hv.Classifier`` (``W (d, 2)`` seeded, ``b = 0``, labels 0/1
alternating, CLS pooling) on ``--texts`` windows of ``--tokens`` tokens of Python's help text
(each starting with ``[CLS]``). Per tensor: the top eigenvalue of its diagonal Hessian block and its
gradient norm. Prints each method's time (median of ``--repeats``), the ratio, the largest relative
difference of the top eigenvalues and the gradient norms, products per method, each method's distance
from a tight reference (hessviz at a residual tolerance of 1e-8; ``--no-reference`` skips it), the
peak resident memory and the load average before and after.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/whole_paper_table.py [--texts 8 --tokens 64]

``--per-head``: also the whole per-head table (every layer × every weight × every head, top
eigenvalue and gradient norm) in-process and on a two-worker Dask ``LocalCluster``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import hessviz as hv
from hessviz import pretrained
from hessviz.pretrained.checkpoint import bundled_folder
from hessviz.whole.table import tensor_table

MODEL = "all-MiniLM-L6-v2"
WEIGHTS = ("ln1_gamma", "W_Q", "W_K", "W_V", "W_1", "ln2_gamma", "W_2")
HF = {
    "ln1_gamma": "attention.output.LayerNorm.weight",
    "W_Q": "attention.self.query.weight",
    "W_K": "attention.self.key.weight",
    "W_V": "attention.self.value.weight",
    "W_1": "intermediate.dense.weight",
    "ln2_gamma": "output.LayerNorm.weight",
    "W_2": "output.dense.weight",
}


def batch(texts: int, tokens: int) -> torch.Tensor:
    """``(texts, tokens)`` ids: the first ``tokens`` of each long entry of Python's help text."""
    import pydoc_data.topics as topics

    rows = []
    for text in topics.topics.values():
        if len(text) < 8 * tokens:
            continue
        ids = pretrained.token_ids(MODEL, text[: 8 * tokens])
        if len(ids) >= tokens:
            rows.append(ids[:tokens])
        if len(rows) == texts:
            return torch.tensor(rows)
    raise SystemExit(f"only {len(rows)} texts of {tokens} tokens")


def classifier(texts: int) -> hv.Classifier:
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(384, 2, generator=gen, dtype=torch.float64) / 384**0.5
    return hv.Classifier(W, torch.zeros(2, dtype=torch.float64), [i % 2 for i in range(texts)], "cls")


def names(layers: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(f"l{i}.{w}" for i in layers for w in WEIGHTS) + ("head.W",)


def ours(
    ids: torch.Tensor, head: hv.Classifier, tensors: tuple[str, ...], tol: float, bound: str = "value"
) -> tuple[dict, int]:
    model = hv.load_model(MODEL)
    res = hv.model_hessian(model, ids, objective=head, wrt=tensors)
    table = tensor_table(
        res, tensors=tensors, trace_samples=0, exact_limit=0, tol=tol, which="magnitude", bound=bound
    )
    return {r.name: (r.top, r.grad_norm) for r in table.rows}, table.matvecs


def power_iteration(
    g: torch.Tensor, p: torch.Tensor, gen: torch.Generator, tol: float = 1e-3, most: int = 100
) -> tuple[float, int]:
    """PyHessian's ``eigenvalues(top_n=1)`` on one tensor: ``v`` Gaussian, normalised; ``Hv`` by a
    double backward through the kept graph; stop when the Rayleigh quotient moves less than ``tol``
    relative (``|λ − λ'| / (|λ'| + 1e-6)``), at most ``most`` products."""
    v = torch.randn(p.shape, generator=gen, dtype=p.dtype)
    v /= v.norm()
    eig, n = None, 0
    for n in range(1, most + 1):  # noqa: B007 - n is the count returned
        (Hv,) = torch.autograd.grad(g, p, grad_outputs=v, retain_graph=True)
        new = float((Hv * v).sum())
        v = Hv / (Hv.norm() + 1e-6)
        if eig is not None and abs(new - eig) / (abs(eig) + 1e-6) < tol:
            eig = new
            break
        eig = new
    return eig, n


def theirs(ids: torch.Tensor, head: hv.Classifier, tensors: tuple[str, ...]) -> tuple[dict, int]:
    import transformers

    model = transformers.BertModel.from_pretrained(
        bundled_folder(MODEL), dtype=torch.float64, attn_implementation="sdpa", local_files_only=True
    ).eval()
    params = dict(model.named_parameters())
    W = head.W.clone().requires_grad_(True)
    leaves = {}
    for n in tensors:
        if n == "head.W":
            leaves[n] = W
        else:
            layer, local = n.split(".", 1)
            leaves[n] = params[f"encoder.layer.{layer[1:]}.{HF[local]}"]
    gen = torch.Generator().manual_seed(0)
    out, products = {}, 0
    with sdpa_kernel(SDPBackend.MATH):  # the fused CPU kernel has no double backward
        hidden = model(input_ids=ids).last_hidden_state
        loss = torch.nn.functional.cross_entropy(hidden[:, 0] @ W + head.b, head.labels)
        grads = torch.autograd.grad(loss, list(leaves.values()), create_graph=True)
        for (n, p), g in zip(leaves.items(), grads):
            top, k = power_iteration(g, p, gen)
            out[n] = (top, float(g.detach().norm()))
            products += k
    return out, products


def timed(fn, repeats: int):
    seconds, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - t)
    return statistics.median(seconds), seconds, result


def per_head(ids: torch.Tensor, head: hv.Classifier, workers: int) -> None:
    """The whole per-head table: every layer weight of every layer, headed ones split into heads (blocks
    of ≤ 64 entries, a head's bias, exactly: a key bias's block is exactly 0, which ARPACK refuses)."""
    from distributed import Client, LocalCluster

    model = hv.load_model(MODEL)
    res = hv.model_hessian(model, ids, objective=head)
    opts = dict(by_head=True, trace_samples=0, exact_limit=64, tol=1e-3, which="magnitude", bound="value")
    t = time.perf_counter()
    here = tensor_table(res, **opts)
    a = time.perf_counter() - t
    print(
        f"per-head table: {len(here.rows)} tensors, {here.matvecs:,} products, in-process {a:.1f} s; "
        f"load {os.getloadavg()}",
        flush=True,
    )
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster,
        Client(cluster) as client,
    ):
        t = time.perf_counter()
        there = tensor_table(res, executor=client.get_executor(), **opts)
        b = time.perf_counter() - t
    same = [(r.top, r.grad_norm) for r in here.rows] == [(r.top, r.grad_norm) for r in there.rows]
    print(
        f"per-head table on a {workers}-worker LocalCluster {b:.1f} s (ratio {a / b:.2f}); bit-identical "
        f"{same}; load {os.getloadavg()}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 2, 5])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--tol", type=float, default=1e-3, help="hessviz's Lanczos tolerance")
    ap.add_argument(
        "--bound",
        default="value",
        choices=("value", "residual"),
        help="what --tol bounds: each top eigenvalue's error (default) or its residual",
    )
    ap.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the tight reference (hessviz at residual tol 1e-8) both are measured against",
    )
    ap.add_argument("--per-head", action="store_true")
    ap.add_argument("--only-per-head", action="store_true", help="skip the 22-tensor comparison")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    ids, head = batch(args.texts, args.tokens), classifier(args.texts)
    if args.only_per_head:
        per_head(ids, head, args.workers)
        return
    tensors = names(tuple(args.layers))
    print(
        f"{MODEL}: {len(tensors)} tensors, {args.texts} texts × {args.tokens} tokens, CLS classifier; "
        f"torch threads {torch.get_num_threads()}; load {os.getloadavg()}",
        flush=True,
    )
    a, a_all, (mine, mine_products) = timed(
        lambda: ours(ids, head, tensors, args.tol, args.bound), args.repeats
    )
    print(
        f"hessviz (closed form, Lanczos k = 1 from the gradient, tol {args.tol:g} on the {args.bound}, "
        f"largest magnitude): median {a:.1f} s "
        f"{[round(s, 1) for s in a_all]}, {mine_products:,} products; load {os.getloadavg()}",
        flush=True,
    )
    b, b_all, (ref, ref_products) = timed(lambda: theirs(ids, head, tensors), args.repeats)
    print(
        f"PyHessian-style power iteration (tol 1e-3, ≤ 100): median {b:.1f} s "
        f"{[round(s, 1) for s in b_all]}, {ref_products:,} products; load {os.getloadavg()}",
        flush=True,
    )
    top = max(abs(mine[n][0] - ref[n][0]) / abs(ref[n][0]) for n in tensors)
    grad = max(abs(mine[n][1] - ref[n][1]) / abs(ref[n][1]) for n in tensors)
    worst = max(tensors, key=lambda n: abs(mine[n][0] - ref[n][0]) / abs(ref[n][0]))
    print(
        f"ratio power-iteration / hessviz: {b / a:.2f}×; top eigenvalues agree to {top:.2e} relative "
        f"(worst {worst}: {mine[worst][0]:.6g} vs {ref[worst][0]:.6g}); gradient norms to {grad:.2e}"
    )
    tight = None
    if not args.no_reference:
        t = time.perf_counter()
        tight, tight_products = ours(ids, head, tensors, 1e-8, "residual")
        print(
            f"reference (hessviz, residual tol 1e-8): {time.perf_counter() - t:.1f} s, {tight_products:,} "
            f"products; load {os.getloadavg()}",
            flush=True,
        )
        for who, got in (("hessviz", mine), ("power iteration", ref)):
            err = {n: abs(got[n][0] - tight[n][0]) / abs(tight[n][0]) for n in tensors}
            worst = max(err, key=err.get)
            print(
                f"  {who}: top eigenvalues within {err[worst]:.1e} relative of the reference (worst {worst})"
            )
    for n in tensors:
        extra = "" if tight is None else f" (reference {tight[n][0]:.8g})"
        print(f"  {n:14s} top {mine[n][0]:12.6g} vs {ref[n][0]:12.6g}{extra}   ‖g‖ {mine[n][1]:.6g}")
    print(
        f"peak resident memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB; "
        f"load {os.getloadavg()}",
        flush=True,
    )
    if args.per_head:
        per_head(ids, head, args.workers)


if __name__ == "__main__":
    main()
