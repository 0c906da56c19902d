"""Side-by-side timings of the closed form against autograd: ``hessviz bench``.

Every case runs both methods in the same process, in float64 on ``threads`` CPU threads
(or the CUDA device when there is one), one warm-up then ``repeats`` timed runs, and
reports medians and their ratio. The closed form's result is also checked against the
reference it was timed against, so a fast wrong answer cannot hide here.

Cases
-----
* the full-block Hessian (``W_Q … W_2``, ``P = 6144``) at several ``L`` against
  ``torch.func.hessian`` (and ``torch.autograd.functional.hessian(vectorize=True)`` at
  the smallest ``L``), and against the memory floor: allocating and filling a
  ``(P, P)`` float64 array;
* the LayerNorm Jacobian ``∂LN(X)/∂X`` and the FFN Jacobian ``∂FFN(Z)/∂(W_1, W_2)``
  against ``torch.autograd.functional.jacobian`` (the papers' baseline) and
  ``torch.func.jacrev``;
* the model Jacobian :func:`hessviz.jacobian` against ``torch.func.jacrev``;
* the full Hessian of a real layer (Post-LN, 4 heads, ``W_O``, biases, γ/β, GELU, ``P = 8544``)
  against ``torch.func.hessian`` and the memory floor;
* the full Hessian of a Llama-style layer (Pre-RMSNorm with γ, SwiGLU, RoPE, 4 query heads over 2
  key/value heads, causal; ``L = 64, d = 32, d_k = 8, d_ff = 64``) against reverse-over-reverse
  autograd (``jacrev`` of ``grad``) and the memory floor;
* the full Hessian of a 2-layer and a 4-layer Pre-LN stack (``L = 16, d = 16, d_k = 8,
  d_ff = 32``, ``P = 3072`` and ``6144``, every block within and across layers) against
  ``torch.func.hessian`` and the memory floor (:mod:`hessviz.dense.stack`);
* one head's slice ``W_Q[3]``–``W_Q[3]`` of a MiniLM-sized layer (``12288 × 12288``) in float32
  and float64: time and peak memory (in a fresh process), checked on sampled rows against
  autograd Hessian-vector products, and ``torch.func.hessian`` of the slice where it fits.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import hessviz as hv
from hessviz import reference
from hessviz.bench import layers
from hessviz.bench.layers import REAL_LAYER
from hessviz.checks.verify import relative_error
from hessviz.ops import layernorm
from hessviz.ops.ffn import FeedForward
from hessviz.ops.relu import ReLU
from hessviz.runtime import memory, pages

D_MODEL, D_K, D_FF = 32, 16, 64


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_times(fn: Callable[[], object], runs: int, device: torch.device) -> list[float]:
    """Wall times of ``runs`` consecutive calls (the first one cold)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def median_time(fn: Callable[[], object], repeats: int, device: torch.device, warmup: int = 1) -> float:
    """Median wall time of ``repeats`` runs after ``warmup`` runs."""
    return statistics.median(run_times(fn, warmup + repeats, device)[warmup:])


@dataclass
class Row:
    case: str
    ours: float
    baselines: dict[str, float]
    error: float
    extra: str = ""


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def full_block(L: int, repeats: int, device: torch.device, with_functional_api: bool) -> Row:
    cfg = hv.BlockConfig(
        seq_len=L, d_model=D_MODEL, d_k=D_K, d_ff=D_FF, norm="post", activation="relu", loss="mse"
    )
    return hessian_row(
        cfg, f"full-block Hessian, L = {L}, P = {cfg.num_params}", repeats, device, with_functional_api
    )


def _layer_row(cfg: hv.BlockConfig, case: str, repeats: int, device: torch.device, **options) -> Row:
    """:func:`hessian_row` of ``cfg`` without the functional-API baseline, ``P`` named after ``case``;
    ``options`` go on to :func:`hessian_row`."""
    return hessian_row(
        cfg, f"{case}, P = {cfg.num_params}", repeats, device, with_functional_api=False, **options
    )


def real_layer(repeats: int, device: torch.device) -> Row:
    return _layer_row(
        REAL_LAYER, f"full-block Hessian of a real layer ({REAL_LAYER.describe()})", repeats, device
    )


