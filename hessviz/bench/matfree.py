"""Benchmarks of the matrix-free products at a real layer size (for ``hessviz bench``).

The layer is MiniLM-sized (all-MiniLM-L6-v2's shape): Post-LN, 12 heads of 32, ``d = 384``,
``d_ff = 1536``, ``W_O``, biases, LayerNorm γ/β, GELU, ``ε = 1e-12``, MSE, float64;
``P = 1,774,464``. Rows, each side by side with the strongest baseline we have:

* ``hvp``: ``res.matvec(v)`` against PyHessian's double backward over per-weight leaves
  (:class:`~hessviz.products.autograd.AutogradProducts`), and the largest relative
  difference ``max|Δ| / max|ref|`` between the two;
* ``ggn``: ``res.matvec(v, "outer")`` against ``curvlinops.GGNLinearOperator`` (when
  installed) and against the autograd JVP-then-VJP product;
* ``top5``: the 5 largest eigenvalues of the full Hessian by ``eigsh`` (products and seconds);
* ``slq``: the SLQ density, 10 probes × 80 Lanczos steps.

Timings alternate the methods round by round in one process (one warm-up each, then
``repeats`` rounds) and report the median and the minimum: on a shared machine the
minimum is the least disturbed. Peak memory is measured per method in a fresh process
(peak resident size ``VmHWM``, reset after building the inputs, minus the resident size
then; so the method's own
set-up, e.g. autograd's retained graph or the tape, counts); the spectral rows run
there once, timed and measured together. On a CUDA ``device`` the memory is the peak of
``torch.cuda.max_memory_allocated`` over what the inputs hold, measured in this process
(the allocator's counters need no fresh process), and CUDA is synchronised around each
timed call.

``rows(...)`` returns dicts; ``markdown(rows)`` renders them; ``python -m
benchmarks.matfree`` writes ``benchmarks/MATFREE.md``; ``hessviz bench --suite matfree``
adds the real-layer section of :mod:`hessviz.bench.matfree_spectra` (``python -m benchmarks.matfree_spectra``
alone rewrites just that section).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import hessviz as hv
from hessviz.bench.layers import MINILM


def minilm_case(seq_len: int, seed: int = 0, device: str = "cpu"):
    """``cfg, params, X, Y`` of the MiniLM-sized layer with ``L = seq_len`` (``‖X‖₂ = 4√L``)."""
    cfg = hv.BlockConfig(seq_len=seq_len, **MINILM)
    params = hv.init_params(cfg, seed=seed, device=device)
    X, Y = hv.sample_inputs(cfg, seed=seed, input_norm=4.0 * seq_len**0.5, device=device)
    return cfg, params, X, Y


SMOLLM = {
    "d_model": 576,
    "d_k": 64,
    "n_heads": 9,
    "n_kv_heads": 3,
    "d_ff": 1536,
    "out_proj": True,
    "norm": "pre",
    "norm_type": "rmsnorm",
    "ln_affine": True,
    "mlp": "gated",
    "activation": "silu",
    "rope": True,
    "causal": True,
    "ln_eps": 1e-5,
    "loss": "mse",
}
"""A SmolLM2-135M-sized layer (issue 18): Llama-style, d = 576, 9 query heads of 64 over 3 key/value
heads, SwiGLU with d_ff = 1536, RoPE, causal."""


def smollm_case(seq_len: int = 64, seed: int = 0, device: str = "cpu"):
    """``cfg, params, X, Y`` of the SmolLM2-sized layer (``‖X‖₂ = 4√L``)."""
    cfg = hv.BlockConfig(seq_len=seq_len, **SMOLLM)
    params = hv.init_params(cfg, seed=seed, device=device)
    X, Y = hv.sample_inputs(cfg, seed=seed, input_norm=4.0 * seq_len**0.5, device=device)
    return cfg, params, X, Y


def _per_call_hvp(cfg, params, X, Y):
    """``v ↦ H v`` by double backward with nothing kept between calls: each call runs the forward,
    the gradient with ``create_graph=True`` and one more backward."""
    from hessviz import reference

    names = cfg.param_names

    def hvp(parts: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        with torch.enable_grad():
            leaves = [params[n].detach().requires_grad_() for n in names]
            Z = reference.torch_forward(cfg, dict(zip(names, leaves)), X)
            grads = torch.autograd.grad(reference.torch_loss(cfg, Z, Y), leaves, create_graph=True)
            return torch.autograd.grad(grads, leaves, grad_outputs=parts)

    return hvp


def smollm_hvp_row(seq_len: int = 64, repeats: int = 7, device: str = "cpu") -> dict:
    """``res.matvec(v)`` of the SmolLM2-sized layer against double backward with the gradient's graph
    kept across products (PyHessian's way) and against double backward per call."""
    from hessviz.products.autograd import AutogradProducts

    cfg, params, X, Y = smollm_case(seq_len, device=device)
    v = torch.randn(cfg.num_params, generator=torch.Generator().manual_seed(1), dtype=X.dtype).to(X.device)
    res = hv.hessian(cfg, params, X, Y)
    kept = AutogradProducts(cfg, params, X, Y)
    sizes = [w.numel() for w in kept.leaves]
    parts = [t.reshape(w.shape) for t, w in zip(torch.split(v, sizes), kept.leaves)]
    per_call = _per_call_hvp(cfg, params, X, Y)
    flat = lambda gs: torch.cat([g.reshape(-1) for g in gs])  # noqa: E731
    fns = {
        "closed form": lambda: res.matvec(v),
        "double backward, graph kept (PyHessian)": lambda: flat(kept.hvp(parts)),
        "double backward per call": lambda: flat(per_call(parts)),
    }
    outs = {n: f() for n, f in fns.items()}
    ours = outs.pop("closed form")
    agree = {n: float((ours - o).abs().max() / o.abs().max()) for n, o in outs.items()}
    times = interleaved(fns, repeats)
    return {
        "row": "hvp",
        "layer": "SmolLM2-135M-sized",
        "L": seq_len,
        "P": cfg.num_params,
        "times": times,
        "agreement": agree,
    }


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict[str, float]]:
    """``name -> {median, min, cpu_median}`` seconds: one warm call each, then ``repeats``
    alternating rounds; ``cpu_median`` is this process's CPU time (``time.process_time``), which
    other processes on a shared machine inflate less than the wall clock."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {n: [] for n in fns}
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            _sync()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {
        n: {"median": statistics.median(t), "min": min(t), "cpu_median": statistics.median(cpu[n])}
        for n, t in times.items()
    }


def _curvlinops_ggn(cfg, params, X, Y):
    """``curvlinops.GGNLinearOperator`` of the same layer (``None`` when not installed)."""
    try:
        from curvlinops import GGNLinearOperator
    except ImportError:
        return None
    from hessviz import reference

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterDict(
                {n: torch.nn.Parameter(params[n].clone()) for n in cfg.param_names}
            )

        def forward(self, x):  # one sequence as a batch of one
            return reference.torch_forward(cfg, dict(self.weights), x[0])[None]

    layer = Layer()
    return GGNLinearOperator(
        layer,
        torch.nn.MSELoss(reduction="mean"),
        [layer.weights[n] for n in cfg.param_names],  # θ order, not sorted
        [(X[None], Y[None])],
        check_deterministic=False,
    )


def _methods(
    kind: str, cfg, params, X, Y, v: torch.Tensor, only: str | None = None
) -> dict[str, Callable[[], torch.Tensor]]:
    """The competing products of one row, each ``() -> (P,)``; ``only`` builds just that one."""
    from hessviz.products.autograd import AutogradProducts

    def wanted(name: str) -> bool:
        return only is None or only == name

    out: dict[str, Callable[[], torch.Tensor]] = {}
    term = "full" if kind == "hvp" else "outer"
    if wanted("closed form"):
        res = hv.hessian(cfg, params, X, Y)
        out["closed form"] = lambda: res.matvec(v, term)
    baseline = "autograd double backward" if kind == "hvp" else "autograd JVP + VJP"
    if wanted(baseline):
        ag = AutogradProducts(cfg, params, X, Y)
        sizes = [w.numel() for w in ag.leaves]
        parts = [t.reshape(w.shape) for t, w in zip(torch.split(v, sizes), ag.leaves)]
        product = ag.hvp if kind == "hvp" else ag.ggn_vp
        out[baseline] = lambda: torch.cat([g.reshape(-1) for g in product(parts)])
    if kind == "ggn" and wanted("curvlinops GGNLinearOperator"):
        ggn = _curvlinops_ggn(cfg, params, X, Y)
        if ggn is not None:
            out["curvlinops GGNLinearOperator"] = lambda: ggn @ v
    return out


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> float:
    """Reset the peak resident size to the current one (Linux ``clear_refs``); return it in MiB."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    return _status_mib("VmRSS")


