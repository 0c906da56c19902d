"""Where a product and a top-5 spend their time on a GPU, and what a CUDA graph of the product would
save: a diagnostic for the device machine (issue 20), not a bench row.

    HESSVIZ_SPEED_CASES=.cases/minilm.pt PYTHONPATH=. python scripts/gpu_probe.py [L]

Prints the kernel launches and host time of one closed-form product and of kept-graph double
backward (torch.profiler, CUDA activity), the top operators of one top-5 (value bound), and the
replay time of the product captured as a CUDA graph, checked against the eager product.
"""

import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import hessviz as hv
from hessviz.bench import peers
from hessviz.bench.matfree_spectra import real_case
from hessviz.matfree import spectral

L = int(sys.argv[1]) if len(sys.argv) > 1 else 24
cfg, params, X, Y = real_case(L, "cuda")
res = hv.hessian(cfg, params, X, Y)
kept = peers.Counted(cfg, params, X, Y)
v = torch.randn(res.size, generator=torch.Generator().manual_seed(0), dtype=torch.float64).cuda()
for _ in range(3):
    res.matvec(v), kept(v)
torch.cuda.synchronize()


def launches(fn, n=5):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return kernels / n, gpu_us / n / 1e3, events


def median_ms(fn, n=30):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


products = {"closed form": lambda: res.matvec(v), "double backward, graph kept": lambda: kept(v)}
for name, fn in products.items():
    k, gpu_ms, events = launches(fn)
    print(f"{name}: {median_ms(fn):.2f} ms wall, {k:.0f} kernels, {gpu_ms:.2f} ms of GPU time per product")
    if name == "closed form":
        print(events.table(sort_by="self_cpu_time_total", row_limit=15))

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    e = spectral.eigenpairs(res, "full", 5, "top", solver="torch", bound="value", tol=1e-8)
    torch.cuda.synchronize()
print(f"top-5, value bound: {e.matvecs} products")
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))

try:  # the product as one CUDA graph
    static_v = v.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            res.matvec(static_v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = res.matvec(static_v)
    w = torch.randn_like(v)
    static_v.copy_(w)
    graph.replay()
    eager = res.matvec(w)
    rel = float((static_out - eager).abs().max() / eager.abs().max())
    print(
        f"CUDA graph of the product: replay {median_ms(graph.replay):.3f} ms against eager "
        f"{median_ms(lambda: res.matvec(static_v)):.2f} ms; replay vs eager max rel. diff {rel:.1e}"
    )
except Exception as err:  # a diagnostic: say what failed
    print(f"CUDA graph of the product failed: {type(err).__name__}: {err}")
