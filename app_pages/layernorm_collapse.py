"""LayerNorm collapse: curvature as one row's variance shrinks (LayerNorm alone, and a Post-LN block)."""

import numpy as np
import streamlit as st

from hessviz import app as hva
from hessviz import plots
from hessviz.experiments.common import violations
from hessviz.experiments.ln_collapse import sigma_axis
from hessviz.fitting import center, pooled_power_law_fit

view = hva.sidebar()
hva.header("LayerNorm collapse", view)
hva.explain(
    "LayerNorm divides each row by its standard deviation σ. When one row's variance collapses, its "
    "derivatives blow up. Without ε LayerNorm is scale invariant, so its Jacobian grows exactly like 1/σ "
    "and its Hessian like 1/σ²; the bounds of Petrov et al. (with ‖X‖₂ held fixed) grow like 1/σ³ and 1/σ⁵. "
    "Here one row of the input keeps its direction while its σ shrinks, the other rows stay put. ε (the "
    "sidebar's LayerNorm ε) caps a single LayerNorm near σ ≈ √ε; in the Post-LN block the second LayerNorm "
    "undoes the first one's rescaling, and the cap comes only near σ ≈ ε.",
    r"\mathrm{LN}(z)=\frac{z-\bar z}{\sqrt{\operatorname{var} z+\varepsilon}},\qquad"
    r"\|J_{LN}\|_2\le\frac{1}{\sigma_{\min}}+\frac{\|X\|_2^2}{\sqrt n\,\sigma_{\min}^3},\qquad"
    r"\|H_{LN}\|_2\le\frac{\|X\|_2}{\sigma_{\min}^3}\Big(1+\sqrt{\tfrac mn}\Big)+"
    r"\frac{\|X\|_2^2}{\sqrt n\,\sigma_{\min}^3}+\frac{3\|X\|_2^3}{n\,\sigma_{\min}^5}",
)

c1, c2, c3 = st.columns(3)
mode = hva.choice(
    "View",
    ("layernorm", "block"),
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
eps = view.cfg.ln_eps
sig = np.logspace(0, -decades, 3 * decades + 1)
seeds = tuple(range(view.seed, view.seed + n_seeds))
L, d = view.cfg.seq_len, view.cfg.d_model
if d < 2:
    st.warning("LayerNorm needs d ≥ 2 (a single feature has no variance). Raise d in the sidebar.")
    st.stop()


def _slope(x, Y) -> str:
    try:
        return f"{pooled_power_law_fit(x, Y, hi=1e-2, n_boot=0).slope:.2f}"
    except ValueError:  # fewer than two points with σ ≤ 1e-2
        return "–"


def _draw(name: str, x, curves: dict, title: str, x_title: str, **kw) -> None:
    """Geometric-mean bands of ``curves`` over σ_min, with the CSV of their centres."""
    fig = plots.band_plot(x, curves, stat="geomean", title=title, x_title=x_title, y_title="spectral norm",
                          **kw)
    hva.chart(fig, name, csv=lambda: {"sigma_min": x, **{k: center(v, "geomean") for k, v in curves.items()}})


if mode == "layernorm":
    with hva.guard("the LayerNorm sweep"):
        r = hva.cache.ln_sweep(tuple(sig), eps, L, d, seeds)
    x = sigma_axis(r)
    k1, k2, k3, k4 = st.columns(4)
    k1.metric("slope ‖J‖ (σ ≤ 1e-2)", _slope(x, r["J"]))
    k2.metric("slope ‖H‖", _slope(x, r["H"]))
    k3.metric("slope of J bound", _slope(x, r["J_bound"]))
    k4.metric("slope of H bound", _slope(x, r["H_bound"]))
    curves = {
        "‖J_LN‖₂ exact": r["J"],
        "‖H_LN‖₂ exact": r["H"],
        "‖J_LN‖₂ bound": r["J_bound"],
        "‖H_LN‖₂ bound": r["H_bound"],
    }
    _draw("layernorm_collapse", x, curves, f"LayerNorm alone on a {L} × {d} input, ε = {eps:g}",
          "σ_min (std of the collapsing row)")
    viol = violations(r["J"], r["J_bound_rownorm"]) + violations(r["H"], r["H_bound_rownorm"])
    st.caption(
        f"With σ_min read as the centred row norm (the Lemma's own wording) instead of the row standard "
        f"deviation, the bounds fail at {viol} of {2 * r['J'].size} points here."
    )
else:
    c = view.cfg
    post = view.with_values(norm="post")
    points = sig.size * n_seeds
    whole = hva.afford(post, "ln_collapse", stop=False, points=points, whole=1,
                       advice="Only the W_Q–W_Q block is drawn; lower d or d_ff, the decades or the seeds "
                              "to see the whole-matrix norms.")
    if not whole:
        hva.afford(post, "ln_collapse", points=points, whole=0,
                   advice="Lower d, d_k, the decades of σ or the seeds.")
    with hva.guard("the Post-LN sweep"):
        r = hva.cache.ln_block_sweep(tuple(sig), eps, seeds, L, d, c.d_k, c.d_ff, view.input_norm, whole)
    x = sigma_axis(r)
    keys = ("full", "outer", "functional", "QQ_full") if whole else ("QQ_full",)
    curves = {f"‖H_{k}‖₂": r[k] for k in keys}
    k1, k2 = st.columns(2)
    k1.metric("slope ‖H_QQ‖ (σ ≤ 1e-2)", _slope(x, r["QQ_full"]))
    if whole:
        k2.metric("slope ‖H_full‖", _slope(x, r["full"]))
    _draw("block_collapse", x, curves, f"Post-LN block (L = {L}, d = {d}), ε = {eps:g}",
          "σ_min of the first LayerNorm's input",
          guides=[plots.Guide(-2.0, next(iter(curves)), -1, "σ⁻² guide")])
