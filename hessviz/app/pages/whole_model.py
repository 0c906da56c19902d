"""Whole model: the per-tensor table of a whole pretrained model under its own objective: per layer and
weight (and per head of one weight) the top eigenvalue and trace of its diagonal Hessian block and its
gradient norm, products through every layer, the final norm and the head."""

import numpy as np
import streamlit as st

import hessviz as hv
from hessviz import app as hva
from hessviz import plots, pretrained
from hessviz.app import budget, stored_tables
from hessviz.app import whole_model as wm
from hessviz.runtime.memory import format_bytes

OWN_TEXT = "real_model?rm_model={model}&rm_loss=next+token"
"""The Real model page on a stored-table model's last layer under its next-token loss, where a typed text
is computed (the whole model's table on a new text is hours of one core)."""
STAT_LABELS = {"top": "λ_max(H[t, t])", "trace": "tr H[t, t]", "grad_norm": "‖∂ℓ/∂t‖_F"}

hva.link_only()
hva.header("Whole model")
hva.explain(
    "A whole **pretrained** model under **its own objective**, not one layer against a synthetic target: "
    "the text goes through the embeddings, every layer, the final norm and the head, and each weight "
    "tensor t of every layer gets the top eigenvalue and the trace of its diagonal Hessian block "
    "H[t, t] and its gradient norm, the per-tensor table of Tomihari & Sato's gradient-heterogeneity "
    "study. Every number comes from closed-form Hessian-vector products through the whole model "
    "(Lanczos for the top eigenvalue, Hutch++ for the trace, exact for small blocks); no P × P matrix "
    "is formed.",
)

models = [m for m in wm.MODELS + wm.LARGE_MODELS if m in pretrained.available_models()]
if not models:
    st.error("No bundled pydoc model is installed here (hessviz/data/models).", icon=":material/block:")
    st.stop()
c1, c2 = st.columns([2, 3])
model = hva.select(
    "Model",
    models,
    key="wm_model",
    default=models[0],
    container=c1,
    help="the small models trained here on Python's help text (4 layers, d = 128), and two real LLMs "
    "from their GGUF files: SmolLM2-135M (Pre-RMSNorm, 30 layers, d = 576) and Gemma 3 270M (Peri-RMSNorm, "
    "18 layers, d = 640)",
)
with st.spinner("Reading the model's configuration and tokenizer…"), hva.guard("the model"):
    info = pretrained.model_info(model)
c1.caption(info.describe())
stored = None
if model in stored_tables.MODELS:  # its table is read from assets/, never computed here
    try:
        stored = stored_tables.load(model)
    except hv.HessvizError as err:
        st.error(
            f"**The stored table of {info.name} cannot be read.** {hva.plain(err)}", icon=":material/block:"
        )
        st.stop()
    c2.caption(
        f"Text (fixed: the table is precomputed): the first {stored['tokens']} tokens of "
        f"“{stored['text'].split('. ')[0]}.”"
    )
else:
    text = hva.text(
        "Text",
        "wm_text",
        wm.DEFAULT_TEXT,
        wm.MAX_CHARS,
        container=c2,
        help=f"at most {wm.MAX_CHARS} characters and the model's {info.max_positions} positions; "
        "tokenised with the model's own tokenizer",
    )
    try:
        ids = pretrained.token_ids(model, text)
    except hv.HessvizError as err:  # too many tokens for the model's positions, a text it cannot read
        st.error(f"**The text does not fit {info.name}.** {hva.plain(err)}", icon=":material/block:")
        st.stop()
    least = 2
    if not least <= len(ids) <= info.max_positions:
        n = len(ids)
        st.error(
            f"**The text is {n} token{'s' * (n != 1)} long**; {info.name} reads {least} to "
            f"{info.max_positions} tokens. {'Lengthen' if n < least else 'Shorten'} the text and the "
            "table is drawn.",
            icon=":material/block:",
        )
        st.stop()

c3, c4 = st.columns([3, 2])
stat_name = hva.choice(
    "Show",
    tuple(wm.STATS),
    key="wm_stat",
    default="top eigenvalue",
    container=c3,
    help="top eigenvalue and trace of each tensor's diagonal Hessian block, or the norm of its gradient",
)
stat = wm.STATS[stat_name]
weights = wm.headed(info.block)
weight = hva.select(
    "Heads of",
    weights,
    key="wm_w",
    default=weights[0],
    container=c4,
    help="the per-head chart below splits this weight of every layer into its heads",
)


def gqa_words(block) -> str:
    """How the key/value heads are shared, in words (nothing for one key/value head per query head)."""
    share = block.n_heads // (block.n_kv_heads or block.n_heads)
    return f" Grouped-query attention: a key/value head is shared by {share} query heads." * (share > 1)


def bars(t: dict, title: str):
    cats, groups = wm.by_layer(t["names"], t[stat])
    values = np.asarray(t[stat], dtype=float)
    return plots.grouped_bars(
        [plots.pretty(c) for c in cats],
        groups,
        title=title,
        ylabel=STAT_LABELS[stat],
        logy=bool(np.all(values > 0) and values.max() > 30 * values.min()),
    )


