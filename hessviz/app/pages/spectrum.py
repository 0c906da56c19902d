"""Spectrum: eigenvalues of the full, outer and functional Hessian, and the negative ones."""

import numpy as np
import streamlit as st

from hessviz import app as hva
from hessviz import plots
from hessviz.app import views
from hessviz.block.terms import NAMES
from hessviz.matfree.spectra import DENSE_LIMIT
from hessviz.runtime.memory import format_bytes

TERMS = NAMES  # full, outer, functional (hessviz.block.terms)
METHODS = ("auto", "dense", "matrix-free")
K = views.SPECTRUM_K


def metric(
    where, label: str, value: float, se: float, percent: bool = False, help: str | None = None
) -> None:
    """An estimate with its standard error in the label (the value alone fits a narrow column)."""
    scale, unit = (100, " %") if percent else (1, "")
    error = f" ± {scale * se:.2g}{unit}" if np.isfinite(se) else ""
    where.metric(f"{label}{error}", f"{scale * value:.3g}{unit}", help=help)


LANCZOS_SLIDERS = (
    (
        "Extreme eigenvalues k (each end)",
        1,
        20,
        "spec_k",
        5,
        "the k largest and k smallest eigenvalues, by Lanczos (hessviz's torch core)",
    ),
    (
        "SLQ probes",
        1,
        30,
        "spec_probes",
        4,
        "random ±1 start vectors; the standard errors below are over them",
    ),
    (
        "Lanczos steps per probe",
        5,
        120,
        "spec_steps",
        30,
        "each probe's density has this many nodes (Gauss quadrature exact for polynomials of degree "
        "< 2·steps)",
    ),
)
"""The matrix-free view's three sliders: label, range, key, default, help."""


