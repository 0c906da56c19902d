"""Depth: the Hessian of a stack of blocks, layer by layer, Post-LN, Pre-LN and Peri-LN side by side."""

import numpy as np
import streamlit as st

from hessviz import app as hva
from hessviz import plots
from hessviz.app import budget
from hessviz.block.terms import NAMES
from hessviz.experiments.depth import diagonal_share, factor_per_layer
from hessviz.laws import sweeps

TERMS = NAMES  # full, outer, functional (hessviz.block.terms)
PAIRS = ("W_Q,W_Q", "W_K,W_K", "W_V,W_V", "W_Q,W_K", "W_O,W_O", "W_1,W_1", "W_2,W_2")
SIDES = budget.DEPTH_SIDES
DEPTHS = sweeps.DEFAULT_GRIDS["layers"]
SEEDS_MAX = 5

view = hva.page(
    "Depth",
    "A Transformer is a stack of blocks, each with its own weights, and the loss sits after the last "
    "one. The curvature that reaches an earlier block has passed through every later block, whose "
    "attention mixes the tokens: it couples every pair of tokens. hessviz carries a gradient **G** and "
    "a curvature **C** (outer) + **F** (functional), each over all tokens at once, back through each "
    "block's exact input Jacobian **A** and second derivative **T**, and reads every block of the "
    "stack's Hessian from them: within a layer and across layers.",
    r"G_{b-1} = A_b^\top G_b,\quad C_{b-1} = A_b^\top C_b A_b,\quad "
    r"F_{b-1} = A_b^\top F_b A_b + T_b^{XX}(G_b)",
    r"H_{\theta_b\theta_b} = J_b^\top (C_b + F_b) J_b + T_b^{\theta\theta}(G_b),\qquad "
    r"H_{\theta_b\theta_a} = \big(J_b^\top (C_b + F_b) A_b + T_b^{\theta X}(G_b)\big)\,"
    r"\frac{\partial X_{b-1}}{\partial \theta_a}",
    stacks=True,
)

cfg = view.cfg
pairs = tuple(p for p in PAIRS if all(n in cfg.block.param_names for n in p.split(",")))
c1, c2, c3 = st.columns([2, 3, 2])
term = hva.choice(
    "Term", TERMS, key="dp_term", default="full", container=c1, help="full = outer + functional"
)
pair_s = hva.select(
    "Block (rows,cols) of each layer",
    pairs,
    key="dp_blk",
    default="W_Q,W_Q",
    container=c2,
    help="the same block of every layer: l0.W_Q–l0.W_Q, l1.W_Q–l1.W_Q, …",
)
n_seeds = hva.slider(
    "Seeds",
    1,
    SEEDS_MAX,
    key="dp_seeds",
    default=2,
    container=c3,
    help="how many random draws per point; the band spans them",
)
pair = tuple(pair_s.split(","))
seeds = list(range(view.seed, view.seed + n_seeds))

# ----------------------------------------------------------------------------- layer by layer
st.subheader("How block-diagonal is the stack?")
if not cfg.is_stack:
    st.info(
        "The sidebar shows one block. Raise **Layers** to 2 or more to see the stack's Hessian "
        "layer by layer; the two views below use stacks of their own.",
        icon=":material/layers:",
    )
elif hva.afford(view, "map", stop=False):
    with st.spinner("Computing the stack's Hessian…"), hva.guard("the stack's Hessian"):
        norms = hva.cache.layer_norms(view.key, term)
    labels = [f"layer {i}" for i in range(cfg.n_layers)]
    left, right = st.columns([3, 2], gap="medium")
    with left:
        lfig = plots.block_norm_matrix(norms, labels, title=f"‖H[θ_i, θ_j]‖₂ of {term}, layer by layer")
        hva.chart(
            lfig,
            f"depth_layer_norms_{term}",
            csv=lambda: hva.block_columns(norms, labels, "norm"),
        )
    with right:
        share = diagonal_share(norms)
        st.metric(
            "Diagonal share",
            f"{share:.1%}",
            help="Σ_i ‖H[θ_i, θ_i]‖₂² / Σ_ij ‖H[θ_i, θ_j]‖₂²: 100 % is block-diagonal across layers",
        )
        st.markdown(
            "Each cell is the spectral norm of one layer-by-layer block of the "
            f"**{term}** Hessian of the {cfg.n_layers}-block stack in the sidebar. The off-diagonal "
            "cells are the cross-layer curvature that a block-diagonal approximation (K-FAC, "
            "per-layer Adam statistics) leaves out."
        )

# ----------------------------------------------------------------------------- the two depth views
depth = max(2, cfg.n_layers)


def placed(norm: str, n_layers: int):
    """The sidebar's block with LayerNorm placed at ``norm``, stacked ``n_layers`` deep."""
    return view.with_values(norm=norm, affine=cfg.ln_affine, layers=n_layers).cfg


