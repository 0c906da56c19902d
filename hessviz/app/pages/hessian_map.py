"""Hessian map: the full, outer or functional Hessian as a heatmap, block by block."""

import numpy as np
import streamlit as st

from hessviz import app as hva
from hessviz import plots
from hessviz.block.config import HEADED
from hessviz.block.terms import NAMES

TERMS = NAMES  # full, outer, functional (hessviz.block.terms)
KINDS = {"spectral": "spectral ‖·‖₂", "fro": "Frobenius ‖·‖_F"}  # URL value -> words

view = hva.page(
    "Hessian map",
    "Each pixel is one second derivative of the loss: row *a* and column *b* are two weights "
    "of the block, in the order the forward pass uses them, and the colour is how the slope in *a* changes "
    "when *b* moves. Red is positive, blue negative, white zero; the colour scale is logarithmic on "
    "both sides of zero so that small entries stay visible. The Gauss–Newton split writes the "
    "Hessian as an **outer** part (always positive semi-definite) plus a **functional** part (the "
    "curvature of the network itself, weighted by the loss gradient).",
    r"H = \frac{\partial^2 \ell}{\partial\theta^2}"
    r"= \underbrace{J^\top \big(\nabla_Z^2 \ell\big)\, J}_{\text{outer}}"
    r"+ \underbrace{\textstyle\sum_i \frac{\partial \ell}{\partial Z_i}\,"
    r"\nabla_\theta^2 Z_i}_{\text{functional}},"
    r"\qquad J = \frac{\partial\, \mathrm{vec}_r Z}{\partial \theta}",
    stacks=True,
)
hva.afford(view, "map")

cfg = view.cfg
names = cfg.param_names
headed = [n for n in names if n.rpartition(".")[2] in HEADED] if cfg.n_heads > 1 else []
slices = [s for n in headed for s in cfg.head_names(n)]
pairs = ["all"] + [f"{a},{b}" for group in (names, slices) for i, a in enumerate(group) for b in group[i:]]
c1, c2, c3 = st.columns([2, 2, 3])
term = hva.choice("Term", TERMS, key="term", default="full", container=c1, help="full = outer + functional")
kind = hva.choice(
    "Block norm",
    tuple(KINDS),
    key="bnorm",
    default="spectral",
    container=c2,
    help="spectral: the largest singular value of the block; fro: root of the sum of squares",
)
pair = hva.select(
    "Zoom into a block pair (rows,cols) at full resolution",
    pairs,
    key="blk",
    default="all",
    container=c3,
    help="all: the whole matrix; W_Q,W_K: the W_Q rows × W_K columns block"
    + ("; W_Q[0],W_K[0]: one head's slices (type to search)" if slices else ""),
)

with st.spinner("Computing the Hessian…"), hva.guard("the Hessian"):
    H = hva.cache.term(view.key, term)
    norms = hva.cache.block_norms(view.key, term, kind)
offsets = hva.cache.offsets(view.key)
heads = {n: [cfg.head_indices(s).numpy() for s in cfg.head_names(n)] for n in headed}


def positions(name: str) -> np.ndarray:
    """Rows of ``name`` (a weight or a head slice such as ``W_Q[1]``) in θ."""
    base = name.partition("[")[0]
    return offsets[base].start + cfg.head_indices(name).numpy()


left, right = st.columns([3, 2], gap="medium")
with left:
    fig = plots.hessian_heatmap(H, offsets, heads=heads, title=f"{term} Hessian, P = {view.num_params:,}")
    hva.chart(
        fig,
        f"hessian_{term}",
        npz=lambda: {
            "H": H,
            "names": list(names),
            "sizes": [offsets[n].stop - offsets[n].start for n in names],
        },
    )
with right:
    nfig = plots.block_norm_matrix(norms, names, kind=kind, title=f"Block norms of {term}")
    hva.chart(
        nfig,
        f"block_norms_{term}_{kind}",
        csv=lambda: hva.block_columns(norms, names, "norm"),
    )
    st.markdown(
        f"The largest block is **{names[norms.argmax() // len(names)]} × "
        f"{names[norms.argmax() % len(names)]}**; the smallest "
        f"{KINDS[kind].split()[0]} norm is {norms.min():.2g} and the largest {norms.max():.2g}."
    )

if headed:
    st.caption(
        f"With {cfg.n_heads} heads, the rows and columns of {', '.join(headed)} are drawn head "
        f"by head ({headed[0]}[0], then {headed[0]}[1], …; dotted lines between heads, solid between "
        "weights); inside a head, the slice's row-major vec. The NPZ keeps θ order."
    )
if cfg.kv_heads != cfg.n_heads:
    readers = [", ".join(map(str, cfg.query_heads(g))) for g in range(cfg.kv_heads)]
    shared_by = "; ".join(f"W_K[{g}], W_V[{g}] by query heads {r}" for g, r in enumerate(readers))
    st.caption(
        f"Grouped-query attention: {cfg.n_heads} query heads read {cfg.kv_heads} key/value heads, "
        f"so each W_K[g] block collects the curvature of {cfg.kv_group} query heads ({shared_by})."
    )

if pair != "all":
    a, b = pair.split(",")
    ia, ib = positions(a), positions(b)
    B = H[offsets[a], offsets[b]] if a in offsets and b in offsets else H[np.ix_(ia, ib)]
    shapes = cfg.param_shapes
    ra, rb = (a.partition("[")[0], b.partition("[")[0])
    bfig = plots.block_heatmap(
        B,
        a,
        b,
        row_shape=shapes[ra],
        col_shape=shapes[rb],
        row_index=None if a == ra else cfg.head_indices(a).numpy(),
        col_index=None if b == rb else cfg.head_indices(b).numpy(),
        title=f"{term} block {a} × {b} ({B.shape[0]} × {B.shape[1]})",
    )
    hva.chart(
        bfig,
        f"block_{term}_{a}_{b}".replace("[", "").replace("]", ""),
        npz=lambda: {"block": B, "rows_in_theta": ia, "cols_in_theta": ib},
    )

    def where(name: str) -> str:
        shape = shapes[name.partition("[")[0]]
        if len(shape) == 1:
            return f"row *i* of {name} is entry i of the vector {name.partition('[')[0]}"
        return (
            f"row *i* of {name} is an entry of {name.partition('[')[0]} ({shape[0]} × {shape[1]}, "
            "row-major vec" + (", this head's columns or rows only" if "[" in name else "") + ")"
        )

    st.caption(f"In this block, {where(a)}; columns likewise for {b}. Hover names the entry.")