def spectrum_matrix_free(view, shown: list[str], why: str) -> None:
    """Lanczos extremes and an SLQ density of each term drawn, from products alone."""
    P = view.num_params
    k, probes, steps = (
        hva.slider(label, low, high, key=key, default=default, container=where, help=text)
        for (label, low, high, key, default, text), where in zip(LANCZOS_SLIDERS, st.columns(3))
    )
    extra = {"k": k, "probes": probes, "steps": steps, "group_bytes": hva.cache.SLQ_GROUP_BYTES}
    cost = hva.verdict(view, "spectrum_matfree", terms=len(shown), **extra).cost
    bigger = hva.verdict(
        view,
        "spectrum_matfree",
        terms=3,
        k=max(k, 10),
        probes=max(2 * probes, 10),
        steps=max(steps, 80),
        group_bytes=hva.cache.SLQ_GROUP_BYTES,
    ).cost
    st.info(
        f"**Matrix-free spectrum**, because {why}. No P × P matrix is formed. For each term drawn, the "
        f"{k} largest and {k} smallest eigenvalues by **Lanczos** (each within 1e-8 relative by its "
        "error bound) and the spectral density by **stochastic Lanczos quadrature** "
        f"({probes} probes × {steps} steps), "
        "all from closed-form Hessian-vector products. Estimated work here: about "
        f"{cost.seconds:.2g} s and {format_bytes(cost.bytes)}; all three terms with "
        f"{max(2 * probes, 10)} probes × {max(steps, 80)} steps would take about {bigger.seconds:.2g} s "
        f"({'within' if bigger.seconds <= hva.cache.LIMITS.max_seconds else 'over'} this "
        f"server's {hva.cache.LIMITS.max_seconds:g} s per view).",
        icon=":material/info:",
    )
    hva.afford(
        view,
        "spectrum_matfree",
        terms=len(shown),
        advice="Lower the probes, steps or k, draw fewer terms, or lower d, d_ff, heads or L.",
        **extra,
    )
    spec = {}
    with hva.guard("the matrix-free spectrum"):
        for t in shown:
            spec[t] = hva.cache.matfree_spectrum(view.key, t, k, probes, steps, view.seed)
    cols = st.columns(len(shown))
    for col, t in zip(cols, shown):
        s, d = spec[t], spec[t]["density"]
        with col:
            st.markdown(f"**{t}**")
            a, b = st.columns(2)
            a.metric("λ_max (Lanczos)", f"{s['top']['values'][-1]:.4g}")
            if s["bottom"] is None:
                rank = view.cfg.seq_len * view.cfg.d_model
                b.metric(
                    "λ_min",
                    "0",
                    help=f"outer = JᵀAJ ⪰ 0 has rank ≤ L·d = {rank:,} < P: at least "
                    "P − L·d of its eigenvalues are 0 (not computed)",
                )
            else:
                b.metric("λ_min (Lanczos)", f"{s['bottom']['values'][0]:.4g}")
            metric(
                a,
                "negative share (SLQ)",
                d["negative_share"],
                d["negative_share_se"],
                percent=True,
                help="share of the P eigenvalues below zero (round-off excluded), ± standard error "
                "over probes",
            )
            metric(
                b,
                "negative mass (SLQ)",
                d["negative_mass"],
                d["negative_mass_se"],
                percent=True,
                help="Σ|λ| over negative λ / Σ|λ|, ± standard error over probes",
            )
            metric(a, "trace (SLQ)", d["trace"], d["trace_se"], help="P · Σ τ_j θ_j, ± standard error")
            lanczos = [s[w] for w in ("top", "bottom") if s[w] is not None]
            st.caption(
                f"{sum(e['matvecs'] for e in lanczos)} Lanczos products in "
                f"{sum(e['seconds'] for e in lanczos):.2g} s; SLQ {d['matvecs']} products "
                f"in {d['seconds']:.2g} s."
            )
    st.caption(
        "Error statement: each Lanczos eigenvalue is within 1e-8 of the true one, relative, by "
        "its error bound min(‖r‖, ‖r‖²/gap). SLQ "
        f"numbers are means over {probes} probes ± their standard error (none with one probe); each "
        f"probe's {steps} nodes resolve the density to about 1/{steps} of the spectral range, and the "
        "curve is smoothed by Gaussians of 1 % of the range. More probes shrink the error like "
        "1/√probes."
    )
    ext = {
        t: np.concatenate([spec[t][w]["values"] for w in ("bottom", "top") if spec[t][w] is not None])
        for t in shown
    }
    ends = {t: [w for w in ("bottom", "top") if spec[t][w] is not None for _ in range(k)] for t in shown}
    curves = {t: (spec[t]["density"]["grid"], spec[t]["density"]["curve"]) for t in shown}
    left, right = st.columns(2, gap="medium")
    with left:
        fig = plots.spectral_density(
            curves, extremes=ext, title=f"Spectral density (SLQ, {probes} × {steps}), P = {P:,}"
        )
        hva.chart(
            fig,
            "spectral_density_slq",
            npz=lambda: {
                **{f"{t}_nodes": spec[t]["density"]["nodes"] for t in shown},
                **{f"{t}_weights": spec[t]["density"]["weights"] for t in shown},
            },
        )
    with right:
        efig = plots.spectrum_sorted(
            ext,
            partial={t: True for t in shown},
            title=f"The {k} smallest and {k} largest eigenvalues (Lanczos)",
        )
        hva.chart(
            efig,
            "spectrum_extremes_lanczos",
            csv=lambda: {
                "term": [t for t in shown for _ in ext[t]],
                "end": [e for t in shown for e in ends[t]],
                "eigenvalue": np.concatenate([ext[t] for t in shown]),
            },
        )
    st.caption(
        "Per-block top eigenvalues and traces, for every weight and every head, are on the "
        "**Heterogeneity** page."
    )


view = hva.page(
    "Spectrum",
    "A symmetric matrix has real eigenvalues λ; each one is the curvature of the loss along one "
    "direction of weight space. Positive: the loss bends up (a bowl), negative: it bends down (a "
    "saddle). The **outer** (Gauss–Newton) part is JᵀAJ with A the Hessian of a convex loss in the "
    "output, so it can never have a negative eigenvalue. Any negative eigenvalue of the **full** "
    "Hessian therefore comes from the **functional** part: the block itself, not the loss, makes the "
    "landscape non-convex. The *negative mass* is the share of curvature, by absolute size, that "
    "points down.",
    r"H v_i = \lambda_i v_i,\qquad "
    r"\text{negative mass} = \frac{\sum_{\lambda_i<0} |\lambda_i|}{\sum_i |\lambda_i|},\qquad "
    r"H_{\text{outer}} = J^\top \nabla_Z^2\ell\, J \succeq 0",
    stacks=True,
)
P = view.num_params
c1, c2 = st.columns([2, 3])
how = hva.choice(
    "Method",
    METHODS,
    key="spec_method",
    default="auto",
    container=c1,
    help="auto: dense eigenvalues while the dense terms fit this server (and P ≤ "
    f"{DENSE_LIMIT:,}), else matrix-free; dense: always the dense terms; matrix-free: "
    "Lanczos eigenvalues and an SLQ density from closed-form Hessian-vector products",
)
shown = hva.multichoice(
    "Terms drawn",
    TERMS,
    key="spec_terms",
    default=TERMS,
    container=c2,
    help="dense: the summaries always cover all three; matrix-free: only the terms drawn are computed",
)
if not shown:
    st.info(
        "Every term is off: pick at least one under *Terms drawn* to draw its spectrum.",
        icon=":material/visibility_off:",
    )
    st.stop()
