"""Heterogeneity: the top eigenvalue and the trace of every diagonal Hessian block, per weight
and per head, from closed-form Hessian-vector products (works past the dense limit)."""

import numpy as np
import streamlit as st

import hessviz as hv
from hessviz import app as hva
from hessviz import plots, pretrained
from hessviz.app import stored_tables
from hessviz.app import whole_model as wm
from hessviz.block.terms import NAMES
from hessviz.matfree.estimates import block_spread
from hessviz.matfree.spectral import EXACT_BLOCK
from hessviz.runtime.memory import format_bytes

TERMS = NAMES  # full, outer, functional (hessviz.block.terms)
BY = {"heads": "every head", "weights": "every weight"}

view = hva.sidebar()
top = hva.header("Heterogeneity")  # the caption: the sidebar's block, or the stored model's (below)
hva.explain(
    "How different is the curvature of the blocks of a Transformer? Take the diagonal block "
    "H[b, b] of one weight (or one attention head's slice of it): its largest eigenvalue is the "
    "sharpest direction inside that block, its trace the total curvature. In Transformers these "
    "numbers differ across blocks by orders of magnitude (Zhang et al. 2024, *Why Transformers need "
    "Adam: a Hessian perspective*), which is why one learning rate for all blocks (SGD) fits them "
    "badly and per-block or per-coordinate step sizes (Adam) fit them well. Small blocks are computed "
    "exactly (the dense block from products, then its eigenvalues); larger ones by Lanczos (top "
    "eigenvalue) and Hutch++ (trace, ± standard error). No P × P matrix is formed.",
    r"\lambda_{\max}\big(H_{bb}\big),\qquad \operatorname{tr} H_{bb},\qquad "
    r"H_{bb} = \frac{\partial^2 \ell}{\partial \theta_b^2},\qquad "
    r"\text{spread} = \frac{\max_b \lambda_{\max}(H_{bb})}{\min_b \lambda_{\max}(H_{bb})}",
)
SIDEBAR = "sidebar block"
sources = (SIDEBAR,) + tuple(m for m in stored_tables.MODELS if m in pretrained.available_models())
source = hva.choice(
    "Model",
    sources,
    key="het_model",
    default=SIDEBAR,
    help="the block of the sidebar (computed here), or a real LLM's table, precomputed on a "
    "fixed text under its own next-token loss (python -m hessviz.experiments.llm_table)",
)
if source != SIDEBAR:
    try:
        info = pretrained.model_info(source)
        stored = stored_tables.load(source)
        records = stored_tables.claims(source)
    except hv.HessvizError as err:
        st.error(
            f"**The stored table of {source} cannot be read.** {hva.plain(err)}", icon=":material/block:"
        )
        st.stop()
    stack = wm.stack_config(info)
    top.caption(info.describe())
    st.caption(f"Precomputed, not live: {stored_tables.describe(stored, info.n_layers)}")
    by = hva.choice(
        "Blocks",
        ("heads", "weights"),
        key="het_by",
        default="heads",
        help="heads: each head's slice of W_Q, W_K, W_V, W_O in the layers the run reached; "
        "weights: every weight of the layers it reached",
    )
    parts = (
        [stored_tables.part(stored, stack, w) for w in ("W_Q", "W_K", "W_V", "W_O")]
        if by == "heads"
        else [stored_tables.part(stored, stack, stored_tables.WEIGHTS)]
    )
    names = [n for p in parts for n, t in zip(p["names"], p["top"]) if np.isfinite(t)]
    top = np.array([t for p in parts for t in p["top"] if np.isfinite(t)])
    if not names:
        st.info(f"The stored run reached no {by} of {source} (its time budget): choose the other blocks.")
        st.stop()
    spread = block_spread(names, top)
    m1, m2, m3 = st.columns(3)
    m1.metric("blocks with λ_max", f"{len(names)}")
    m2.metric("spread of λ_max", f"{spread.spread:.3g}×" if np.isfinite(spread.spread) else "—")
    m3.metric("sharpest", spread.sharpest or "—")
    by_layer = {}
    for n, t in zip(names, top):
        layer, _, rest = n.partition(".")
        by_layer.setdefault(layer, ([], []))
        by_layer[layer][0].append(rest)
        by_layer[layer][1].append(t)
    layers = sorted(by_layer, key=lambda x: int(x[1:]))
    pick = hva.select("Layer", layers, key="het_layer", default=layers[0], help="the layers the run reached")
    fig = plots.grouped_bars(
        [plots.pretty(n) for n in by_layer[pick][0]],
        {"λ_max": by_layer[pick][1]},
        title=f"{source}, layer {pick[1:]}: top eigenvalue per block",
        ylabel="λ_max(H[b, b])",
        logy=True,
    )
    hva.chart(
        fig,
        f"heterogeneity_{source}_{by}_{pick}",
        csv=lambda: {"block": by_layer[pick][0], "top_eigenvalue": by_layer[pick][1]},
    )
    so = records.get("sharpness_ordering", {}).get("measured", {})
    models = list(dict.fromkeys(k.rsplit("_", 1)[-1] for k in so if k.startswith("S_")))
    if models:
        types = ["Emb", "QK", "FFN", "VO", "Norm"]
        groups = {mo: [so.get(f"S_{t}_{mo}", float("nan")) for t in types] for mo in models}
        title = "Sharpness per block type (Wang et al.: Emb ≪ QK < FFN < VO ≪ Norm)"
        hva.chart(
            plots.grouped_bars(types, groups, ylabel="mean λ_max", logy=True, title=title),
            "sharpness_ordering",
            csv=lambda: {"type": types, **groups},
        )
        st.caption(records["sharpness_ordering"]["note"])
    metrics = records.get(stored_tables.sharpness_id(source))
    if metrics:
        types = ["Emb", "QK", "FFN", "VO", "Norm"]
        m = metrics["measured"]
        drawn = [k for k in ("gnb", "outer", "full", "top") if f"S_QK_{k}" in m]
        label = {"gnb": "paper's GNB", "outer": "exact outer", "full": "exact full", "top": "top λ (table)"}
        groups = {label[k]: [m.get(f"S_{t}_{k}", float("nan")) for t in types] for k in drawn}
        errors = {label[k]: [m.get(f"S_{t}_{k}_stderr", 0.0) for t in types] for k in drawn}
        hva.chart(
            plots.grouped_bars(
                types,
                groups,
                errors=errors,
                ylabel="S(type)",
                logy=True,
                title=f"{source}: Wang et al.'s sharpness per block type under {len(drawn)} metrics",
            ),
            f"sharpness_metrics_{source}",
            csv=lambda: {"type": types, **groups},
        )
        st.caption(
            "The paper's GNB: its estimator of tr(G_TT)/m_T; exact outer, full: the trace over size of each "
            "term from closed-form products (Hutchinson, ± standard error); top λ: the mean top eigenvalue "
            "of the type's blocks in the stored table. Relations of the paper's order holding: "
            + ", ".join(f"{k} {m[f'relations_holding_{k}']:.0f}/4" for k in drawn)
            + f" (claim `{metrics['id']}`, {stored_tables.reproduce_command(source)})."
        )
    st.stop()