def _rss_mib() -> float:
    """Peak resident size (MiB) since the last :func:`_reset_peak`."""
    return _status_mib("VmHWM")


def product_row(kind: str, seq_len: int, repeats: int, device: str = "cpu") -> dict:
    """``hvp`` or ``ggn`` at ``L = seq_len`` on ``device``: times, ratios and agreement."""
    cfg, params, X, Y = minilm_case(seq_len, device=device)
    v = torch.randn(cfg.num_params, generator=torch.Generator().manual_seed(1), dtype=X.dtype).to(X.device)
    fns = _methods(kind, cfg, params, X, Y, v)
    outs = {n: f() for n, f in fns.items()}
    ours = outs.pop("closed form")
    agree = {n: float((ours - o).abs().max() / o.abs().max()) for n, o in outs.items()}
    times = interleaved(fns, repeats)
    return {"row": kind, "L": seq_len, "P": cfg.num_params, "times": times, "agreement": agree}


def spectral_row(kind: str, seq_len: int, device: str = "cpu") -> dict:
    """``top5`` (eigsh) or ``slq`` (10 × 80) of the full Hessian at ``L = seq_len``."""
    from hessviz.matfree import spectral

    cfg, params, X, Y = minilm_case(seq_len, device=device)
    res = hv.hessian(cfg, params, X, Y)
    _sync()
    start = time.perf_counter()
    if kind == "top5":
        e = spectral.eigenpairs(res, "full", 5, "top", seed=0)
        extra = {"values": e.values[::-1].tolist(), "matvecs": e.matvecs}
    else:
        d = spectral.density(res, "full", probes=10, steps=80, seed=0)
        extra = {"matvecs": d.matvecs, "range": [float(d.all_nodes.min()), float(d.all_nodes.max())]}
    _sync()
    return {"row": kind, "L": seq_len, "P": cfg.num_params, "seconds": time.perf_counter() - start} | extra


