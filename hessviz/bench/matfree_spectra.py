"""Spectra at the speed of the products: the bench rows of issue 20 (``hessviz bench --suite matfree``).

On a **real** MiniLM layer (all-MiniLM-L6-v2's layer 3, its weights, a real English text cut to
``L`` tokens, MSE against the app's seeded target; float64, 1.77 M weights), side by side in one
process:

* ``top5``: the 5 largest eigenvalues by the torch core (:func:`hessviz.matfree.eigenpairs`),
  by scipy ``eigsh`` on the same closed-form products, and by the peers of
  :mod:`hessviz.bench.peers` (scipy ``eigsh`` / hessian-eigenthings' Lanczos / PyHessian on
  kept-graph double backward). Each: seconds, products, the largest relative difference from a
  tight reference (the torch core at ``tol = 1e-11``, its true residuals shown) and the peak
  resident memory over the set-up;
* ``product``: one closed-form product against double backward with the gradient's graph kept
  and against double backward per call (the graph built anew), interleaved medians;
* ``batch``: ``k = 8`` products at once (``V (P, 8)``, C- and F-contiguous) against one;
* ``float32``: float32 products and top-5 against float64 (accuracy and time);
* ``hutchinson``: 30 probes side by side against a loop of products (PyHessian's way);
* ``slq``: the SLQ density, 10 probes × 80 steps, without and with a kept basis.

Every row takes ``device`` (``"cpu"`` or ``"cuda"``): the layer, its inputs and the vectors live
there, and CUDA is synchronised before each clock is read. Peak memory is, on the CPU, the resident
size's high-water mark (``VmHWM``) after a reset (:func:`benchmarks.matfree._reset_peak`) minus
the resident size then, and on CUDA the allocator's peak over what was allocated before, in this
process. The machine is shared: rows print the load average and the medians of interleaved rounds.
On a GPU the closed-form products are replayed as CUDA graphs (:mod:`hessviz.products.graphs`), as
every caller gets them; the product row shows the product launched as usual beside them.

A machine without the MiniLM checkpoint (a GPU machine without network) runs the rows on the same
layer and texts saved here beforehand: ``--save-cases cases.pt`` writes them, and
``HESSVIZ_SPEED_CASES=cases.pt`` makes :func:`real_case` read them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import numpy as np
import torch

import hessviz as hv
from hessviz.bench import peers
from hessviz.bench.matfree import _reset_peak, _rss_mib, _sync, interleaved
from hessviz.matfree import spectral

MODEL, LAYER = "all-MiniLM-L6-v2", 3


CASES_ENV = "HESSVIZ_SPEED_CASES"


def real_case(seq_len: int, device: str = "cpu"):
    """``cfg, params, X, Y`` of MiniLM's layer :data:`LAYER` on the first ``seq_len`` tokens of
    real English (the start of Python's ``pydoc_data`` help on assignment, as
    :func:`benchmarks.pretrained.text_ids`, ``2 L`` words so it fits 512 positions); from the
    file named by ``$HESSVIZ_SPEED_CASES`` (:func:`save_cases`) when it is set."""
    if os.environ.get(CASES_ENV):
        cases = torch.load(os.environ[CASES_ENV], weights_only=False)
        if seq_len not in cases:
            raise ValueError(
                f"seq_len {seq_len} is not among the saved cases {sorted(cases)} "
                f"(${CASES_ENV} = {os.environ[CASES_ENV]})"
            )
        cfg, params, X, Y = cases[seq_len]
        return cfg, {n: w.to(device) for n, w in params.items()}, X.to(device), Y.to(device)
    from pydoc_data.topics import topics

    from hessviz.pretrained import load

    ids = load.token_ids(MODEL, " ".join(topics["assignment"].split()[: 2 * seq_len]))
    ids = ids[: seq_len - 1] + ids[-1:]  # [CLS] … [SEP], seq_len tokens
    cfg, params = load.load_layer(MODEL, LAYER, device=device)
    cfg = dataclasses.replace(cfg, seq_len=len(ids))
    X = load.layer_inputs(MODEL, ids, LAYER, device=device)
    _, Y = hv.sample_inputs(cfg, seed=0, device=device)
    return cfg, params, X, Y


def save_cases(path, seq_lens) -> None:
    """Write :func:`real_case` at each of ``seq_lens`` (on the CPU) to ``path`` for a machine
    without the checkpoint: the layer's weights once, shared by every length (about 14 MB)."""
    cases = {L: real_case(L) for L in seq_lens}
    first = cases[seq_lens[0]][1]
    for L, (cfg, params, X, Y) in cases.items():  # one copy of the weights in the file
        assert all(torch.equal(params[n], first[n]) for n in first)
        cases[L] = (cfg, first, X, Y)
    torch.save(cases, path)