top.caption(view.describe())
c1, c2, c3 = st.columns([2, 2, 3])
term = hva.choice(
    "Term", TERMS, key="het_term", default="full", container=c1, help="full = outer + functional"
)
by = hva.choice(
    "Blocks",
    tuple(BY),
    key="het_by",
    default="heads",
    container=c2,
    help="heads: each attention head's slice of W_Q, W_K, W_V, W_O and their biases is its own "
    "block (when there are several heads); weights: one block per weight",
)
samples = hva.slider(
    "Hutch++ products per large block",
    6,
    90,
    key="het_samples",
    default=30,
    container=c3,
    help=f"blocks above {EXACT_BLOCK} entries: trace by Hutch++ from this "
    "many products (its error shrinks like 1/products)",
)
by_head = by == "heads"
if view.cfg.n_heads == 1:
    c2.caption(
        "With one attention head, heads and weights give the same blocks: raise *Attention heads* "
        "in the sidebar to split W_Q, W_K, W_V and W_O by head."
    )
cost = hva.verdict(view, "heterogeneity", samples=samples, by_head=int(by_head)).cost
st.caption(
    f"Estimated work: about {cost.seconds:.2g} s and {format_bytes(cost.bytes)} "
    f"(this server allows {hva.cache.LIMITS.max_seconds:g} s per view)."
)
hva.afford(
    view,
    "heterogeneity",
    samples=samples,
    by_head=int(by_head),
    advice="Choose blocks = weights, fewer Hutch++ products, or lower d, d_ff, heads or L.",
)

with hva.guard("the heterogeneity table"):
    table = hva.cache.block_table(view.key, term, by_head, samples, view.seed)

names, top, trace, se = table["names"], table["top"], table["trace"], table["trace_se"]
spread = block_spread(names, top)
m1, m2, m3 = st.columns(3)
m1.metric(
    "blocks",
    f"{len(names)}",
    help=f"{int(table['exact'].sum())} exact, {int((~table['exact']).sum())} estimated",
)
m2.metric(
    "spread of λ_max",
    f"{spread.spread:.3g}×" if np.isfinite(spread.spread) else "—",
    help="largest over smallest positive top eigenvalue across blocks (blocks flat to round-off left out)",
)
m3.metric("products", f"{table['matvecs']:,}", help=f"Hessian-vector products, {table['seconds']:.2g} s")
if np.isfinite(spread.spread):
    st.markdown(
        f"The sharpest block is **{spread.sharpest}** (λ_max = {spread.largest:.3g}), the flattest "
        f"**{spread.flattest}** (λ_max = {spread.smallest:.3g}): a factor of **{spread.spread:.3g}** "
        "between blocks of one layer."
    )

fig = plots.block_spectrum_bars(
    names,
    top,
    trace,
    trace_errors=se,
    title=f"Per-block curvature of the {term} Hessian, P = {view.num_params:,}",
)


def columns() -> dict:
    return {
        "block": list(names),
        "size": table["size"],
        "top_eigenvalue": top,
        "trace": trace,
        "trace_stderr": se,
        "exact": table["exact"],
    }


hva.chart(fig, f"heterogeneity_{term}_{by}", csv=columns)
st.dataframe(
    {
        "block": list(names),
        "size": table["size"],
        "λ_max": top,
        "trace": trace,
        "± (trace)": se,
        "how": ["exact (dense block)" if e else "Lanczos + Hutch++" for e in table["exact"]],
    },
    hide_index=True,
    width="stretch",
)
st.caption(
    f"Blocks up to {EXACT_BLOCK} entries are exact (their dense block from "
    f"{EXACT_BLOCK} products at most, then eigvalsh). Larger: λ_max by Lanczos (within 1e-6 "
    f"relative by its error bound), trace by Hutch++ with {samples} products, ± one standard "
    "error. "
    f"Seed {view.seed}."
)
