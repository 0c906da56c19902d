"""SmolLM2-135M from its GGUF file, side by side in one run: hessviz's top eigenvalue of each weight
tensor's diagonal Hessian block against PyHessian-style power iteration on kept-graph double backward
through ``transformers``' ``LlamaForCausalLM`` (eager attention, the gradient's graph built once and
kept, one ``autograd.grad`` per product), same text, same float32, same tensors. Also: the time from
``hv.load_model("smollm2-135m")`` to its first product, and the peak resident memory of each phase.

    PYTHONPATH=. OMP_NUM_THREADS=2 python benchmarks/smollm2.py [--tokens 32] [--layers 0 14 29]

Both sides stop at a relative change of the eigenvalue estimate below ``--tol`` (power iteration) or
Lanczos's residual ``‖Hu − λu‖ ≤ tol·|λ|`` (hessviz), at most ``--iters`` products per tensor for the
baseline. Prints the seconds and products per tensor, the medians, the ratio and the load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 14, 29])
    ap.add_argument("--weights", nargs="+", default=["W_Q", "W_K", "W_V", "W_O", "W_G", "W_1", "W_2"])
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    import hessviz as hv
    from hessviz import matfree, pretrained
    from hessviz.pretrained.checkpoint import bundled_file

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load {os.getloadavg()}", flush=True)
    text = (
        "The sorted() function returns a new sorted list from the items in the iterable. "
        "It accepts a key function and a reverse flag, and it is stable: equal items keep their order."
    )
    t0 = time.perf_counter()
    model = hv.load_model("smollm2-135m", dtype=torch.float32)
    ids = torch.tensor(pretrained.token_ids("smollm2-135m", text)[: args.tokens])
    names = tuple(f"l{i}.{w}" for i in args.layers for w in args.weights)
    res = hv.model_hessian(model, ids, "next_token", wrt=names)
    res.matvec(torch.randn(res.size))
    first = time.perf_counter() - t0
    print(
        f"hessviz: load to first product {first:.1f} s ({len(ids)} tokens, {len(names)} tensors, "
        f"P' = {res.size:,}); peak {peak_mib():.0f} MiB",
        flush=True,
    )

    ours = {}
    for n in names:
        t = time.perf_counter()
        pairs = matfree.eigenpairs(res, k=1, names=(n,), tol=args.tol, seed=0)
        ours[n] = (float(pairs.values[0]), time.perf_counter() - t, int(pairs.matvecs))
        print(f"  hv  {n:10s} λ = {ours[n][0]:.5g}  {ours[n][1]:6.2f} s  {ours[n][2]} products", flush=True)
    peak_ours = peak_mib()

    import transformers

    path = bundled_file("smollm2-135m")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, attn_implementation="eager", dtype=torch.float32
    ).eval()
    params = dict(ref.named_parameters())
    layer = {
        "W_Q": "self_attn.q_proj",
        "W_K": "self_attn.k_proj",
        "W_V": "self_attn.v_proj",
        "W_O": "self_attn.o_proj",
        "W_G": "mlp.gate_proj",
        "W_1": "mlp.up_proj",
        "W_2": "mlp.down_proj",
    }
    logits = ref(input_ids=ids[None]).logits[0]
    loss = torch.nn.functional.cross_entropy(logits[:-1], ids[1:])
    leaves = [params[f"model.layers.{n.split('.')[0][1:]}.{layer[n.split('.')[1]]}.weight"] for n in names]
    t = time.perf_counter()
    grads = torch.autograd.grad(loss, leaves, create_graph=True)  # the kept graph, built once
    graph_s = time.perf_counter() - t
    theirs = {}
    gen = torch.Generator().manual_seed(0)
    for n, p, g in zip(names, leaves, grads):
        t = time.perf_counter()
        v = torch.randn(p.shape, generator=gen)
        v /= v.norm()
        lam, k = 0.0, 0
        for k in range(1, args.iters + 1):  # PyHessian's power iteration
            (Hv,) = torch.autograd.grad(g, p, grad_outputs=v, retain_graph=True)
            new = float((Hv * v).sum())
            v = Hv / Hv.norm()
            if k > 1 and abs(new - lam) <= args.tol * abs(new):
                lam = new
                break
            lam = new
        theirs[n] = (lam, time.perf_counter() - t, k)
        print(f"  ref {n:10s} λ = {lam:.5g}  {theirs[n][1]:6.2f} s  {k} products", flush=True)
    print(f"baseline: graph {graph_s:.1f} s; peak {peak_mib():.0f} MiB (hessviz phase {peak_ours:.0f} MiB)")
    a = statistics.median(ours[n][1] for n in names)
    b = statistics.median(theirs[n][1] for n in names)
    pa = statistics.median(ours[n][2] for n in names)
    pb = statistics.median(theirs[n][2] for n in names)
    rel = statistics.median(abs(ours[n][0] - theirs[n][0]) / abs(theirs[n][0]) for n in names)
    print(
        f"median per tensor: hessviz {a:.2f} s / {pa} products, power iteration {b:.2f} s / {pb} products; "
        f"ratio (power / hessviz) {b / a:.2f}; median |Δλ|/λ {rel:.2e}; load {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
