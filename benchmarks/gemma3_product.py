"""One whole-model Hessian-vector product of Gemma 3 270M (``"gemma3-270m"``) on 32 tokens, in every layer
weight at once (``P' ≈ 100M``), under its own next-token loss through the 262,144-token head: hessviz's
closed form (``hv.model_hessian(...).matvec``) against double backward with the gradient's graph kept
(PyHessian's way: ``autograd.grad(create_graph=True)`` once, then one ``autograd.grad`` per product)
through ``transformers``' ``Gemma3ForCausalLM`` loaded from the same file (eager attention).

Each side runs in its own process so its peak resident memory (``ru_maxrss``) is its own:

    PYTHONPATH=. OMP_NUM_THREADS=2 python benchmarks/gemma3_product.py --side hessviz
    PYTHONPATH=. OMP_NUM_THREADS=2 python benchmarks/gemma3_product.py --side autograd

Prints the set-up (load, and for hessviz building the objective at the point; for autograd the forward
and the kept-graph gradient), the seconds of each of ``--products`` products, their median, the peak
resident memory and the load average, and checks that both sides' products agree when ``--check`` names
a file to exchange one product through.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch

TEXT = (
    "The quick brown fox jumps over the lazy dog. Gemma 3 places a norm around each sublayer's input and "
    "output, and its Hessian is computed here exactly, by products, for every weight of every layer at once."
)


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def token_ids(n: int) -> torch.Tensor:
    """The first ``n`` tokens of :data:`TEXT` by ``transformers``' tokenizer of the file (``<bos>`` first)."""
    import transformers

    from hessviz.pretrained.checkpoint import bundled_file

    path = bundled_file("gemma3-270m")
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return torch.tensor(tok(TEXT).input_ids[:n])


def hessviz_side(ids: torch.Tensor, dtype: torch.dtype, products: int, gen: torch.Generator):
    import hessviz as hv

    t0 = time.perf_counter()
    model = hv.load_model("gemma3-270m", dtype=dtype)
    loaded = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = hv.model_hessian(model, ids, "next_token")
    built = time.perf_counter() - t0
    v = torch.randn(res.size, generator=gen, dtype=dtype)
    times, out = [], None
    for _ in range(products):
        t0 = time.perf_counter()
        out = res.matvec(v)
        times.append(time.perf_counter() - t0)
    return {"load": loaded, "setup": built, "P": res.size, "names": res.names}, times, v, out, model


def autograd_side(ids: torch.Tensor, dtype: torch.dtype, products: int, gen: torch.Generator, names, hv_cfg):
    import transformers

    from hessviz.pretrained.checkpoint import bundled_file
    from tests import gemma_reference as ref

    path = bundled_file("gemma3-270m")
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, attn_implementation="eager", dtype=torch.float32
    ).to(dtype)
    loaded = time.perf_counter() - t0
    leaves = {n: ref.hf_leaf(n, 256) for n in names}
    params = dict(model.named_parameters())
    keys = list(dict.fromkeys(k for k, _ in leaves.values()))
    for p in model.parameters():
        p.requires_grad_(False)
    for k in keys:
        params[k].requires_grad_(True)
    t0 = time.perf_counter()
    loss = ref.next_token_loss(model, ids)
    grads = torch.autograd.grad(loss, [params[k] for k in keys], create_graph=True)
    built = time.perf_counter() - t0
    offsets = hv_cfg.offsets(names)
    size = sum(s.stop - s.start for s in offsets.values())
    v = torch.randn(size, generator=gen, dtype=dtype)
    tangents = {k: torch.zeros_like(params[k]) for k in keys}
    for n in names:
        k, view = leaves[n]
        view(tangents[k]).copy_(v[offsets[n]].reshape(view(tangents[k]).shape))
    times, out = [], None
    for _ in range(products):
        t0 = time.perf_counter()
        hvp = torch.autograd.grad(
            grads, [params[k] for k in keys], [tangents[k] for k in keys], retain_graph=True
        )
        times.append(time.perf_counter() - t0)
        by_key = dict(zip(keys, hvp))
        out = torch.cat([leaves[n][1](by_key[leaves[n][0]]).reshape(-1) for n in names])
    return {"load": loaded, "setup": built, "P": size}, times, v, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=("hessviz", "autograd"), required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--products", type=int, default=3)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument(
        "--check", default=None, help="a .pt file: hessviz writes (v, Hv) there, autograd compares"
    )
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load {os.getloadavg()}", flush=True)
    ids = token_ids(args.tokens)
    gen = torch.Generator().manual_seed(0)
    if args.side == "hessviz":
        info, times, v, out, _ = hessviz_side(ids, dtype, args.products, gen)
        if args.check:
            torch.save({"v": v, "out": out}, args.check)
    else:
        from hessviz.pretrained.load import _open

        cfg = _open("gemma3-270m").stack(len(ids))  # the names and offsets of θ, no weights read
        info, times, v, out = autograd_side(ids, dtype, args.products, gen, cfg.param_names, cfg)
        if args.check and os.path.exists(args.check):
            theirs = torch.load(args.check)
            assert torch.equal(theirs["v"], v), "the two sides drew different vectors"
            print(
                f"relative difference of the products: {float((out - theirs['out']).norm() / out.norm()):.2e}"
            )
    print(
        f"{args.side}: {len(ids)} tokens, {args.dtype}, P' = {info['P']:,}; load {info['load']:.1f} s, "
        f"set-up {info['setup']:.1f} s, products {', '.join(f'{t:.1f}' for t in times)} s "
        f"(median {statistics.median(times):.1f} s); peak {peak_mib():.0f} MiB; load {os.getloadavg()}",
        flush=True,
    )


if __name__ == "__main__":
    main()
