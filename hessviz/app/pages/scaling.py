"""Scaling laws: block norms against ‖X‖₂, L or d on log–log axes, with fitted slopes."""

import numpy as np
import streamlit as st

from hessviz import app as hva
from hessviz import plots
from hessviz.app import budget, views, warm
from hessviz.experiments.depth import factor_per_layer
from hessviz.laws import sweeps

view = hva.page(
    "Scaling laws",
    "How big is each block of the Hessian, and how does it grow with the input? A power law "
    "‖H‖ ∝ x^s is a straight line of slope *s* on log–log axes. For self-attention alone the theory "
    "predicts that the outer W_Q–W_Q block grows like ‖X‖₂⁶ while softmax is still nearly uniform "
    "(small ‖X‖₂), and that at fixed ‖X‖₂ it shrinks like 1/L³ with the sequence length. Each point "
    "is the median over several seeds (weights, inputs and targets redrawn), the band spans "
    "their minimum to maximum; the dashed line is the least-squares fit over the marked regime.",
    r"\|H_{W_Q W_Q}^{\text{outer}}\|_2 \;\propto\; \|X\|_2^{6},\qquad"
    r"\|H_{W_Q W_Q}^{\text{outer}}\|_2 \;\propto\; L^{-3}\ \text{at fixed}\ \|X\|_2,\qquad"
    r"\log_{10}\|H\| \approx s\,\log_{10} x + c",
    stacks=True,
)

c1, c2, c3, c4 = st.columns([3, 3, 2, 2])
axis = hva.choice(
    "Sweep over",
    tuple(sweeps.AXES),
    key="sc_axis",
    default="xnorm",
    container=c1,
    help="xnorm: input size ‖X‖₂; L: sequence length; d: model width; layers: the depth of "
    "the stack (the block is then the first layer's)",
)
cfg = view.cfg
pair_s = hva.select(
    "Block (rows,cols)", views.scaling_pairs(view), key="sc_blk", default="W_Q,W_Q", container=c2
)
n_seeds = hva.slider(
    "Seeds",
    1,
    views.SCALING_SEEDS_MAX,
    key="sc_seeds",
    default=3,
    container=c3,
    help="how many random draws per point; the band spans them",
)
layer = 0
if cfg.is_stack and axis != "layers":  # the same laws, measured in one layer of the stack
    layer = hva.slider(
        "Layer",
        0,
        cfg.n_layers - 1,
        key="sc_layer",
        default=0,
        container=c4,
        help="which layer of the stack the block belongs to (0 = first)",
    )
pair = tuple(pair_s.split(","))
grid = sweeps.DEFAULT_GRIDS[axis]
st.caption(
    f"Grid: {sweeps.AXES[axis]} ∈ {{{', '.join(f'{g:g}' for g in grid)}}}; the other controls are "
    f"the sidebar's{'' if axis != 'xnorm' else ' (‖X‖₂ is swept)'}. Fit regime: " + views.FIT_REGIME[axis]
)
with hva.guard("the sweep"):
    price = views.scaling_price(view, axis, pair_s, n_seeds)
hva.afford(view, "sweep", advice=budget.block_advice(pair_s, price["weight_count"]), **price)

result = views.cached_scaling(view, axis, pair_s, n_seeds, layer)  # a view already made: no bar
if result is None:
    bar = st.progress(0.0, text="Sweeping…")
    said = {"text": ""}
    progress = hva.progress.throttled(lambda done, total: bar.progress(done / total, text=said["text"]))

    def sweeping(fraction: float, text: str) -> None:
        said["text"] = text
        progress(int(1000 * fraction), 1000)

    with hva.guard("the sweep"):
        result = views.scaling(view, axis, pair_s, n_seeds, layer, progress=sweeping)
    bar.empty()

main, side, fits, side_fits = result.main, result.side, result.fits, result.side_fits
side_pair = result.side_pair
by_depth = axis == "layers"
fig, sfig = result.figure, result.side_figure
left, right = st.columns([3, 1], gap="medium")
with left:
    hva.chart(fig, f"scaling_{axis}_{pair[0]}_{pair[1]}", csv=main.table)
with right:
    if by_depth:
        st.markdown("**Factor per added block**")
        hva.table(
            [{"term": t, "r": round(factor_per_layer(main.grid, main.values[t])[0], 3)} for t in sweeps.TERMS]
        )
        st.caption(
            "‖H(N)‖ ≈ c·r^N, fitted per seed: each block added on top multiplies the first "
            "layer's block by r. The Depth page shows every layer."
        )
    else:
        st.markdown("**Fitted slope vs theory**")
        rows = []
        for t in sweeps.TERMS:
            f = fits[t]  # the theory's column says so where the theory gives no exponent
            slope = plots.signed(f.slope) if np.isfinite(f.slope) else "—"
            theory = "none" if f.expected is None else plots.signed(f.expected, 0)
            rows.append({"term": t, "fitted slope": slope, "theory": theory})
        hva.table(rows)
        th = fits["outer"].expected
        if th is not None and np.isfinite(fits["outer"].slope):
            gap = fits["outer"].slope - th
            st.markdown(
                f"Outer: fitted **{plots.signed(fits['outer'].slope)}** against the theory's "
                f"**{plots.signed(th, 0)}** (difference {'+' if gap >= 0 else ''}{plots.signed(gap)})."
            )
        else:
            st.caption(
                "The theory gives an exponent for the outer W_Q–W_Q block of attention alone "
                "(set LayerNorm placement to *attention*, sweep ‖X‖₂ or L)."
            )

st.subheader("Attention alone, Post-LN, Pre-LN and Peri-LN side by side")
st.markdown(
    "The same sweep for the four placements (block "
    f"{side_pair[0]}–{side_pair[1]}). LayerNorm rescales what reaches attention: with Pre-LN the "
    "attention input is normalised, so the block hardly changes with ‖X‖₂ and the steep ‖X‖⁶ curve "
    "of attention alone flattens. Peri-LN normalises the input too, and also each sublayer's output "
    "before it joins the residual stream."
)
hva.chart(sfig, f"scaling_side_by_side_{axis}", csv=lambda: sweeps.long_table(side))
if by_depth:
    st.caption(
        "Factor per added block per placement (outer / functional / full): "
        + "; ".join(
            f"{n}: " + " / ".join(f"{factor_per_layer(r.grid, r.values[t])[0]:.3g}" for t in sweeps.TERMS)
            for n, r in side.items()
        )
    )
else:
    st.caption(views.slopes_line(result))

# a class on this view steps together: its neighbours are made while the server is idle
warm.offer(
    views.scaling_key(view, axis, pair_s, n_seeds, layer),
    lambda: views.scaling_neighbours(view, axis, pair_s, n_seeds, layer, hva.lesson()),
)
