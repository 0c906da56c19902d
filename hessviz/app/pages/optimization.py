"""Optimization lens: gradient heterogeneity (Gini, Λ_G, Λ_P) and SGD / SignSGD / Adam, Post vs Pre-LN."""

import json

import numpy as np
import streamlit as st

import hessviz as hv
from hessviz import app as hva
from hessviz import plots
from hessviz.app import budget, stored_tables
from hessviz.experiments import optimizers, optimizers_protocol
from hessviz.resources import data

LEARNING_RATES = (
    ("SGD", "sgd", ("0.3", "1", "3", "10"), "1"),
    ("SignSGD", "sign", ("0.0001", "0.0003", "0.001", "0.003"), "0.001"),
    ("Adam", "adam", ("0.003", "0.01", "0.03", "0.1"), "0.03"),
)
"""The teacher task's optimizers, in the order the training takes their rates: name, URL key
(``opt_lr_…``), the grid offered and its default."""

view = hva.page(
    "Optimization lens",
    "Tomihari & Sato argue that SGD struggles on Transformers because the gradient is very uneven "
    "across parameter blocks (gradient heterogeneity), and blocks with large gradients also have large "
    "curvature. SGD's iteration count is governed by the gradient-weighted curvature Λ_G, a sign-based "
    "method's (SignSGD, Adam) by the size-weighted Λ_P. Post-LN is said to amplify the heterogeneity. "
    "Here Post-LN, Pre-LN and Peri-LN are computed side by side for the sidebar's sizes and seed (the "
    "training runs compare Post-LN and Pre-LN, as the paper does); a block is either "
    "one weight matrix or one output unit (a column of a weight matrix).",
    r"G=\frac{\sum_i\sum_j |x_i-x_j|}{2n^2\bar x},\ x_b=\|g_b\|,\qquad"
    r"\Lambda_G=\frac{\sum_b \|g_b\|^2\|H_{bb}\|_2}{\sum_b\|g_b\|^2},\qquad"
    r"\Lambda_P=\frac{\sum_b P_b\|H_{bb}\|_2}{P}",
)

mode = hva.choice(
    "View",
    ("gradients", "training", "protocol"),
    key="opt_view",
    default="gradients",
    help="gradients: heterogeneity at the sidebar's point; training: SGD / SignSGD / Adam; protocol: the "
    "report's fine-tuning of the bundled models on a real task (the paper's protocol), precomputed",
)
PLACEMENTS = budget.HETEROGENEITY_SIDES
TRAINED = ("post", "pre")
"""The placements the training runs compare (the paper's pair)."""
NAMES = {pl: plots.placement_name(pl) for pl in PLACEMENTS}
CLAIMS = data("claims")


if mode == "gradients":
    part = hva.choice(
        "Blocks",
        ("matrix", "column"),
        key="opt_part",
        default="column",
        help="matrix: the five weight matrices; column: every output unit of every matrix",
    )
    hva.afford(view.with_values(norm="post"), "optimization")
    res = {}
    with hva.guard("the gradient heterogeneity"):
        for pl in PLACEMENTS:
            res[pl] = hva.cache.heterogeneity_of(view.with_values(norm=pl).key, part)
    cols = st.columns(len(PLACEMENTS))
    for c, pl in zip(cols, PLACEMENTS):
        r = res[pl]
        c.subheader(NAMES[pl])
        (m1, m2), (m3, m4) = c.columns(2), c.columns(2)  # two by two: a quarter of a half cut the values
        m1.metric("Gini G", f"{r['gini']:.3f}")
        m2.metric("Λ_G", f"{r['lambda_G']:.3g}")
        m3.metric("Λ_P", f"{r['lambda_P']:.3g}")
        m4.metric("Spearman(‖g‖, ‖H‖)", f"{r['corr']:.2f}" if np.isfinite(r["corr"]) else "–")
    st.caption(
        "Tomihari & Sato report G = 0.941 (Post-LN) vs 0.880 (Pre-LN) for RoBERTa fine-tuning, with "
        "hundreds of blocks; a single small block has far fewer, so compare the ordering, not the "
        "values."
    )
    names = res["post"]["names"]
    fig = plots.grouped_bars(
        names,
        {pl: res[pl]["grad"] for pl in PLACEMENTS},
        title="Per-block gradient norm ‖g_b‖",
        ylabel="‖g_b‖",
        logy=True,
    )
    hva.chart(
        fig,
        "gradient_norms",
        csv=lambda: {"block": names, **{f"grad_{pl}": res[pl]["grad"] for pl in PLACEMENTS}},
    )
    sc = plots.scatter_figure(
        {pl: (res[pl]["grad"], res[pl]["hess"]) for pl in PLACEMENTS},
        title="Gradient norm vs Hessian block norm, per block",
        xlabel="‖g_b‖",
        ylabel="‖H_bb‖₂",
        hover={pl: names for pl in PLACEMENTS},
    )
    hva.chart(
        sc,
        "grad_vs_hess",
        csv=lambda: {
            "block": names,
            **{f"{k}_{pl}": res[pl][k] for pl in PLACEMENTS for k in ("grad", "hess", "sizes")},
        },
    )
