"""Hessian map: the full, outer or functional Hessian as a heatmap, block by block."""

import streamlit as st

from hessviz import app as hva
from hessviz import plots

TERMS = ("full", "outer", "functional")
KINDS = {"spectral": "spectral ‖·‖₂", "fro": "Frobenius ‖·‖_F"}  # URL value -> words

view = hva.sidebar()
hva.header("Hessian map", view)
hva.explain(
    "Each pixel is one second derivative of the loss: row *a* and column *b* are two weights "
    "of the block, ordered W_Q, W_K, W_V, W_1, W_2, and the colour is how the slope in *a* changes "
    "when *b* moves. Red is positive, blue negative, white zero; the colour scale is logarithmic on "
    "both sides of zero so that small entries stay visible. The Gauss–Newton split writes the "
    "Hessian as an **outer** part (always positive semi-definite) plus a **functional** part (the "
    "curvature of the network itself, weighted by the loss gradient).",
    r"H = \frac{\partial^2 \ell}{\partial\theta^2}"
    r"= \underbrace{J^\top \big(\nabla_Z^2 \ell\big)\, J}_{\text{outer}}"
    r"+ \underbrace{\textstyle\sum_i \frac{\partial \ell}{\partial Z_i}\,"
    r"\nabla_\theta^2 Z_i}_{\text{functional}},"
    r"\qquad J = \frac{\partial\, \mathrm{vec}_r Z}{\partial \theta}",
)
hva.afford(view, "map")

names = view.cfg.param_names
pairs = ["all"] + [f"{a},{b}" for i, a in enumerate(names) for b in names[i:]]
c1, c2, c3 = st.columns([2, 2, 3])
term = hva.choice("Term", TERMS, key="term", default="full", container=c1,
                  help="full = outer + functional")
kind = hva.choice("Block norm", tuple(KINDS), key="bnorm", default="spectral", container=c2,
                  help="spectral: the largest singular value of the block; fro: root of the sum of squares")
pair = hva.select("Zoom into a block pair (rows,cols) at full resolution", pairs, key="blk", default="all",
                  container=c3, help="all: the whole matrix; W_Q,W_K: the W_Q rows × W_K columns block")

with st.spinner("Computing the Hessian…"), hva.guard("the Hessian"):
    H = hva.cache.term(view.key, term)
    norms = hva.cache.block_norms(view.key, term, kind)
offsets = hva.cache.offsets(view.key)

left, right = st.columns([3, 2], gap="medium")
with left:
    fig = plots.hessian_heatmap(H, offsets, title=f"{term} Hessian, P = {view.num_params:,}")
    hva.chart(fig, f"hessian_{term}", npz=lambda: {"H": H, "names": list(names),
                                                   "sizes": [offsets[n].stop - offsets[n].start
                                                             for n in names]})
with right:
    nfig = plots.block_norm_matrix(norms, names, kind=kind, title=f"Block norms of {term}")
    hva.chart(nfig, f"block_norms_{term}_{kind}",
              csv=lambda: {"row": [a for a in names for _ in names], "col": [b for _ in names for b in names],
                           "norm": norms.ravel()})
    st.markdown(f"The largest block is **{names[norms.argmax() // len(names)]} × "
                f"{names[norms.argmax() % len(names)]}**; the smallest "
                f"{KINDS[kind].split()[0]} norm is {norms.min():.2g} and the largest {norms.max():.2g}.")

if pair != "all":
    a, b = pair.split(",")
    B = H[offsets[a], offsets[b]]
    shapes = view.cfg.param_shapes
    bfig = plots.block_heatmap(B, a, b, row_shape=shapes[a], col_shape=shapes[b],
                               title=f"{term} block {a} × {b} ({B.shape[0]} × {B.shape[1]})")
    hva.chart(bfig, f"block_{term}_{a}_{b}", npz=lambda: {"block": B})
    st.caption(f"Row *i* of this block is entry (i // {shapes[a][1]}, i mod {shapes[a][1]}) of {a} "
               f"(row-major vec); hover shows which.")