def _child(spec: dict) -> dict:
    """Run one method (``spec``) a few times in this fresh process; report its peak memory."""
    torch.set_num_threads(spec["threads"])
    cfg, params, X, Y = minilm_case(spec["L"])
    if spec["row"] in ("top5", "slq"):
        base = _reset_peak()
        out = spectral_row(spec["row"], spec["L"])
        return out | {"memory": {"rss_setup_mib": base, "rss_peak_mib": _rss_mib()}}
    v = torch.randn(cfg.num_params, dtype=X.dtype)
    base = _reset_peak()  # the inputs only
    fn = _methods(spec["row"], cfg, params, X, Y, v, only=spec["method"])[spec["method"]]
    for _ in range(2):
        fn()
    return {"rss_setup_mib": base, "rss_peak_mib": _rss_mib()}


def cuda_peak_memory(kind: str, method: str, seq_len: int, device: str) -> dict:
    """Like :func:`_child` on a CUDA device, in this process: peak allocated MiB over the inputs'."""
    import gc

    cfg, params, X, Y = minilm_case(seq_len, device=device)
    v = torch.randn(cfg.num_params, dtype=X.dtype, device=device)
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device) / 2**20
    torch.cuda.reset_peak_memory_stats(device)
    if kind in ("top5", "slq"):
        out = spectral_row(kind, seq_len, device)
    else:
        fn = _methods(kind, cfg, params, X, Y, v, only=method)[method]
        for _ in range(2):
            fn()
        torch.cuda.synchronize(device)
        out = {}
    mem = {"rss_setup_mib": base, "rss_peak_mib": torch.cuda.max_memory_allocated(device) / 2**20}
    return out | {"memory": mem} if kind in ("top5", "slq") else mem


