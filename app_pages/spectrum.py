"""Spectrum: eigenvalues of the full, outer and functional Hessian, and the negative ones."""

import numpy as np
import streamlit as st

from hessviz import app as hva
from hessviz import plots

TERMS = ("full", "outer", "functional")
DENSE_LIMIT = 2048  # above this P: the outer term from its range (rank ≤ L·d), the others' extremes
K = 64

view = hva.sidebar()
hva.header("Spectrum", view)
hva.explain(
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
)
hva.afford(view, "spectrum", dense_limit=DENSE_LIMIT, k=K)
shown = hva.multichoice("Terms drawn", TERMS, key="spec_terms", default=TERMS,
                        help="the summaries below always cover all three")

P = view.num_params
spec, norms = {}, {}
with hva.guard("the spectrum") as status:
    for i, t in enumerate(TERMS):
        status.step(2 * i, 2 * len(TERMS), f"Eigenvalues of the {t} term…")
        spec[t] = hva.cache.spectrum(view.key, t, k=K, dense_limit=DENSE_LIMIT)
        status.step(2 * i + 1, 2 * len(TERMS), f"Block norms of the {t} term…")
        norms[t] = hva.cache.block_norms(view.key, t, "spectral")

partial = spec["full"]["partial"]
if partial:
    st.info(f"P = {P:,} is above {DENSE_LIMIT:,}, so the page computes only the {K} largest and {K} "
            f"smallest eigenvalues of the full and functional terms ({spec['full']['method']}); the outer "
            f"term has rank at most L·d, so all its eigenvalues come from its range "
            f"({spec['outer']['method']}). Counts and mass below are over what was computed.",
            icon=":material/info:")
else:
    st.caption(f"All {P:,} eigenvalues of each term, by a dense symmetric eigendecomposition.")

cols = st.columns(3)
for col, t in zip(cols, TERMS):
    s = spec[t]
    with col:
        st.markdown(f"**{t}**")
        c1, c2 = st.columns(2)
        c1.metric("negative eigenvalues", f"{s['negative_count']:,}" + (" (of extremes)" if partial else ""),
                  help=f"below −{s['tolerance']:.1e} (round-off relative to max |λ|)")
        c2.metric("negative mass", f"{100 * s['negative_mass']:.1f} %")
        st.caption(f"λ from {s['min']:.3g} to {s['max']:.3g}")

o, f, fu = spec["outer"], spec["functional"], spec["full"]
if o["negative_count"] == 0 and fu["negative_count"] > 0:
    st.success(
        f"**The data agree with the theory.** `outer` has no eigenvalue below round-off (smallest "
        f"{o['min']:.2g}): it is positive semi-definite. `full` has {fu['negative_count']:,} negative "
        f"eigenvalues carrying {100 * fu['negative_mass']:.1f} % of its curvature, all due to the functional "
        f"term ({f['negative_count']:,} negative). The loss is convex in the block's output, yet the block "
        "makes it non-convex in the weights.", icon=":material/check_circle:")
elif o["negative_count"] == 0:
    st.info("`outer` is positive semi-definite and here `full` is too: no negative curvature at this "
            "point. Try another seed, a larger ‖X‖₂ or the cross-entropy loss.", icon=":material/info:")
else:
    st.warning(f"`outer` shows {o['negative_count']} eigenvalue(s) below the round-off tolerance "
               f"(smallest {o['min']:.2g}); at this size floating-point error is larger than usual.",
               icon=":material/warning:")

values = {t: spec[t]["values"] for t in shown}
left, right = st.columns(2, gap="medium")
with left:
    fig = plots.spectrum_sorted(values, partial={t: spec[t]["partial"] for t in shown})
    hva.chart(fig, "spectrum_sorted", csv=lambda: {
        "term": [t for t in TERMS for _ in spec[t]["values"]],
        "index": [i for t in TERMS for i in range(len(spec[t]["values"]))],
        "eigenvalue": np.concatenate([spec[t]["values"] for t in TERMS])})
with right:
    hfig = plots.spectrum_histogram(values)
    hva.chart(hfig, "spectrum_histogram", npz=lambda: {t: spec[t]["values"] for t in TERMS})

st.subheader("Per-block spectral norms")
st.markdown("The spectral norm ‖H_ab‖₂ of a block is its largest singular value: how strongly moving "
            "weight block *b* can change the gradient of block *a*. The blocks differ by orders of "
            "magnitude, which is why a single learning rate fits Transformers badly.")
names = view.cfg.param_names
bfig = plots.block_norm_bars({t: norms[t] for t in shown}, names)
hva.chart(bfig, "block_spectral_norms", csv=lambda: {
    "term": [t for t in TERMS for a in names for b in names],
    "row": [a for t in TERMS for a in names for b in names],
    "col": [b for t in TERMS for a in names for b in names],
    "spectral_norm": np.concatenate([norms[t].ravel() for t in TERMS])})
