"""Scaling laws: block norms against ‖X‖₂, L or d on log–log axes, with fitted slopes."""

import numpy as np
import streamlit as st

from hessviz import app as hva
from hessviz import plots, sweeps
from hessviz.app import budget
from hessviz.experiments.depth import factor_per_layer

SEEDS_MAX = 8
PAIRS = ("W_Q,W_Q", "W_K,W_K", "W_V,W_V", "W_Q,W_K", "W_Q,W_V", "W_G,W_G", "W_G,W_1", "W_1,W_1", "W_2,W_2",
         "q_norm_gamma,q_norm_gamma", "ln1_gamma,ln1_gamma")
PLACEMENTS = ("attention", "post", "pre")

view = hva.sidebar(stacks=True)
hva.header("Scaling laws", view)
hva.explain(
    "How big is each block of the Hessian, and how does it grow with the input? A power law "
    "‖H‖ ∝ x^s is a straight line of slope *s* on log–log axes. For self-attention alone the theory "
    "predicts that the outer W_Q–W_Q block grows like ‖X‖₂⁶ while softmax is still nearly uniform "
    "(small ‖X‖₂), and that at fixed ‖X‖₂ it shrinks like 1/L³ with the sequence length. Each point "
    "is the median over several seeds (weights, inputs and targets redrawn), the band spans "
    "their minimum to maximum; the dashed line is the least-squares fit over the marked regime.",
    r"\|H_{W_Q W_Q}^{\text{outer}}\|_2 \;\propto\; \|X\|_2^{6},\qquad"
    r"\|H_{W_Q W_Q}^{\text{outer}}\|_2 \;\propto\; L^{-3}\ \text{at fixed}\ \|X\|_2,\qquad"
    r"\log_{10}\|H\| \approx s\,\log_{10} x + c",
)

c1, c2, c3, c4 = st.columns([3, 3, 2, 2])
axis = hva.choice("Sweep over", tuple(sweeps.AXES), key="sc_axis", default="xnorm", container=c1,
                  help="xnorm: input size ‖X‖₂; L: sequence length; d: model width; layers: the depth of "
                  "the stack (the block is then the first layer's)")
cfg = view.cfg
names = cfg.block.param_names
pairs = tuple(p for p in PAIRS + ("W_O,W_O",) if all(n in names for n in p.split(",")))
if cfg.n_heads > 1:   # one head's slices: the same scaling laws, per head
    pairs += ("W_Q[0],W_Q[0]", "W_K[0],W_K[0]", "W_Q[0],W_K[0]", "W_Q[0],W_Q[1]", "W_V[0],W_V[0]",
              "W_O[0],W_O[0]")
pair_s = hva.select("Block (rows,cols)", pairs, key="sc_blk", default="W_Q,W_Q", container=c2)
n_seeds = hva.slider("Seeds", 1, SEEDS_MAX, key="sc_seeds", default=3, container=c3,
                     help="how many random draws per point; the band spans them")
layer = 0
if cfg.is_stack and axis != "layers":    # the same laws, measured in one layer of the stack
    layer = hva.slider("Layer", 0, cfg.n_layers - 1, key="sc_layer", default=0, container=c4,
                       help="which layer of the stack the block belongs to (0 = first)")
pair = tuple(pair_s.split(","))
grid = sweeps.DEFAULT_GRIDS[axis]
seeds = list(range(view.seed, view.seed + n_seeds))
st.caption(f"Grid: {sweeps.AXES[axis]} ∈ {{{', '.join(f'{g:g}' for g in grid)}}}; the other controls are "
           f"the sidebar's{'' if axis != 'xnorm' else ' (‖X‖₂ is swept)'}. Fit regime: "
           + {"xnorm": "‖X‖₂ ≤ 1.", "L": "L ≥ 4.", "d": "all points.",
             "layers": "none (a geometric law r^N: the factor per block is shown)."}[axis])
with hva.guard("the sweep"):
    largest = sweeps.largest_block(view.cfg, axis, grid, pair)
hva.afford(view, "sweep", points=len(grid) * n_seeds * (1 + len(PLACEMENTS)), block=largest,
           cfg=sweeps.costliest_config(view.cfg, axis, grid),
           advice=budget.block_advice(pair_s, largest))

bar = st.progress(0.0, text="Sweeping…")