STACK = hv.BlockConfig(seq_len=16, d_model=16, d_k=8, d_ff=32, norm="pre", activation="relu", loss="mse")
"""The issue's stack case (issue 11): Pre-LN blocks, L = 16, d = 16, d_k = 8, d_ff = 32."""


def stack(n_layers: int, repeats: int, device: torch.device) -> Row:
    cfg = dataclasses.replace(STACK, n_layers=n_layers)
    return _layer_row(cfg, f"full Hessian of a {n_layers}-layer Pre-LN stack", repeats, device)


LLAMA_LAYER = hv.BlockConfig(
    seq_len=64,
    d_model=32,
    d_k=8,
    d_ff=64,
    n_heads=4,
    n_kv_heads=2,
    out_proj=True,
    norm="pre",
    norm_type="rmsnorm",
    ln_affine=True,
    mlp="gated",
    activation="silu",
    rope=True,
    causal=True,
    loss="mse",
    ln_eps=1e-6,
)
"""Issue 18's Llama-style case: Pre-RMSNorm with γ, SwiGLU, RoPE, 4 query heads over 2 key/value
heads, causal; L = 64, d = 32, d_k = 8, d_ff = 64."""


def llama_layer(repeats: int, device: torch.device) -> Row:
    return _layer_row(
        LLAMA_LAYER,
        f"full Hessian of a Llama-style layer ({LLAMA_LAYER.describe()})",
        repeats,
        device,
        reverse_over_reverse=True,
        closed_repeats=max(repeats, 2),
        baseline_warmup=0,
    )


def hessian_row(
    cfg: hv.BlockConfig,
    case: str,
    repeats: int,
    device: torch.device,
    with_functional_api: bool,
    reverse_over_reverse: bool = False,
    closed_repeats: int = 7,
    baseline_warmup: int = 1,
) -> Row:
    """The whole Hessian of ``cfg`` (every weight) against ``torch.func.hessian`` (or, with
    ``reverse_over_reverse``, ``jacrev`` of ``grad``), and the memory floor. A slow case may time
    fewer closed-form runs (``closed_repeats``, after two warm-ups) and no baseline warm-up."""
    L = cfg.seq_len
    params = hv.init_params(cfg, seed=0, device=device)
    X, Y = hv.sample_inputs(cfg, seed=0, input_norm=float(L) ** 0.5, device=device)
    names = cfg.param_names
    # the closed form is cheap: two warm-ups (the first call pays for fresh huge pages) and
    # at least 7 timed runs; the cold first call is reported too
    last: dict[str, torch.Tensor] = {}  # the last result of each, for the error below
    closed = run_times(
        lambda: last.__setitem__("ours", hv.hessian(cfg, params, X, Y).full), 2 + closed_repeats, device
    )
    ours, cold = statistics.median(closed[2:]), closed[0]
    baseline, label = (
        (reference.full_hessian_rr, "torch.func.jacrev(grad)")
        if reverse_over_reverse
        else (reference.full_hessian, "torch.func.hessian")
    )
    func = median_time(
        lambda: last.__setitem__("reference", baseline(cfg, params, X, Y, names)),
        repeats,
        device,
        warmup=baseline_warmup,
    )
    baselines = {label: func}
    if with_functional_api:
        theta = reference.flatten(cfg, params, names)
        loss_of = reference.loss_of_theta(cfg, params, X, Y, names)
        baselines["autograd.functional.hessian(vectorize=True)"] = median_time(
            lambda: torch.autograd.functional.hessian(loss_of, theta, vectorize=True), repeats, device
        )
    P = cfg.num_params
    floor = median_time(
        lambda: torch.empty(P, P, dtype=torch.float64, device=device).fill_(1.0),
        max(repeats, 7),
        device,
        warmup=2,
    )
    floor_ours = median_time(
        lambda: pages.empty((P, P), torch.empty(0, dtype=torch.float64, device=device)).fill_(1.0),
        max(repeats, 7),
        device,
        warmup=2,
    )
    error = relative_error(last.pop("ours"), last.pop("reference"))
    return Row(
        case,
        ours,
        baselines,
        error,
        extra=f"memory floor, fill a new {P}×{P} float64 array: {_fmt(floor)} with torch.empty "
        f"(closed form / floor = **{ours / floor:.1f}×**), {_fmt(floor_ours)} with the "
        f"huge-page allocation hessviz uses (closed form / floor = {ours / floor_ours:.1f}×); "
        f"the closed form's cold first call: {_fmt(cold)}",
    )


