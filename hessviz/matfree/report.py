r"""One spectrum run, as data and as a figure: what ``hessviz spectrum`` writes.

:func:`spectrum_report` collects the extreme eigenvalues (Lanczos), optionally the SLQ
density, the Hutch++ trace and the per-block table, with the number of products and the
seconds each took; :func:`spectrum_figure` draws the density with the eigenvalues marked.
Both are pure functions of their inputs (the figure of the report alone).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from hessviz.matfree import spectral
from hessviz.matfree.spectral import Progress

if TYPE_CHECKING:
    import plotly.graph_objects as go


def spectrum_report(
    res,
    term: str = "full",
    top: int = 5,
    bottom: int = 0,
    density: bool = False,
    probes: int = 10,
    steps: int = 80,
    trace_samples: int = 0,
    blocks: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict:
    """A JSON-ready dict: ``top``/``bottom`` eigenvalues, ``density`` (nodes, weights, curve),
    ``trace`` and ``blocks``, each with ``matvecs`` and ``seconds``."""
    out: dict = {"term": term, "P": res.size, "names": list(res.names), "seed": seed}
    for which, k in (("top", top), ("bottom", bottom)):
        if k:
            e = spectral.eigenpairs(res, term, k, which, seed=seed, progress=progress)
            out[which] = {
                "values": e.values.tolist(),
                "matvecs": e.matvecs,
                "seconds": e.seconds,
                "method": e.method,
            }
    if density:
        d = spectral.density(res, term, probes, steps, seed=seed, progress=progress)
        grid, phi = d.curve()
        out["density"] = {
            "probes": probes,
            "steps": steps,
            "nodes": [x.tolist() for x in d.nodes],
            "weights": [w.tolist() for w in d.weights],
            "grid": grid.tolist(),
            "curve": phi.tolist(),
            "trace_estimate": d.trace,
            "matvecs": d.matvecs,
            "seconds": d.seconds,
            "method": d.method,
        }
    if trace_samples:
        start = time.perf_counter()
        t = spectral.trace(res, term, trace_samples, "hutch++", seed=seed, progress=progress)
        out["trace"] = {
            "value": t.value,
            "stderr": t.stderr,
            "matvecs": t.matvecs,
            "method": t.method,
            "seconds": time.perf_counter() - start,
        }
    if blocks:
        table = spectral.block_table(res, term, seed=seed, progress=progress)
        out["blocks"] = {"rows": table.as_dicts(), "matvecs": table.matvecs, "seconds": table.seconds}
    return out


def spectrum_figure(report: dict, title: str | None = None) -> go.Figure:
    """The SLQ density (log scale) with the Lanczos eigenvalues as markers; with a block
    table, a second panel of each block's top eigenvalue."""
    import plotly.graph_objects as go  # imported when a figure is drawn, never by ``import hessviz``
    from plotly.subplots import make_subplots

    with_blocks = "blocks" in report
    fig = make_subplots(
        rows=2 if with_blocks else 1,
        cols=1,
        vertical_spacing=0.18,
        subplot_titles=("Spectral density", "Top eigenvalue per block")
        if with_blocks
        else ("Spectral density",),
    )
    if "density" in report:
        d = report["density"]
        curve = np.maximum(np.asarray(d["curve"]), 1e-12)
        fig.add_trace(
            go.Scatter(
                x=d["grid"], y=curve, mode="lines", name=f"SLQ ({d['probes']} probes × {d['steps']} steps)"
            ),
            row=1,
            col=1,
        )
        fig.update_yaxes(type="log", title_text="density", row=1, col=1)
    for which, symbol in (("top", "triangle-down"), ("bottom", "triangle-up")):
        if which in report:
            vals = report[which]["values"]
            fig.add_trace(
                go.Scatter(
                    x=vals,
                    y=[1.0] * len(vals),
                    mode="markers",
                    marker={"symbol": symbol, "size": 10},
                    name=f"{which} {len(vals)} (Lanczos)",
                ),
                row=1,
                col=1,
            )
    fig.update_xaxes(title_text="eigenvalue λ", row=1, col=1)
    if with_blocks:
        rows = report["blocks"]["rows"]
        fig.add_trace(
            go.Bar(x=[r["name"] for r in rows], y=[r["top"] for r in rows], name="λ_max(H[b, b])"),
            row=2,
            col=1,
        )
        fig.update_yaxes(title_text="λ_max", row=2, col=1)
    fig.update_layout(
        title=title or f"{report['term']} Hessian, P = {report['P']:,}",
        template="plotly_white",
        height=820 if with_blocks else 480,
    )
    return fig
