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
* the model Jacobian :func:`hessviz.jacobian` against ``torch.func.jacrev``.
"""

from __future__ import annotations

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
from hessviz import memory, reference
from hessviz.components import activation, layernorm
from hessviz.components.ffn import FeedForward
from hessviz.verify import relative_error

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
    cfg = hv.BlockConfig(seq_len=L, d_model=D_MODEL, d_k=D_K, d_ff=D_FF, norm="post",
                         activation="relu", loss="mse")
    params = hv.init_params(cfg, seed=0, device=device)
    X, Y = hv.sample_inputs(cfg, seed=0, input_norm=float(L) ** 0.5, device=device)
    names = cfg.param_names
    # the closed form is cheap: two warm-ups (the first call pays for fresh huge pages) and
    # at least 7 timed runs; the cold first call is reported too
    closed = run_times(lambda: hv.hessian(cfg, params, X, Y).full, 2 + max(repeats, 7), device)
    ours, cold = statistics.median(closed[2:]), closed[0]
    func = median_time(lambda: reference.full_hessian(cfg, params, X, Y, names), repeats, device)
    baselines = {"torch.func.hessian": func}
    if with_functional_api:
        theta = reference.flatten(cfg, params, names)
        loss_of = reference.loss_of_theta(cfg, params, X, Y, names)
        baselines["autograd.functional.hessian(vectorize=True)"] = median_time(
            lambda: torch.autograd.functional.hessian(loss_of, theta, vectorize=True), repeats, device)
    P = cfg.num_params
    floor = median_time(lambda: torch.empty(P, P, dtype=torch.float64, device=device).fill_(1.0),
                        max(repeats, 7), device, warmup=2)
    floor_ours = median_time(lambda: memory.empty(P, P, dtype=torch.float64, device=device).fill_(1.0),
                             max(repeats, 7), device, warmup=2)
    error = relative_error(hv.hessian(cfg, params, X, Y).full,
                           reference.full_hessian(cfg, params, X, Y, names))
    return Row(f"full-block Hessian, L = {L}, P = {P}", ours, baselines, error,
               extra=f"memory floor, fill a new {P}×{P} float64 array: {_fmt(floor)} with torch.empty "
                     f"(closed form / floor = **{ours / floor:.1f}×**), {_fmt(floor_ours)} with the "
                     f"huge-page allocation hessviz uses (closed form / floor = {ours / floor_ours:.1f}×); "
                     f"the closed form's cold first call: {_fmt(cold)}")


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
            lambda: torch.autograd.functional.jacobian(ln, X), repeats, device),
        "torch.func.jacrev": median_time(lambda: torch.func.jacrev(ln)(X), repeats, device),
    }
    ours = median_time(closed, max(repeats, 20), device)
    error = relative_error(closed(), torch.func.jacrev(ln)(X))
    return Row(f"LayerNorm Jacobian ∂LN(X)/∂X, L = {L}, d = {d} (dense {L * d}×{L * d})",
               ours, base, error)


def ffn_jacobian(L: int, d: int, d_ff: int, repeats: int, device: torch.device) -> list[Row]:
    gen = torch.Generator().manual_seed(0)
    Z = torch.randn(L, d, dtype=torch.float64, generator=gen).to(device)
    W1 = (torch.randn(d, d_ff, dtype=torch.float64, generator=gen) / d**0.5).to(device)
    W2 = (torch.randn(d_ff, d, dtype=torch.float64, generator=gen) / d_ff**0.5).to(device)

    def factored():
        return FeedForward(Z, W1, W2, activation.RELU).jacobian

    def dense() -> torch.Tensor:
        J = factored()
        return torch.cat([J["W_1"].dense().reshape(L * d, -1), J["W_2"].dense().reshape(L * d, -1)], 1)

    def ffn(w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return torch.relu(Z @ w1) @ w2

    def reference_dense() -> torch.Tensor:
        j1, j2 = torch.func.jacrev(ffn, argnums=(0, 1))(W1, W2)
        return torch.cat([j1.reshape(L * d, -1), j2.reshape(L * d, -1)], 1)

    base = {
        "autograd.functional.jacobian": median_time(
            lambda: torch.autograd.functional.jacobian(ffn, (W1, W2)), repeats, device),
        "torch.func.jacrev": median_time(reference_dense, repeats, device),
    }
    error = relative_error(dense(), reference_dense())
    size = f"{L * d}×{2 * d * d_ff}"
    return [
        Row(f"FFN Jacobian ∂FFN/∂(W_1, W_2), L = {L}, d = {d}, d_ff = {d_ff}: Kronecker-factored",
            median_time(factored, max(repeats, 20), device), base, error,
            extra="the exact Jacobian as per-token Kronecker factors (y_t ⊗ W_2ᵀdiag φ', a_t ⊗ I)"),
        Row(f"FFN Jacobian, same, written out dense ({size})",
            median_time(dense, max(repeats, 20), device), base, error),
    ]


def model_jacobian(L: int, repeats: int, device: torch.device) -> Row:
    cfg = hv.BlockConfig(seq_len=L, d_model=D_MODEL, d_k=D_K, d_ff=D_FF, norm="post")
    params = hv.init_params(cfg, seed=0, device=device)
    X, _ = hv.sample_inputs(cfg, seed=0, input_norm=float(L) ** 0.5, device=device)
    names = cfg.param_names
    ours = median_time(lambda: hv.jacobian(cfg, params, X), repeats, device)
    base = {"torch.func.jacrev": median_time(
        lambda: reference.model_jacobian(cfg, params, X, names), repeats, device)}
    error = relative_error(hv.jacobian(cfg, params, X), reference.model_jacobian(cfg, params, X, names))
    return Row(f"model Jacobian ∂Z/∂θ, L = {L}, ({L * D_MODEL}×{cfg.num_params})", ours, base, error)


def render(rows: list[Row], header: str) -> str:
    lines = [header, "", "| case | closed form | baseline | baseline time | speed-up | rel. error |",
             "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        for i, (name, t) in enumerate(r.baselines.items()):
            first = i == 0
            lines.append(
                f"| {r.case if first else ''} | {_fmt(r.ours) if first else ''} | {name} | {_fmt(t)} | "
                f"**{t / r.ours:.0f}×** | {f'{r.error:.1e}' if first else ''} |")
    notes = [f"- {r.case}: {r.extra}" for r in rows if r.extra]
    return "\n".join(lines + ([""] + notes if notes else []))


def main(out: Path, seq_lens: tuple[int, ...] = (16, 32, 64), repeats: int = 3,
         threads: int = 2) -> str:
    torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()
    rows: list[Row] = []
    for L in seq_lens:
        rows.append(full_block(L, repeats, device, with_functional_api=(L == min(seq_lens))))
        print(render(rows[-1:], ""), flush=True)
    component_rows = [layernorm_jacobian(16, 32, repeats, device),
                      *ffn_jacobian(16, 32, 64, repeats, device),
                      model_jacobian(max(seq_lens), repeats, device)]
    print(render(component_rows, ""), flush=True)
    cpu = platform.processor() or platform.machine()
    machine = (f"{torch.cuda.get_device_name(device)}" if device.type == "cuda"
               else f"{cpu}, {os.cpu_count()} cores, {threads} torch threads")
    text = "\n".join([
        "# hessviz benchmarks",
        "",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}",
        f"- machine: {platform.system()} {platform.release()}, {machine}; torch {torch.__version__}",
        f"- command: `hessviz bench --seq-lens {' '.join(map(str, seq_lens))} --repeats {repeats} "
        f"--threads {threads}`",
        f"- float64; baselines: median of {repeats} warm runs after one warm-up; closed form and "
        f"floors: median of {max(repeats, 7)} after two warm-ups (components: at least 20); "
        "every row also checks the closed form against the baseline (rel. error).",
        f"- total time {time.perf_counter() - started:.0f} s",
        "",
        render(rows, "## Full-block Hessian (post-LN, ReLU, MSE, d = 32, d_k = 16, d_ff = 64)"),
        "",
        render(component_rows, "## Components and the model Jacobian"),
        "",
    ])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return text