def peak_memory(spec: dict) -> dict:
    """``_child(spec)`` in a fresh interpreter."""
    code = (
        "import json, sys; from hessviz.bench.matfree import _child; "
        "print(json.dumps(_child(json.loads(sys.argv[1]))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def rows(
    seq_lens: tuple[int, ...] = (32, 128),
    repeats: int = 7,
    threads: int = 2,
    spectral_len: int = 128,
    memory: bool = True,
    progress: Callable[[str], None] = print,
    device: str = "cpu",
) -> list[dict]:
    """Every row (``hvp``, ``ggn`` at each ``L``; ``top5``, ``slq`` at ``spectral_len``, unless 0)
    with the parameters and inputs on ``device`` (``"cpu"`` or ``"cuda"``)."""
    torch.set_num_threads(threads)
    cuda = torch.device(device).type == "cuda"

    def memory_of(kind: str, method: str | None, L: int) -> dict:
        if cuda:
            return cuda_peak_memory(kind, method or "", L, device)
        return peak_memory({"row": kind, "method": method, "L": L, "threads": threads})

    out = []
    for L in seq_lens:
        for kind in ("hvp", "ggn"):
            progress(f"{kind} L={L}")
            row = product_row(kind, L, repeats, device)
            if memory:
                row["memory"] = {m: memory_of(kind, m, L) for m in row["times"]}
            out.append(row)
    for kind in ("top5", "slq") if spectral_len else ():
        progress(f"{kind} L={spectral_len}")
        out.append(
            memory_of(kind, None, spectral_len) if memory else spectral_row(kind, spectral_len, device)
        )
    return out


def markdown(result: list[dict]) -> str:
    """The rows as Markdown tables (times in ms, ratio = baseline median / closed-form median)."""
    lines = [
        "| product | L | P | method | median ms | min ms | ratio (median) | peak MiB over setup | "
        "max rel. diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result:
        if r["row"] not in ("hvp", "ggn"):
            continue
        ours = r["times"]["closed form"]["median"]
        for m, t in r["times"].items():
            mem = r.get("memory", {}).get(m)
            extra = "" if mem is None else f"{mem['rss_peak_mib'] - mem['rss_setup_mib']:.0f}"
            diff = r["agreement"].get(m)
            name = "HVP (full)" if r["row"] == "hvp" else "GGN (outer)"
            lines.append(
                f"| {name} | {r['L']} | {r['P']:,} | "
                f"{m} | {t['median'] * 1e3:.1f} | {t['min'] * 1e3:.1f} | "
                f"{t['median'] / ours:.2f}× | {extra} | {'' if diff is None else f'{diff:.1e}'} |"
            )
    lines += [
        "",
        "| spectral tool | L | P | products | seconds | peak MiB over setup | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result:
        if r["row"] in ("top5", "slq"):
            mem = r.get("memory")
            extra = "" if mem is None else f"{mem['rss_peak_mib'] - mem['rss_setup_mib']:.0f}"
            what = "top-5 eigenvalues (eigsh)" if r["row"] == "top5" else "SLQ density, 10 probes × 80 steps"
            res = (
                ", ".join(f"{x:.4g}" for x in r["values"])
                if r["row"] == "top5"
                else f"support [{r['range'][0]:.3g}, {r['range'][1]:.3g}]"
            )
            lines.append(
                f"| {what} | {r['L']} | {r['P']:,} | {r['matvecs']} | {r['seconds']:.1f} | {extra} | {res} |"
            )
    return "\n".join(lines) + "\n"


def machine(device: str = "cpu") -> str:
    """Where the rows ran: the CPU threads and load average, or the CUDA device's name."""
    if torch.device(device).type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    n = torch.get_num_threads()
    return (
        f"{n} thread{'s' if n != 1 else ''}, torch {torch.__version__}, "
        f"load average {load} at the end (1, 5, 15 min)"
    )


def main(out: Path = Path("benchmarks/MATFREE.md"), **kw) -> list[dict]:
    result = rows(**kw)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Matrix-free products, MiniLM-sized layer (float64, {machine(kw.get('device', 'cpu'))})\n\n"
    out.write_text(header + markdown(result))
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/MATFREE.md")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[32, 128])
    p.add_argument("--spectral-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the parameters and inputs live")
    a = p.parse_args()
    main(
        Path(a.out),
        seq_lens=tuple(a.seq_lens),
        repeats=a.repeats,
        threads=a.threads,
        spectral_len=a.spectral_len,
        memory=not a.no_memory,
        device=a.device,
    )