def _cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def _peak_start(device) -> float:
    """Reset the peak-memory counter of ``device``; return the MiB held now."""
    if _cuda(device):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**20
    return _reset_peak()


def _peak_mib(device, base: float) -> float:
    """Peak MiB over ``base`` since :func:`_peak_start` (resident size, or CUDA allocations)."""
    if _cuda(device):
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2**20 - base
    return _rss_mib() - base


def _clock() -> float:
    """``perf_counter`` once the GPU's queued work is done (:func:`benchmarks.matfree._sync`)."""
    _sync()
    return time.perf_counter()


def _measured(fn: Callable[[], tuple[np.ndarray, int]], device="cpu") -> dict:
    base = _peak_start(device)
    start = _clock()
    values, products = fn()
    seconds = _clock() - start
    return {
        "seconds": seconds,
        "products": products,
        "values": [float(x) for x in values],
        "peak_mib": _peak_mib(device, base),
    }


ACCURACY = 1e-8
"""The top-5 row's criterion: every eigenvalue within this relative distance of the tight reference."""


def top5_row(
    seq_len: int,
    peer_steps: int = 60,
    tol: float = 1e-8,
    which: tuple[str, ...] | None = None,
    device: str = "cpu",
    rounds: int = 1,
) -> dict:
    """Top-5 by every method at ``L = seq_len`` (``which`` limits the methods), the median seconds
    of ``rounds`` interleaved rounds.

    Two settings side by side: the same residual tolerance ``tol`` (``‖Hu − θu‖ ≤ tol·|θ|``) for
    all, and the same accuracy (:data:`ACCURACY`): the torch core on its eigenvalue bound
    (``bound="value"``, with and without its check product), against scipy ``eigsh`` on the kept
    graph at the loosest of 1e-3 … 1e-7 that meets it (found first, not timed)."""
    cfg, params, X, Y = real_case(seq_len, device)
    res = hv.hessian(cfg, params, X, Y)
    res.matvec(torch.zeros(res.size, dtype=X.dtype, device=X.device))  # the tape, built once

    def ours(solver: str, t: float = tol, **kw):
        def run():
            e = spectral.eigenpairs(res, "full", 5, "top", seed=0, tol=t, solver=solver, **kw)
            return e.values[::-1], e.matvecs

        return run

    e = spectral.eigenpairs(res, "full", 5, "top", seed=1, tol=1e-11, solver="torch")
    ref = e.values[::-1]

    def off(values) -> float:
        return float(np.max(np.abs(np.asarray(values) - ref) / np.abs(ref)))

    kept = peers.Counted(cfg, params, X, Y)
    at_tol = "scipy eigsh on double backward (graph kept), tol"

    def wanted(name: str) -> bool:
        return which is None or any(w in name for w in which)

    matched = (
        next(
            (
                t
                for t in (1e-3, 1e-4, 1e-5, 1e-6, 1e-7)  # searched only when timed
                if off(peers.scipy_top(kept, 5, t)[0]) <= ACCURACY
            ),
            tol,
        )
        if wanted(at_tol)
        else tol
    )
    methods = {
        "hessviz torch Lanczos": ours("torch"),
        f"hessviz torch Lanczos, eigenvalue bound {ACCURACY:g} (bound='value')": ours(
            "torch", ACCURACY, bound="value"
        ),
        "the same, values only (no check product)": ours("torch", ACCURACY, bound="value", check=False),
        "hessviz products + scipy eigsh": ours("scipy"),
        "scipy eigsh on double backward (graph kept)": lambda: peers.scipy_top(kept, 5, tol),
        f"{at_tol} {matched:g}": lambda: peers.scipy_top(kept, 5, matched),
        f"hessian-eigenthings lanczos ({peer_steps} steps) on double backward (graph kept)": lambda: (
            peers.eigenthings_top(kept, 5, tol, peer_steps)
        ),
        "PyHessian eigenvalues (power iteration, its defaults)": lambda: peers.pyhessian_top(
            cfg, params, X, Y, 5
        ),
    }
    methods = {n: f for n, f in methods.items() if wanted(n)}
    mag = None
    if any("PyHessian" in n for n in methods):  # it answers the largest |λ|
        m = spectral.eigenpairs(res, "full", 5, "magnitude", seed=1, tol=1e-8, solver="torch")
        mag = np.sort(m.values)[::-1]
    runs: dict[str, list[dict]] = {name: [] for name in methods}
    out = {}
    for _ in range(rounds):  # interleaved rounds
        for name, fn in methods.items():
            if name in out:
                continue
            try:
                runs[name].append(_measured(fn, device))
            except ImportError as err:  # a peer not installed
                out[name] = {"skipped": str(err)}
    for name, measured in runs.items():
        if not measured:
            continue
        r = dict(
            measured[-1],
            seconds=float(np.median([m["seconds"] for m in measured])),
            peak_mib=max(m["peak_mib"] for m in measured),
            rounds=len(measured),
        )
        against = mag if "PyHessian" in name else ref
        r["max_rel_diff"] = float(np.max(np.abs(np.asarray(r["values"]) - against) / np.abs(against)))
        out[name] = r
    return {
        "row": "top5",
        "L": len(X),
        "P": res.size,
        "reference": ref.tolist(),
        "reference_magnitude": None if mag is None else mag.tolist(),
        "reference_residuals": e.residuals[::-1].tolist(),
        "methods": out,
        "load": os.getloadavg(),
        "device": _device_name(device),
        "accuracy": ACCURACY,
    }