def run(cfg, label: str, pair: tuple[str, str], offset: float, share: float) -> sweeps.Sweep:
    @hva.progress.throttled
    def progress(done: int, total: int) -> None:
        bar.progress(min(1.0, offset + share * done / total), text=f"Sweeping {label}: {done}/{total}")

    def measure(c, input_norm: float, seed: int) -> dict[str, float]:
        return hva.cache.sweep_point(c, input_norm, seed, pair, layer=layer)

    return sweeps.sweep(cfg, axis, grid, seeds, measure, input_norm=view.input_norm, progress=progress)


side_pair = pair if all(n.partition("[")[0] in ("W_Q", "W_K", "W_V") for n in pair) else ("W_Q", "W_Q")


def placed(norm: str):
    """The sidebar's block with LayerNorm placed at ``norm`` (no γ/β where there is no LayerNorm)."""
    return view.with_values(norm=norm, affine=view.cfg.ln_affine and norm in ("post", "pre")).cfg


with hva.guard("the sweep"):
    main = run(view.cfg, view.cfg.describe(), pair, 0.0, 0.4)
    side = {norm: run(placed(norm), norm, side_pair, 0.4 + 0.2 * k, 0.2) for k, norm in enumerate(PLACEMENTS)}
bar.empty()

by_depth = axis == "layers"     # a geometric law in N, not a power law: no slope fits
fits = {} if by_depth else sweeps.fits(main, view.cfg.norm, pair)
fig = hva.cache.figure(  # built once per view, for every visitor of a lesson link
    ("scaling", view.key, axis, pair_s, n_seeds, layer),
    lambda: plots.sweep_plot(main, sweeps.TERMS, stat="median", fits=fits,
                             y_title=f"‖H[{pair[0]}, {pair[1]}]‖₂",
                             title=f"{pair[0]}–{pair[1]} block vs {sweeps.AXES[axis]}"))
left, right = st.columns([3, 1], gap="medium")
with left:
    hva.chart(fig, f"scaling_{axis}_{pair[0]}_{pair[1]}", csv=main.table)
with right:
    if by_depth:
        st.markdown("**Factor per added block**")
        st.dataframe([{"term": t, "r": round(factor_per_layer(main.grid, main.values[t])[0], 3)}
                      for t in sweeps.TERMS], hide_index=True, width="stretch")
        st.caption("‖H(N)‖ ≈ c·r^N, fitted per seed: each block added on top multiplies the first "
                   "layer's block by r. The Depth page shows every layer.")
    else:
        st.markdown("**Fitted slope vs theory**")
        rows = []
        for t in sweeps.TERMS:
            f = fits[t]
            rows.append({"term": t, "fitted slope": round(f.slope, 2) if np.isfinite(f.slope) else None,
                         "theory": "—" if f.expected is None else f"{f.expected:g}"})
        st.dataframe(rows, hide_index=True, width="stretch")
        th = fits["outer"].expected
        if th is not None and np.isfinite(fits["outer"].slope):
            gap = fits["outer"].slope - th
            st.markdown(f"Outer: fitted **{fits['outer'].slope:.2f}** against the theory's **{th:g}** "
                        f"(difference {gap:+.2f}).")
        else:
            st.caption("The theory gives an exponent for the outer W_Q–W_Q block of attention alone "
                       "(set LayerNorm placement to *attention*, sweep ‖X‖₂ or L).")

st.subheader("Attention alone, Post-LN and Pre-LN side by side")
st.markdown("The same sweep for the three placements (block "
            f"{side_pair[0]}–{side_pair[1]}). LayerNorm rescales what reaches attention: with Pre-LN the "
            "attention input is normalised, so the block hardly changes with ‖X‖₂ and the steep ‖X‖⁶ curve "
            "of attention alone flattens.")
side_fits = {} if by_depth else {n: sweeps.fits(r, n, side_pair) for n, r in side.items()}
sfig = hva.cache.figure(("scaling_side", view.key, axis, side_pair, n_seeds, layer),
                       lambda: plots.side_by_side(side, stat="median", fits=side_fits,
                                                  y_title=f"‖H[{side_pair[0]}, {side_pair[1]}]‖₂"))


hva.chart(sfig, f"scaling_side_by_side_{axis}", csv=lambda: sweeps.long_table(side))
if by_depth:
    st.caption("Factor per added block per placement (outer / functional / full): " + "; ".join(
        f"{n}: " + " / ".join(f"{factor_per_layer(r.grid, r.values[t])[0]:.3g}" for t in sweeps.TERMS)
        for n, r in side.items()))
else:
    st.caption("Slopes per placement (outer / functional / full): " + "; ".join(
        f"{n}: " + " / ".join(f"{side_fits[n][t].slope:.2f}" for t in sweeps.TERMS) for n in PLACEMENTS))