elif mode == "protocol":
    npz, committed = CLAIMS / "data" / "optimizers_protocol.npz", CLAIMS / "claims.json"
    if not npz.exists() or not committed.exists():
        st.info(
            "No stored protocol run (`hessviz/data/claims/data/optimizers_protocol.npz`): reinstall hessviz, "
            "or run `hessviz reproduce` for a report of your own."
        )
        st.stop()
    with np.load(npz) as f:
        curves, every = optimizers_protocol.saved_curves(dict(f))
    records = {r["id"]: r for r in json.loads(committed.read_text())}
    gp = records.get("gini_protocol", {}).get("measured", {})
    op = records.get("optimizers_protocol", {}).get("measured", {})
    st.caption(
        "Tomihari & Sato's protocol, precomputed by `hessviz reproduce` (claims `gini_protocol` and "
        "`optimizers_protocol`): every layer weight of a bundled model and a fresh linear head fine-tuned on "
        "which of six standard-library modules a docstring is from (minibatches of 8 × 24 tokens), each "
        "optimizer at its best learning rate from a small grid, mean and band over seeds. Left: that "
        "fine-tuning; right: the report's random-block teacher task (claim `optimizers`) beside it."
    )
    stored = tuple(stored_tables.MODELS)
    source = hva.choice(
        "Model",
        tuple(curves) + stored,
        key="opt_model",
        default=tuple(curves)[0],
        help="the trained pair (Post-LN, Pre-LN) and pydoc-llama, fine-tuned here; "
        + " and ".join(stored)
        + " with their Gini alone, 95 % intervals over batches (hessviz reproduce --smollm2, --gemma3)",
    )
    if source in stored:
        try:
            records = stored_tables.claims(source)
        except hv.HessvizError as err:
            records = {}
            st.error(
                f"**The stored claims of {source} cannot be read.** {hva.plain(err)}", icon=":material/block:"
            )
        rec = records.get(stored_tables.gini_id(source))
        if rec is None:
            st.info(f"No stored Gini for {source} (`{stored_tables.reproduce_command(source)}`).")
            st.stop()
        sm = rec["measured"]
        beside = [k[len("gini_ci_") :] for k in sm if k.startswith("gini_ci_")]
        models = [source] + [m for m in beside if m != source]
        values = [sm[f"gini_{m}"] for m in models]
        half = [(sm[f"gini_ci_{m}"][1] - sm[f"gini_ci_{m}"][0]) / 2 for m in models]
        m1, m2 = st.columns(2)
        lo, hi = sm[f"gini_ci_{source}"]
        m1.metric(
            "Gini of the 22 gradient norms",
            f"{sm[f'gini_{source}']:.3f}",
            help=f"mean over {sm[f'batches_{source}']:.0f} batches of the docstring task; 95 % interval "
            f"[{lo:.3f}, {hi:.3f}]",
        )
        own = records.get("gini_smollm2", {}).get("measured", {}).get(f"gini_own_loss_all_weights_{source}")
        if own is not None:
            m2.metric("Gini under its own next-token loss (270 weights)", f"{own:.3f}")
        hva.chart(
            plots.grouped_bars(
                models,
                {"Gini": values},
                errors={"Gini": half},
                ylabel="Gini",
                title="Gini of the 22 gradient norms, Tomihari & Sato's protocol (95 % intervals)",
            ),
            f"protocol_gini_{source}",
            csv=lambda: {"model": models, "gini": values, "ci_half_width": half},
        )
        st.caption(rec["note"] + " Not fine-tuned here: no training curves for it.")
        st.stop()
    m1, m2, m3 = st.columns(3)
    if f"gini_{source}" in gp:
        m1.metric("Gini of the 22 gradient norms", f"{gp[f'gini_{source}']:.3f}")
    if f"ratio_{source}" in gp:
        m2.metric("Λ_G / Λ_P", f"{gp[f'ratio_{source}']:.3g}")
    if f"log_final_ratio_SGD_over_sign_{source}" in op:
        m3.metric("log(final SGD / best sign-based)", f"{op[f'log_final_ratio_SGD_over_sign_{source}']:+.2f}")
    left, right = st.columns(2)
    runs = curves[source]
    fig = plots.training_curves(
        {f"{o} (lr {op.get(f'lr_{source}_{o}', float('nan')):g})": runs[o] for o in runs},
        title=f"{source}: fine-tuning on the docstring task",
        threshold=op.get(f"threshold_{source}"),
    )
    fig.update_xaxes(title_text=f"evaluation (every {every} steps)")
    hva.chart(fig, f"protocol_{source}", container=left, npz=lambda: runs)
    block = CLAIMS / "data" / "optimizers.npz"
    om = records.get("optimizers", {}).get("measured", {})
    pl = "pre" if source == "pydoc-preln" else "post"
    keys = {o: f"{pl}_{o}_lr{om[f'lr_{pl}_{o}']:g}" for o in optimizers.OPTIMIZERS if f"lr_{pl}_{o}" in om}
    if block.exists() and keys:
        with np.load(block) as f:
            teacher = {f"{o} (lr {om[f'lr_{pl}_{o}']:g})": f[k] for o, k in keys.items() if k in f}
        hva.chart(
            plots.training_curves(
                teacher, title=f"Random-block teacher task, {NAMES[pl]} (claim optimizers)"
            ),
            f"teacher_{pl}",
            container=right,
            npz=lambda: teacher,
        )