def product_row(seq_len: int, repeats: int = 5, k: int = 8, device: str = "cpu") -> dict:
    """One product three ways, and ``k`` at once against one (interleaved medians, seconds)."""
    cfg, params, X, Y = real_case(seq_len, device)
    res = hv.hessian(cfg, params, X, Y)
    gen = torch.Generator().manual_seed(0)
    VC = torch.randn(res.size, k, generator=gen, dtype=X.dtype).to(X.device)
    VF = VC.T.contiguous().T
    v = VC[:, 0].contiguous()
    kept, per_call = peers.Counted(cfg, params, X, Y), peers.per_call_hvp(cfg, params, X, Y)
    # cfg.param_names order is θ order, as res.matvec's
    agree = float((res.matvec(v) - kept(v)).abs().max() / kept(v).abs().max())
    fns = {
        "closed form, one": lambda: res.matvec(v),
        **_as_usual(cfg, params, X, Y, v),
        "double backward, graph kept": lambda: kept(v),
        "double backward per call": lambda: per_call(v),
        f"closed form, {k} at once (P, {k}) C-contiguous": lambda: res.matvec(VC),
        f"closed form, {k} at once (P, {k}) F-contiguous": lambda: res.matvec(VF),
    }
    measured = interleaved(fns, repeats)
    times = {n: t["median"] for n, t in measured.items()}
    cpu = {n: t["cpu_median"] for n, t in measured.items()}
    peak = {}
    for name in (
        "closed form, one",
        "double backward, graph kept",
        f"closed form, {k} at once (P, {k}) C-contiguous",
    ):
        base = _peak_start(device)
        fns[name]()
        peak[name] = _peak_mib(device, base)
    return {
        "row": "product",
        "L": len(X),
        "P": res.size,
        "k": k,
        "times": times,
        "cpu": cpu,
        "peak_mib": peak,
        "agreement": agree,
        "repeats": repeats,
        "load": os.getloadavg(),
        "device": _device_name(device),
    }