MINILM = hv.BlockConfig(seq_len=128, **layers.MINILM)
"""A MiniLM-sized layer (all-MiniLM-L6-v2's shape): d = 384, 12 heads of 32, d_ff = 1536."""
SLICE = "W_Q[3]"


def _resident_bytes(peak: bool = False, reset_peak: bool = False) -> int:
    """This process's resident memory now (``VmRSS``) or its peak (``VmHWM``), from ``/proc``;
    ``reset_peak`` first sets the peak to the current size (``clear_refs``). Unlike
    ``ru_maxrss``, which survives ``execve`` and so starts at the parent's peak."""
    if reset_peak:
        Path("/proc/self/clear_refs").write_text("5")
    key = "VmHWM:" if peak else "VmRSS:"
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise OSError(f"{key} not in /proc/self/status")


def _slice_child(dtype_name: str, device_name: str, threads: int) -> None:
    """In a fresh process: time the dense ``W_Q[h]``–``W_Q[h]`` block and print JSON with the time,
    the peak memory above the inputs, and its error on sampled rows against autograd
    Hessian-vector products (and the full autograd slice Hessian where it fits)."""
    import json

    torch.set_num_threads(threads)
    dtype, device = getattr(torch, dtype_name), torch.device(device_name)
    cfg = MINILM
    params = hv.init_params(cfg, seed=0, dtype=dtype, device=device)
    X, Y = hv.sample_inputs(cfg, seed=0, input_norm=float(cfg.seq_len) ** 0.5, dtype=dtype, device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = _resident_bytes(reset_peak=True)
    start = time.perf_counter()
    B = hv.hessian(cfg, params, X, Y, wrt=(SLICE,)).block(SLICE, SLICE)
    _sync(device)
    seconds = time.perf_counter() - start
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = _resident_bytes(peak=True) - base
    # autograd: 8 sampled rows of the slice's Hessian, reverse over reverse, in float64
    p64 = {n: w.double() for n, w in params.items()}
    Y64 = Y.double() if Y.is_floating_point() else Y
    loss_of = reference.loss_of_theta(cfg, p64, X.double(), Y64, (SLICE,))
    theta = reference.flatten(cfg, p64, (SLICE,)).requires_grad_(True)
    (grad,) = torch.autograd.grad(loss_of(theta), theta, create_graph=True)
    rows = torch.randperm(theta.numel(), generator=torch.Generator().manual_seed(0))[:8].tolist()
    sampled = torch.stack([torch.autograd.grad(grad[i], theta, retain_graph=True)[0] for i in rows])
    error = relative_error(B[rows].double(), sampled)
    out = {"seconds": seconds, "peak": peak, "error": error, "P": theta.numel()}
    needed = hv.api.hessian_bytes(cfg, (SLICE,), torch.empty((), dtype=dtype).element_size(), "autograd")
    limit = memory.memory_limit(device)
    if needed <= limit:
        theta_d = reference.flatten(cfg, params, (SLICE,))
        f = reference.loss_of_theta(cfg, params, X, Y, (SLICE,))
        start = time.perf_counter()
        torch.func.hessian(f)(theta_d)
        _sync(device)
        out["autograd"] = time.perf_counter() - start
    else:
        out["autograd_needs"], out["limit"] = needed, limit
    print(json.dumps(out))


def head_slice(dtype: torch.dtype, device: torch.device, threads: int) -> Row:
    """The MiniLM-sized ``W_Q[h]``–``W_Q[h]`` block, measured in a fresh process (peak memory)."""
    import json
    import subprocess
    import sys

    name = str(dtype).removeprefix("torch.")
    code = f"from hessviz.bench.dense import _slice_child; _slice_child({name!r}, {str(device)!r}, {threads})"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    r = json.loads(done.stdout.strip().splitlines()[-1])
    P = r["P"]
    if "autograd" in r:
        baselines, note = {f"torch.func.hessian of the slice ({name})": r["autograd"]}, ""
    else:
        baselines = {}
        note = (
            f"; torch.func.hessian of the slice does not fit: hessviz's estimate "
            f"{memory.format_bytes(r['autograd_needs'])} > limit {memory.format_bytes(r['limit'])}"
        )
    return Row(
        f"head slice {SLICE}–{SLICE} of a MiniLM-sized layer ({MINILM.describe()}), dense {P}×{P}, {name}",
        r["seconds"],
        baselines,
        r["error"],
        extra=f"peak memory above the inputs {memory.format_bytes(r['peak'])} (the block itself: "
        f"{memory.format_bytes(P * P * torch.empty((), dtype=dtype).element_size())}); "
        f"rel. error on 8 sampled rows against autograd Hessian-vector products in float64" + note,
    )


def layernorm_jacobian(L: int, d: int, repeats: int, device: torch.device) -> Row:
    X = torch.randn(L, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)

    def closed() -> torch.Tensor:
        _, st = layernorm.value(X, 0.0)
        dense = torch.zeros(L, d, L, d, dtype=X.dtype, device=device)
        dense.diagonal(dim1=0, dim2=2).copy_(layernorm.jacobian(st).permute(1, 2, 0))
        return dense

    def ln(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (d,), eps=0.0)

    base = {
        "autograd.functional.jacobian": median_time(
            lambda: torch.autograd.functional.jacobian(ln, X), repeats, device
        ),
        "torch.func.jacrev": median_time(lambda: torch.func.jacrev(ln)(X), repeats, device),
    }
    ours = median_time(closed, max(repeats, 20), device)
    error = relative_error(closed(), torch.func.jacrev(ln)(X))
    return Row(f"LayerNorm Jacobian ∂LN(X)/∂X, L = {L}, d = {d} (dense {L * d}×{L * d})", ours, base, error)


def ffn_jacobian(L: int, d: int, d_ff: int, repeats: int, device: torch.device) -> list[Row]:
    gen = torch.Generator().manual_seed(0)
    Z = torch.randn(L, d, dtype=torch.float64, generator=gen).to(device)
    W1 = (torch.randn(d, d_ff, dtype=torch.float64, generator=gen) / d**0.5).to(device)
    W2 = (torch.randn(d_ff, d, dtype=torch.float64, generator=gen) / d_ff**0.5).to(device)

    def factored():
        return FeedForward(Z, W1, W2, ReLU).jacobian

    def dense() -> torch.Tensor:
        J = factored()
        return torch.cat(
            [
                J[("ffn", "fc1.weight", None)].dense().reshape(L * d, -1),
                J[("ffn", "fc2.weight", None)].dense().reshape(L * d, -1),
            ],
            1,
        )

    def ffn(w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return torch.relu(Z @ w1) @ w2

    def reference_dense() -> torch.Tensor:
        j1, j2 = torch.func.jacrev(ffn, argnums=(0, 1))(W1, W2)
        return torch.cat([j1.reshape(L * d, -1), j2.reshape(L * d, -1)], 1)

    base = {
        "autograd.functional.jacobian": median_time(
            lambda: torch.autograd.functional.jacobian(ffn, (W1, W2)), repeats, device
        ),
        "torch.func.jacrev": median_time(reference_dense, repeats, device),
    }
    error = relative_error(dense(), reference_dense())
    size = f"{L * d}×{2 * d * d_ff}"
    return [
        Row(
            f"FFN Jacobian ∂FFN/∂(W_1, W_2), L = {L}, d = {d}, d_ff = {d_ff}: Kronecker-factored",
            median_time(factored, max(repeats, 20), device),
            base,
            error,
            extra="the exact Jacobian as per-token Kronecker factors (y_t ⊗ W_2ᵀdiag φ', a_t ⊗ I)",
        ),
        Row(
            f"FFN Jacobian, same, written out dense ({size})",
            median_time(dense, max(repeats, 20), device),
            base,
            error,
        ),
    ]


def model_jacobian(L: int, repeats: int, device: torch.device) -> Row:
    cfg = hv.BlockConfig(seq_len=L, d_model=D_MODEL, d_k=D_K, d_ff=D_FF, norm="post")
    params = hv.init_params(cfg, seed=0, device=device)
    X, _ = hv.sample_inputs(cfg, seed=0, input_norm=float(L) ** 0.5, device=device)
    names = cfg.param_names
    ours = median_time(lambda: hv.jacobian(cfg, params, X), repeats, device)
    base = {
        "torch.func.jacrev": median_time(
            lambda: reference.model_jacobian(cfg, params, X, names), repeats, device
        )
    }
    error = relative_error(hv.jacobian(cfg, params, X), reference.model_jacobian(cfg, params, X, names))
    return Row(f"model Jacobian ∂Z/∂θ, L = {L}, ({L * D_MODEL}×{cfg.num_params})", ours, base, error)


def render(rows: list[Row], header: str) -> str:
    lines = [
        header,
        "",
        "| case | closed form | baseline | baseline time | speed-up | rel. error |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        if not r.baselines:
            lines.append(f"| {r.case} | {_fmt(r.ours)} | (none that fits) | | | {r.error:.1e} |")
        for i, (name, t) in enumerate(r.baselines.items()):
            first = i == 0
            ratio = t / r.ours
            speedup = f"{ratio:.0f}" if ratio >= 10 else f"{ratio:.2g}"
            error = f"{r.error:.1e}" if first and r.error == r.error else ""  # nan: nothing compared
            lines.append(
                f"| {r.case if first else ''} | {_fmt(r.ours) if first else ''} | {name} | {_fmt(t)} | "
                f"**{speedup}×** | {error} |"
            )
    notes = [f"- {r.case}: {r.extra}" for r in rows if r.extra]
    return "\n".join(lines + ([""] + notes if notes else []))


def main(out: Path, seq_lens: tuple[int, ...] = (16, 32, 64), repeats: int = 3, threads: int = 2) -> str:
    torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started, load = time.perf_counter(), os.getloadavg()
    rows: list[Row] = []
    for L in seq_lens:
        rows.append(full_block(L, repeats, device, with_functional_api=(L == min(seq_lens))))
        print(render(rows[-1:], ""), flush=True)
    real_rows = [real_layer(repeats, device), llama_layer(repeats, device)]
    print(render(real_rows, ""), flush=True)
    stack_rows = [stack(n, repeats, device) for n in (2, 4)]
    print(render(stack_rows, ""), flush=True)
    slice_rows = [head_slice(dtype, device, threads) for dtype in (torch.float32, torch.float64)]
    print(render(slice_rows, ""), flush=True)
    component_rows = [
        layernorm_jacobian(16, 32, repeats, device),
        *ffn_jacobian(16, 32, 64, repeats, device),
        model_jacobian(max(seq_lens), repeats, device),
    ]
    print(render(component_rows, ""), flush=True)
    cpu = platform.processor() or platform.machine()
    machine = (
        f"{torch.cuda.get_device_name(device)}"
        if device.type == "cuda"
        else f"{cpu}, {os.cpu_count()} cores, {threads} torch threads"
    )
    text = "\n".join(
        [
            "# hessviz benchmarks",
            "",
            f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}",
            f"- machine: {platform.system()} {platform.release()}, {machine}; torch {torch.__version__}",
            f"- command: `hessviz bench --seq-lens {' '.join(map(str, seq_lens))} --repeats {repeats} "
            f"--threads {threads}`",
            f"- float64; baselines: median of {repeats} warm runs after one warm-up; closed form and "
            f"floors: median of {max(repeats, 7)} after two warm-ups (components: at least 20); "
            "every row also checks the closed form against the baseline (rel. error).",
            f"- load average when it started (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in load)}",
            f"- total time {time.perf_counter() - started:.0f} s",
            "",
            render(rows, "## Full-block Hessian (post-LN, ReLU, MSE, d = 32, d_k = 16, d_ff = 64)"),
            "",
            render(real_rows, "## Full-block Hessian of a real layer"),
            "",
            render(
                stack_rows,
                "## Full Hessian of a stack of blocks (Pre-LN, ReLU, MSE, L = 16, d = 16, "
                "d_k = 8, d_ff = 32; every block within and across layers)",
            ),
            "",
            render(slice_rows, "## One head's slice of a MiniLM-sized layer"),
            "",
            render(component_rows, "## Components and the model Jacobian"),
            "",
        ]
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return text