else:
    c1, c2, c3 = st.columns(3)
    steps = hva.slider("Steps", 10, 300, key="opt_steps", default=60, container=c1)
    n_seeds = hva.slider("Seeds", 1, 3, key="opt_seeds", default=1, container=c2)
    lrs = tuple(
        float(
            hva.select(f"{name} learning rate", grid, key=f"opt_lr_{key}", default=default, container=where)
        )
        for (name, key, grid, default), where in zip(LEARNING_RATES, (c3, *st.columns(2)))
    )
    st.caption(
        "Teacher–student regression: the block (sidebar sizes, ReLU, MSE) learns the outputs of the same "
        "block with other random weights on two random sequences; full-batch steps. The report "
        "(`hessviz reproduce`) picks each learning rate from a grid."
    )
    seeds = tuple(range(view.seed, view.seed + n_seeds))
    c = view.cfg
    hva.afford(view.with_values(norm="post"), "optimization", steps=steps, seeds=n_seeds)
    with hva.guard("the training runs"):
        tr = hva.cache.training(c.seq_len, c.d_model, c.d_k, c.d_ff, seeds, steps, lrs)
    cols = st.columns(len(TRAINED))
    for col, pl in zip(cols, TRAINED):
        summary = optimizers.runs_summary(tr[pl])
        fig = plots.training_curves(
            {o: tr[pl][o] for o in optimizers.OPTIMIZERS},
            title=f"{NAMES[pl]} (Gini at init {summary['gini']:.3f})",
        )
        hva.chart(
            fig,
            f"training_{pl}",
            container=col,
            npz=lambda pl=pl: {o: tr[pl][o] for o in optimizers.OPTIMIZERS},
        )
        col.caption(" · ".join(f"{o}: final {summary['final'][o]:.2e}" for o in optimizers.OPTIMIZERS))