dense = hva.verdict(view, "spectrum", dense_limit=DENSE_LIMIT, k=K)
if how == "matrix-free" or how == "auto" and (P > DENSE_LIMIT or not dense.ok):
    why = (
        "you chose it"
        if how == "matrix-free"
        else f"P = {P:,} is above {DENSE_LIMIT:,}"
        if dense.ok
        else f"the dense spectrum is over this server's budget. {dense.reason.rstrip('.')}"
    )
    spectrum_matrix_free(view, shown, why)
    st.stop()
hva.afford(view, "spectrum", dense_limit=DENSE_LIMIT, k=K)

with hva.guard("the spectrum") as status:
    result = views.spectrum(view, shown, step=status.step)
spec, norms = result.spec, result.norms

partial = spec["full"]["partial"]
if partial:
    st.info(
        f"P = {P:,} is above {DENSE_LIMIT:,}, so the page computes only the {K} largest and {K} "
        f"smallest eigenvalues of the full and functional terms ({spec['full']['method']}); the outer "
        f"term has rank at most L·d, so all its eigenvalues come from its range "
        f"({spec['outer']['method']}). Counts and mass below are over what was computed.",
        icon=":material/info:",
    )
else:
    st.caption(f"All {P:,} eigenvalues of each term, by a dense symmetric eigendecomposition.")

cols = st.columns(3)
for col, t in zip(cols, TERMS):
    s = spec[t]
    with col:
        st.markdown(f"**{t}**")
        c1, c2 = st.columns(2)
        c1.metric(
            "negative λ",
            f"{s['negative_count']:,}" + (" (of extremes)" if partial else ""),
            help=f"below −{s['tolerance']:.1e} (round-off relative to max |λ|)",
        )
        c2.metric("negative mass", f"{100 * s['negative_mass']:.1f} %")
        st.caption(f"λ from {s['min']:.3g} to {s['max']:.3g}")

o, f, fu = spec["outer"], spec["functional"], spec["full"]
if o["negative_count"] == 0 and fu["negative_count"] > 0:
    st.success(
        f"**The data agree with the theory.** `outer` has no eigenvalue below round-off (smallest "
        f"{o['min']:.2g}): it is positive semi-definite. `full` has {fu['negative_count']:,} negative "
        f"eigenvalues carrying {100 * fu['negative_mass']:.1f} % of its curvature, all due to the functional "
        f"term ({f['negative_count']:,} negative). The loss is convex in the block's output, yet the block "
        "makes it non-convex in the weights.",
        icon=":material/check_circle:",
    )
elif o["negative_count"] == 0:
    st.info(
        "`outer` is positive semi-definite and here `full` is too: no negative curvature at this "
        "point. Try another seed, a larger ‖X‖₂ or the cross-entropy loss.",
        icon=":material/info:",
    )
else:
    st.warning(
        f"`outer` shows {o['negative_count']} eigenvalue(s) below the round-off tolerance "
        f"(smallest {o['min']:.2g}); at this size floating-point error is larger than usual.",
        icon=":material/warning:",
    )

left, right = st.columns(2, gap="medium")
with left:
    hva.chart(
        result.sorted_figure,
        "spectrum_sorted",
        csv=lambda: {
            "term": [t for t in TERMS for _ in spec[t]["values"]],
            "index": [i for t in TERMS for i in range(len(spec[t]["values"]))],
            "eigenvalue": np.concatenate([spec[t]["values"] for t in TERMS]),
        },
    )
with right:
    hva.chart(result.histogram, "spectrum_histogram", npz=lambda: {t: spec[t]["values"] for t in TERMS})

st.subheader("Per-block spectral norms")
st.markdown(
    "The spectral norm ‖H_ab‖₂ of a block is its largest singular value: how strongly moving "
    "weight block *b* can change the gradient of block *a*. The blocks differ by orders of "
    "magnitude, which is why a single learning rate fits Transformers badly."
)
names = view.cfg.param_names
hva.chart(
    result.bars,
    "block_spectral_norms",
    csv=lambda: hva.block_columns({t: norms[t] for t in TERMS}, names, "spectral_norm"),
)
