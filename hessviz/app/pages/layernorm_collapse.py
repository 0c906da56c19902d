"""LayerNorm collapse: curvature as one row's variance shrinks (LayerNorm alone, and a Post-LN block)."""

import streamlit as st

from hessviz import app as hva
from hessviz.app import views
from hessviz.experiments.common import violations
from hessviz.laws.fitting import center

view = hva.page(
    "LayerNorm collapse",
    "LayerNorm divides each row by its standard deviation σ. When one row's variance collapses, its "
    "derivatives blow up. Without ε LayerNorm is scale invariant, so its Jacobian grows exactly like 1/σ "
    "and its Hessian like 1/σ²; the bounds of Petrov et al. (with ‖X‖₂ held fixed) grow like 1/σ³ and 1/σ⁵. "
    "Here one row of the input keeps its direction while its σ shrinks, the other rows stay put. ε (the "
    "sidebar's LayerNorm ε) tames a single LayerNorm near σ ≈ √ε: its curvature peaks there and fades "
    "again below it, because the denominator √(σ² + ε) stops shrinking; in the Post-LN block the second "
    "LayerNorm undoes the first one's rescaling, and the cap comes only near σ ≈ ε.",
    r"\mathrm{LN}(z)=\frac{z-\operatorname{mean}(z)}{\sqrt{\operatorname{var}(z)+\varepsilon}},\qquad"
    r"\|J_{LN}\|_2\le\frac{1}{\sigma_{\min}}+\frac{\|X\|_2^2}{\sqrt n\,\sigma_{\min}^3},\qquad"
    r"\|H_{LN}\|_2\le\frac{\|X\|_2}{\sigma_{\min}^3}\Big(1+\sqrt{\tfrac mn}\Big)+"
    r"\frac{\|X\|_2^2}{\sqrt n\,\sigma_{\min}^3}+\frac{3\|X\|_2^3}{n\,\sigma_{\min}^5}",
)

c1, c2, c3 = st.columns(3)
mode = hva.choice(
    "View",
    views.LN_VIEWS,
    key="lnc_view",
    default="layernorm",
    container=c1,
    help="layernorm: the LayerNorm alone on an (L × d) input; block: a Post-LN block's weight "
    "Hessian as the first LayerNorm's input row collapses",
)
decades = hva.slider(
    "Decades of σ", 2, 7, key="lnc_decades", default=4, container=c2, help="σ runs from 1 down to 10^-decades"
)
n_seeds = hva.slider("Seeds", 1, 5, key="lnc_seeds", default=2, container=c3)
L, d = view.cfg.seq_len, view.cfg.d_model
if d < 2:
    st.warning("LayerNorm needs d ≥ 2 (a single feature has no variance). Raise d in the sidebar.")
    st.stop()


def _draw(name: str, result: views.Collapse, x_name: str) -> None:
    """The figure, its slopes above it and the CSV of the curves' centres (``x_name``: the x axis)."""
    for col, (label, value) in zip(st.columns(len(result.slopes)), result.slopes.items()):
        col.metric(f"slope {label}", value)
    centres = {k: center(v, "geomean") for k, v in result.curves.items()}
    hva.chart(result.figure, name, csv=lambda: {x_name: result.x, **centres})


if mode == "layernorm":
    with hva.guard("the LayerNorm sweep"):
        result = views.layernorm_collapse(view, decades, n_seeds)
    _draw("layernorm_collapse", result, "sigma")
    r = result.result
    viol = violations(r["J"], r["J_bound_rownorm"]) + violations(r["H"], r["H_bound_rownorm"])
    st.caption(
        f"With σ_min read as the centred row norm (the Lemma's own wording) instead of the row standard "
        f"deviation, the bounds fail at {viol} of {2 * r['J'].size} points here."
    )
else:
    post = view.with_values(norm="post")
    points = (3 * decades + 1) * n_seeds
    whole = hva.afford(
        post,
        "ln_collapse",
        stop=False,
        points=points,
        whole=1,
        advice="Only the W_Q–W_Q block is drawn; lower d or d_ff, the decades or the seeds "
        "to see the whole-matrix norms.",
    )
    if not whole:
        hva.afford(
            post, "ln_collapse", points=points, whole=0, advice="Lower d, d_k, the decades of σ or the seeds."
        )
    with hva.guard("the Post-LN sweep"):
        result = views.block_collapse(view, decades, n_seeds, whole)
    _draw("block_collapse", result, "sigma_min")