if stored is not None:
    stack = wm.stack_config(info)
    st.info(
        f"**Precomputed, not live** (a table of every weight of {info.n_layers} layers is most of an hour "
        "of two cores): " + stored_tables.describe(stored, info.n_layers),
        icon=":material/functions:",
    )
    st.markdown(
        f"**On your own text:** the Real model page computes {info.name}'s last layer on any short text "
        "under this same next-token loss, on every server: its gradient per block, a window of its exact "
        f"Hessian and its per-block curvature ([open it]({OWN_TEXT.format(model=model)}))."
    )
    st.subheader("Every weight of every layer")
    table = stored_tables.part(stored, stack, stored_tables.WEIGHTS)
    if stat == "trace":
        st.caption("The stored run computed no traces: choose the top eigenvalue or the gradient norm.")
    else:
        hva.chart(
            bars(table, f"{info.name}: {stat_name} per weight"),
            f"whole_{model}_{stat}",
            csv=lambda: {k: table[k] for k in ("names", "size", "top", "grad_norm")},
        )
        missing = len(table["names"]) - table["reached"]
        st.caption(
            f"{table['reached']} of {len(table['names'])} weights have a top eigenvalue "
            f"({table['matvecs']:,} products, {table['seconds']:.0f} s of the run)"
            + (
                f"; {missing} bars are missing (the run's time budget), every gradient norm is there."
                if missing
                else "."
            )
        )
    st.subheader(f"Every head of {weight}")
    heads = stored_tables.part(stored, stack, weight)
    if stat != "trace":
        hva.chart(
            bars(heads, f"{info.name}: {stat_name} per head of {weight}"),
            f"whole_{model}_{weight}_{stat}",
            csv=lambda: {k: heads[k] for k in ("names", "size", "top", "grad_norm")},
        )
        st.caption(
            f"Each bar is one head's slice of {weight} in one layer ({heads['reached']} of "
            f"{len(heads['names'])} with a top eigenvalue)." + gqa_words(stack.block)
        )
    st.stop()


def afford(part: str, names: tuple[str, ...]) -> float | None:
    """The estimated seconds of a table not at hand, or None (with a line saying why and what to change)
    when this server cannot afford it: the page then draws the other part if that one fits (the
    per-head table of one weight is the cheaper, about a third of every weight's)."""
    if hva.real_cache.whole_ready(model, text, part):
        return 0.0
    c = wm.table_cost(stack, names, len(ids))
    advice = wm.over_budget_advice(hva.cache.LIMITS.profile)
    verdict = budget.check(c, hva.cache.LIMITS, advice=advice)
    if not verdict.ok:
        st.warning(f"**Too much for this server.** {verdict.message}", icon=":material/speed:")
        return None
    st.caption(f"Estimated work: about {c.seconds:.2g} s and {format_bytes(c.bytes)}.")
    hva.long_note(c)
    return c.seconds


def objective_line(t: dict) -> None:
    st.info(
        f"**Objective:** {t['objective']}. {t['tokens']} tokens, ℓ = {t['value']:.4g}; "
        f"{len(t['names'])} tensors, P = {sum(t['size']):,} weights.",
        icon=":material/functions:",
    )


stack = wm.stack_config(info)  # every layer as one stack (no weights read)

# ----------------------------------------------------------------------------- every weight
st.subheader("Every weight of every layer")
names = wm.tensors(stack, wm.WEIGHTS)
seconds, table = afford(wm.WEIGHTS, names), None
if seconds is not None:
    with st.spinner("Computing the table of every weight…"), hva.guard("the whole-model table"):
        table = hva.real_cache.whole_table(model, text, wm.WEIGHTS, seconds)
    objective_line(table)
    wfig = bars(table, f"{info.name}: {stat_name} per weight")
    hva.chart(
        wfig,
        f"whole_{model}_{stat}",
        csv=lambda: {
            k: table[k] for k in ("names", "size", "top", "trace", "trace_se", "grad_norm", "exact")
        },
    )
    exact = wm.exact_count(table)
    st.caption(
        f"One bar per layer and weight ({table['matvecs']:,} products"
        + (f", {table['seconds']:.2g} s" if table["seconds"] else "")
        + f"). {exact} small blocks "
        "(≤ 256 entries: the norms' γ and β, the biases) are exact; the others' top eigenvalue is "
        "Lanczos's and their trace a Hutch++ estimate from "
        f"{wm.SAMPLES} products. A log axis when every value is positive and they span more than 30×."
    )

# ----------------------------------------------------------------------------- every head of one weight
st.subheader(f"Every head of {weight}")
hnames = wm.tensors(stack, weight)
seconds = afford(weight, hnames)
if seconds is None:
    st.stop()
with st.spinner(f"Computing the table of every head of {weight}…"), hva.guard("the per-head table"):
    heads = hva.real_cache.whole_table(model, text, weight, seconds)
if table is None:  # every weight's table is over this server's budget: the objective is said here
    objective_line(heads)
hfig = bars(heads, f"{info.name}: {stat_name} per head of {weight}")
hva.chart(
    hfig,
    f"whole_{model}_{weight}_{stat}",
    csv=lambda: {k: heads[k] for k in ("names", "size", "top", "trace", "trace_se", "grad_norm", "exact")},
)
values = np.asarray(heads[stat], dtype=float)
at = int(np.argmax(values))
st.caption(
    f"Each bar is one head's slice of {weight} in one layer. The largest {stat_name}: "
    f"**{heads['names'][at]}** ({values[at]:.3g}); the smallest {values.min():.3g}."
    + (
        " Grouped-query attention: a key/value head is shared by several query heads."
        if info.block.kv_heads != info.block.n_heads and weight in ("W_K", "W_V")
        else ""
    )
)