def _as_usual(cfg, params, X, Y, v) -> dict:
    """On a GPU, the closed-form product run as usual beside its CUDA-graph replay."""
    if not v.is_cuda:
        return {}
    res = hv.hessian(cfg, params, X, Y)
    res.products.replay = False
    return {"closed form, one, launched as usual (no CUDA graph)": lambda: res.matvec(v)}


def hutchinson_row(seq_len: int, samples: int = 30, repeats: int = 3, device: str = "cpu") -> dict:
    """Hutchinson's ``samples`` probes side by side (:func:`hessviz.matfree.trace`: products of up
    to ``BATCH`` columns) against PyHessian's way (a plain loop of kept-graph double-backward
    products) and a loop of single closed-form products, interleaved medians."""
    cfg, params, X, Y = real_case(seq_len, device)
    res = hv.hessian(cfg, params, X, Y)
    kept = peers.Counted(cfg, params, X, Y)

    def loop(fn):  # a probe drawn, multiplied and dotted at a time
        def run():
            gen, quad = torch.Generator().manual_seed(0), []
            for _ in range(samples):
                v = (torch.randint(0, 2, (res.size,), generator=gen, dtype=torch.int8) * 2 - 1).to(X)
                quad.append(fn(v) @ v)
            return float(torch.stack(quad).mean())

        return run

    fns = {
        f"hessviz Hutchinson, {samples} probes side by side": lambda: (
            spectral.trace(res, "full", samples, "hutchinson", seed=0).value
        ),
        f"{samples} closed-form products one at a time": loop(res.matvec),
        f"PyHessian's way: {samples} kept-graph double-backward products in a loop": loop(kept),
    }
    measured = interleaved(fns, repeats)
    return {
        "row": "hutchinson",
        "L": len(X),
        "samples": samples,
        "repeats": repeats,
        "times": {n: t["median"] for n, t in measured.items()},
        "cpu": {n: t["cpu_median"] for n, t in measured.items()},
        "load": os.getloadavg(),
        "device": _device_name(device),
    }