points = n_seeds * len(SIDES) * (depth + len(DEPTHS))
largest = max(placed(n, DEPTHS[-1]).block.param_size(p) for n in SIDES for p in pair)
hva.afford(
    view,
    "depth",
    depth=depth,
    seeds=n_seeds,
    weight_count=largest,
    cfg=placed("post", 1),
    advice=budget.block_advice(pair_s, largest, "per layer"),
)
bar = st.progress(0.0, text="Measuring…")
done = [0]


def tick(label: str) -> None:
    done[0] += 1
    bar.progress(min(1.0, done[0] / points), text=f"{label}: {done[0]}/{points}")


def profile(norm: str) -> dict[str, np.ndarray]:
    """``term -> (seeds, layers)``: the pair's block norm in every layer of a ``depth``-block stack."""
    c = placed(norm, depth)
    out = {t: np.empty((len(seeds), depth)) for t in TERMS}
    for j, s in enumerate(seeds):
        for i in range(depth):
            got = hva.cache.sweep_point(c, view.input_norm, s, pair, layer=i)
            for t in TERMS:
                out[t][j, i] = got[t]
            tick(f"{norm}: layer {i} of {depth}")
    return out


def first_layer(norm: str) -> sweeps.Sweep:
    def measure(c, input_norm: float, seed: int) -> dict[str, float]:
        got = hva.cache.sweep_point(c, input_norm, seed, pair, layer=0)
        tick(f"{norm}: N = {c.n_layers}")
        return got

    return sweeps.sweep(
        placed(norm, 1), "layers", DEPTHS, seeds, measure, input_norm=view.input_norm, label=norm
    )


with hva.guard("the depth views"):
    profiles = {n: profile(n) for n in SIDES}
    firsts = {n: first_layer(n) for n in SIDES}
bar.empty()

st.subheader(f"Curvature per layer of a {depth}-block stack, Post-LN, Pre-LN and Peri-LN")
fig = plots.band_plot(
    np.arange(depth),
    {n: profiles[n][term] for n in SIDES},
    stat="median",
    logx=False,
    names={n: plots.placement_name(n) for n in SIDES},
    x_title="layer i (0 = first)",
    y_title=f"‖H[l_i.{pair[0]}, l_i.{pair[1]}]‖₂ ({term})",
    title=f"{pair[0]}–{pair[1]} block of each layer, {term}",
)
fig.update_xaxes(dtick=1)
hva.chart(
    fig,
    f"depth_profile_{pair[0]}_{pair[1]}_{term}",
    csv=lambda: {
        "placement": [n for n in SIDES for _ in seeds for _ in range(depth)],
        "seed": [s for _ in SIDES for s in seeds for _ in range(depth)],
        "layer": [i for _ in SIDES for _ in seeds for i in range(depth)],
        "norm": np.concatenate([profiles[n][term].ravel() for n in SIDES]),
    },
)

st.subheader("The first layer against depth")
sfig = plots.compare_plot(
    firsts,
    term,
    stat="median",
    logx=False,
    x_title="stack depth N (blocks)",
    y_title=f"‖H[l0.{pair[0]}, l0.{pair[1]}]‖₂ ({term})",
    title=f"First layer's {pair[0]}–{pair[1]} block ({term}) as blocks are added",
)
sfig.update_xaxes(dtick=1)
left, right = st.columns([3, 1], gap="medium")
with left:
    hva.chart(sfig, f"depth_first_layer_{pair[0]}_{pair[1]}_{term}", csv=lambda: sweeps.long_table(firsts))
with right:
    st.markdown("**Factor per added block**")
    rows = []
    for n in SIDES:
        for t in ("outer", "full"):
            r, lo, hi = factor_per_layer(firsts[n].grid, firsts[n].values[t])
            rows.append(
                {
                    "placement": plots.placement_name(n),
                    "term": t,
                    "r": round(r, 3),
                    "95% interval": f"[{lo:.3g}, {hi:.3g}]" if len(seeds) > 1 else "—",
                }
            )
    st.dataframe(rows, hide_index=True, width="stretch")
    st.caption("‖H(N)‖ ≈ c·r^N fitted per seed: r > 1 grows, r < 1 shrinks with each block added on top.")
st.markdown(
    "In Post-LN every path from the loss back to the first layer crosses both LayerNorm Jacobians "
    "of every later block, which the papers' argument expects to change the first layer's curvature "
    "more than Pre-LN's identity path does. But the stack ends without a LayerNorm, so Pre-LN's "
    "residual stream, and with it the curvature, grows with depth. Peri-LN normalises each block's "
    "output before adding it, so each block adds a branch of unit row scale. The claim row `depth` "
    "(Claims page) measures the three across seeds."
)