def float32_row(seq_len: int, repeats: int = 3, device: str = "cpu") -> dict:
    """float32 products and top-5 against float64 on the same layer and text: the largest relative
    difference of a product (``max|Δ| / max|ref|``), of the top-5 (torch core, ``tol = 1e-5`` in
    float32, ``1e-8`` in float64), and the interleaved product medians."""
    cfg, params, X, Y = real_case(seq_len, device)
    r64 = hv.hessian(cfg, params, X, Y)
    r32 = hv.hessian(cfg, {n: w.float() for n, w in params.items()}, X.float(), Y.float())
    v = torch.randn(r64.size, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(X.device)
    v32 = v.float()
    ref = r64.matvec(v)
    product = float((r32.matvec(v32).double() - ref).abs().max() / ref.abs().max())
    times = {
        n: t["median"]
        for n, t in interleaved(
            {"float64": lambda: r64.matvec(v), "float32": lambda: r32.matvec(v32)}, repeats
        ).items()
    }
    start = _clock()
    e32 = spectral.eigenpairs(r32, "full", 5, "top", seed=0, tol=1e-5, solver="torch")
    s32 = _clock() - start
    start = _clock()
    e64 = spectral.eigenpairs(r64, "full", 5, "top", seed=0, tol=1e-8, solver="torch")
    s64 = _clock() - start
    top = float(np.max(np.abs(e32.values - e64.values) / np.abs(e64.values)))
    return {
        "row": "float32",
        "L": len(X),
        "product_rel_diff": product,
        "top5_rel_diff": top,
        "times": times,
        "top5_seconds": {"float32": s32, "float64": s64},
        "top5_products": {"float32": e32.matvecs, "float64": e64.matvecs},
        "load": os.getloadavg(),
        "device": _device_name(device),
    }


def slq_row(
    seq_len: int, probes: int = 10, steps: int = 80, reorth: str = "partial", device: str = "cpu"
) -> dict:
    cfg, params, X, Y = real_case(seq_len, device)
    res = hv.hessian(cfg, params, X, Y)
    res.matvec(torch.zeros(res.size, dtype=X.dtype, device=X.device))
    base = _peak_start(device)
    start, start_cpu = _clock(), time.process_time()
    d = spectral.density(res, "full", probes=probes, steps=steps, seed=0, reorth=reorth)
    seconds, cpu = _clock() - start, time.process_time() - start_cpu
    return {
        "row": "slq",
        "L": len(X),
        "P": res.size,
        "probes": probes,
        "steps": steps,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "reorth": reorth,
        "products": d.matvecs,
        "peak_mib": _peak_mib(device, base),
        "trace": d.trace,
        "support": [float(d.all_nodes.min()), float(d.all_nodes.max())],
        "load": os.getloadavg(),
        "device": _device_name(device),
    }


def _device_name(device) -> str:
    if _cuda(device):
        return torch.cuda.get_device_name(device)
    return f"CPU, {torch.get_num_threads()} thread(s)"


def _load(r: dict) -> str:
    """The load average, after the GPU's name for a row measured on one."""
    load = ", ".join(f"{x:.1f}" for x in r["load"])
    where = r.get("device", "CPU")
    return load if where.startswith("CPU") else f"{load} on the host of an {where}"


def _rounds(r: dict) -> str:
    n = max((m.get("rounds", 1) for m in r["methods"].values()), default=1)
    return f" (median of {n})" if n > 1 else ""


def _seconds(s: float) -> str:
    """Three significant figures below 10 s (a GPU's top-5 takes tenths), one decimal above."""
    return f"{s:.3g}" if s < 10 else f"{s:.1f}"


def _at_once_ratio(name: str, times: dict, cpu: dict) -> str:
    """``k`` columns at once against one product: wall and (when measured) CPU time."""
    one = times["closed form, one"]
    head = f"{name.split('closed form, ')[-1]}: **{times[name] / one:.1f}×** one product"
    return head + (f" (CPU time {cpu[name] / cpu['closed form, one']:.1f}×)" if name in cpu else "")


def markdown(rows: list[dict]) -> str:
    out = []
    for r in rows:
        if r["row"] == "top5":
            accuracy = r.get("accuracy", 1.0)
            peer = [
                m["seconds"]
                for n, m in r["methods"].items()  # the peers meeting the criterion
                if "seconds" in m
                and not n.startswith(("hessviz", "the same"))
                and m["max_rel_diff"] <= accuracy
            ]
            mag = r.get("reference_magnitude")
            out += [
                f"**Top-5 eigenvalues**, L = {r['L']}, P = {r['P']:,} (load {_load(r)}); reference "
                f"{', '.join(f'{x:.6f}' for x in r['reference'])} (torch core, tol 1e-11, "
                f"true residuals ≤ {max(r['reference_residuals']):.1e})."
                + (
                    ""
                    if mag is None
                    else " PyHessian answers the largest |λ|; it is compared with "
                    f"those: {', '.join(f'{x:.6f}' for x in mag)}."
                ),
                "",
                f"| method | products | seconds{_rounds(r)} | fastest peer / this | peak MiB | "
                "max rel. diff from reference |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for name, m in r["methods"].items():
                if "skipped" in m:
                    out.append(f"| {name} | | | | | not installed |")
                    continue
                ratio = f"{min(peer) / m['seconds']:.2f}×" if peer else ""
                out.append(
                    f"| {name} | {m['products']} | {_seconds(m['seconds'])} | {ratio} | "
                    f"{m['peak_mib']:.0f} | {m['max_rel_diff']:.1e} |"
                )
            ours = {
                n: m["seconds"]
                for n, m in r["methods"].items()
                if n.startswith(("hessviz torch", "the same")) and "seconds" in m
            }
            if ours and peer:
                out.append(
                    "\nThe fastest peer whose five values are within "
                    f"{accuracy:g} of the reference, against "
                    + "; ".join(f"{n}: **{min(peer) / s:.2f}×**" for n, s in ours.items())
                    + "."
                )
            out.append("")
        elif r["row"] == "product":
            t = r["times"]
            one = t["closed form, one"]
            out += [
                f"**Products**, L = {r['L']} (medians of {r['repeats']} interleaved rounds, "
                f"load {_load(r)}; closed form vs kept graph: max rel. diff {r['agreement']:.1e}).",
                "",
                "| product | median ms | CPU ms | ms per column | one closed-form product / this, per "
                "column | peak MiB |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            cpu = r.get("cpu", {})
            for name, s in t.items():
                cols = r["k"] if "at once" in name else 1
                peak = r["peak_mib"].get(name)
                c = cpu.get(name)
                out.append(
                    f"| {name} | {s * 1e3:.1f} | {'' if c is None else f'{c * 1e3:.1f}'} | "
                    f"{s * 1e3 / cols:.1f} | {one / (s / cols):.2f}× | "
                    f"{'' if peak is None else f'{peak:.0f}'} |"
                )
            at_once = [n for n in t if "at once" in n]
            if at_once:
                out.append("\n" + "; ".join(_at_once_ratio(n, t, cpu) for n in at_once) + " (goal ≤ 4×).")
            out.append("")
        elif r["row"] == "hutchinson":
            t, cpu = r["times"], r["cpu"]
            ours = next(iter(t))
            out += [
                f"**Hutchinson**, {r['samples']} probes, L = {r['L']} (medians of {r['repeats']} "
                f"interleaved rounds, load {_load(r)}).",
                "",
                "| method | median s | CPU s | this / hessviz side by side |",
                "|---|---:|---:|---:|",
            ]
            for name, s in t.items():
                out.append(f"| {name} | {s:.2f} | {cpu[name]:.2f} | {s / t[ours]:.2f}× |")
            out.append("")
        elif r["row"] == "float32":
            t, ts, tp = r["times"], r["top5_seconds"], r["top5_products"]
            out += [
                f"**float32 against float64**, L = {r['L']} (load {_load(r)}): one product "
                f"{t['float32'] * 1e3:.1f} ms vs {t['float64'] * 1e3:.1f} ms, max rel. diff "
                f"{r['product_rel_diff']:.1e}; top-5 (torch core, tol 1e-5 / 1e-8) {ts['float32']:.1f} s "
                f"({tp['float32']} products) vs {ts['float64']:.1f} s ({tp['float64']}), max rel. diff "
                f"{r['top5_rel_diff']:.1e}.",
                "",
            ]
        elif r["row"] == "slq":
            how = {
                "partial": "basis kept, partial reorthogonalisation",
                "selective": "basis kept, selective reorthogonalisation",
                "none": "no basis, plain three-term recurrence",
                "full": "basis kept, full reorthogonalisation",
            }[r.get("reorth", "selective")]
            cpu = f", CPU {r['cpu_seconds']:.1f} s" if "cpu_seconds" in r else ""
            trace = f", trace {r['trace']:.6g}" if "trace" in r else ""
            out += [
                f"**SLQ density** ({how}), {r['probes']} probes × {r['steps']} steps, L = {r['L']}: "
                f"{r['seconds']:.1f} s{cpu}, {r['products']} products, peak {r['peak_mib']:.0f} MiB "
                f"over the set-up{trace}, support "
                f"[{r['support'][0]:.3g}, {r['support'][1]:.3g}] (load {_load(r)}).",
                "",
            ]
    return "\n".join(out)


SECTION = "## Spectra at the speed of the products (issue 20)"


def write_section(path, text: str, header: str = "") -> None:
    """Replace (or append) :data:`SECTION` of ``path`` with ``header`` and ``text``."""
    from pathlib import Path

    path = Path(path)
    old = path.read_text() if path.exists() else ""
    before = old.split(SECTION)[0].rstrip()
    keep = before + "\n\n" if before else ""
    path.write_text(keep + SECTION + "\n\n" + header + text)


def header(rows: list[dict]) -> str:
    """The section's first line, from where its rows were measured (their ``device`` and ``torch``),
    so that rows rendered on another machine keep their own."""
    first = rows[0] if rows else {}
    where = first.get("device", f"CPU, {torch.get_num_threads()} thread(s)")
    return (
        f"Real MiniLM layer {LAYER} (all-MiniLM-L6-v2 weights, a real text), float64, "
        f"{where}, torch {first.get('torch', torch.__version__)}; "
        f"`python -m benchmarks.matfree_spectra`.\n\n"
    )


def _saved_rows(out):
    """Where the rows of ``out`` are kept row by row: ``MATFREE.md`` -> ``MATFREE_SPEED.json``."""
    from pathlib import Path

    out = Path(out)
    return out.with_name(f"{out.stem}_SPEED.json")


def render(out="benchmarks/MATFREE.md") -> None:
    """Rewrite the section of ``out`` from the rows saved so far (:func:`_saved_rows`)."""
    import json

    rows = json.loads(_saved_rows(out).read_text())
    write_section(out, markdown(rows), header(rows))


def main(
    out="benchmarks/MATFREE.md",
    top5_lens=(24,),
    product_lens=(24, 64, 128),
    slq_len: int = 128,
    threads: int = 1,
    repeats: int = 5,
    float32_lens=(24,),
    progress=None,
    hutchinson_lens=(24,),
    slq_reorth=("none", "partial"),
    device: str = "cpu",
    top5_rounds: int = 1,
) -> list[dict]:
    import json

    torch.set_num_threads(threads)
    progress = progress or (lambda msg: print(msg, flush=True))
    rows: list[dict] = []
    partial = _saved_rows(out)

    def add(row: dict) -> None:
        rows.append(row | {"torch": torch.__version__})
        partial.write_text(json.dumps(rows, indent=2))  # kept row by row

    for L in top5_lens:
        progress(f"top-5 L={L}")
        add(top5_row(L, device=device, rounds=top5_rounds))
    for L in product_lens:
        progress(f"products L={L}")
        add(product_row(L, repeats, device=device))
    for L in float32_lens:
        progress(f"float32 L={L}")
        add(float32_row(L, device=device))
    for L in hutchinson_lens:
        progress(f"Hutchinson L={L}")
        add(hutchinson_row(L, device=device))
    if slq_len:
        for reorth in slq_reorth:
            progress(f"SLQ L={slq_len} ({reorth})")
            add(slq_row(slq_len, reorth=reorth, device=device))
    write_section(out, markdown(rows), header(rows))
    return rows


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/MATFREE.md")
    p.add_argument("--top5-lens", type=int, nargs="*", default=[24])
    p.add_argument("--product-lens", type=int, nargs="*", default=[24, 64, 128])
    p.add_argument("--slq-len", type=int, default=128, help="0: no SLQ row")
    p.add_argument("--float32-lens", type=int, nargs="*", default=[24])
    p.add_argument("--hutchinson-lens", type=int, nargs="*", default=[24])
    p.add_argument(
        "--slq-reorth",
        nargs="*",
        default=["none", "partial"],
        choices=["none", "partial", "selective", "full"],
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--top5-rounds", type=int, default=1, help="interleaved rounds of the top-5 row (median)")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the layer, inputs and vectors live")
    p.add_argument("--render", action="store_true", help="only rewrite the section from the saved rows")
    p.add_argument(
        "--save-cases",
        metavar="PATH",
        help=f"only save the layer and texts at every length asked for to PATH (for ${CASES_ENV})",
    )
    a = p.parse_args()
    if a.render:
        render(a.out)
        raise SystemExit(0)
    if a.save_cases:
        save_cases(
            a.save_cases,
            sorted(
                {
                    *a.top5_lens,
                    *a.product_lens,
                    *a.float32_lens,
                    *a.hutchinson_lens,
                    *([a.slq_len] if a.slq_len else []),
                }
            ),
        )
        raise SystemExit(0)
    main(
        a.out,
        tuple(a.top5_lens),
        tuple(a.product_lens),
        a.slq_len,
        a.threads,
        a.repeats,
        tuple(a.float32_lens),
        hutchinson_lens=tuple(a.hutchinson_lens),
        slq_reorth=tuple(a.slq_reorth),
        device=a.device,
        top5_rounds=a.top5_rounds,
    )
