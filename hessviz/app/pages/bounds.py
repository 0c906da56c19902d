"""Spectral bounds: Petrov et al.'s self-attention and LayerNorm bounds against the exact norms."""

import numpy as np
import pandas as pd
import streamlit as st

from hessviz import app as hva
from hessviz import plots
from hessviz.experiments import bounds
from hessviz.experiments.common import violations

view = hva.page(
    "Spectral-norm bounds",
    "Petrov et al. bound the spectral norm of the self-attention Hessian by three times the largest of four "
    "block terms (each an outer plus a functional part), in the norms of X, the weights and the target. "
    "The paper prints the constants twice: the main-text theorem (8, 4, …) and the end of its proof (2, 2, "
    "…). "
    "Both use ‖∂A/∂T‖₂ ≤ 1/L, true only for uniform attention; our *corrected* version replaces that 1/L by "
    "the measured s = max_t ‖diag(a_t) − a_t a_tᵀ‖₂ (≤ 1/2). The attention view uses the sidebar's L, d, "
    "d_k, "
    "‖X‖₂ and seed with the attention-only block.",
    r"\|H\|_2\le M=3\max\big(b_{VV},b_{QQ},b_{VQ},b_{QK}\big),\qquad "
    r"b_{QQ}^{\text{outer}}=\frac{2}{L^3 d\, d_k}\|W_K\|_2^2\|W_V\|_2^2\|X\|_2^6"
    r"\ \to\ \frac{2s^2}{L\, d\, d_k}\|W_K\|_2^2\|W_V\|_2^2\|X\|_2^6",
)

c1, c2 = st.columns(2)
mode = hva.choice("View", ("attention", "layernorm"), key="bd_view", default="attention", container=c1)
n_cases = hva.slider(
    "Random configurations",
    10,
    300,
    key="bd_cases",
    default=40,
    container=c2,
    help="how many random configurations the scatter plot draws",
)


if mode == "attention":
    att_view = view.with_values(norm="attention")
    hva.afford(
        att_view,
        "bounds",
        cases=n_cases,
        advice="Lower d, d_k or L (the attention block has P = 3·d·d_k weights), or draw fewer "
        "random configurations.",
    )
    with hva.guard("the attention bounds"):
        row = hva.cache.bounds_here(att_view.key)
    blocks = ("VV", "QQ", "VQ", "QK", "KK", "VK")
    table = pd.DataFrame(
        {
            "block": [*blocks, "whole (M)"],
            "exact ‖·‖₂": [row[f"true_{b}"] for b in blocks] + [row["true_total"]],
            **{
                f"{ver} bound": [row[f"{ver}_{b}"] for b in blocks] + [row[f"M_{ver}"]]
                for ver in bounds.VERSIONS
            },
        }
    )
    for ver in bounds.VERSIONS:
        table[f"{ver} / exact"] = table[f"{ver} bound"] / table["exact ‖·‖₂"]
    st.subheader(
        f"This configuration ({att_view.cfg.describe(att_view.input_norm)}, s·L = "
        f"{row['s'] * att_view.cfg.seq_len:.2f})"
    )
    st.dataframe(
        table,
        hide_index=True,
        column_config={
            c: st.column_config.NumberColumn(format="%.3e") for c in table.columns if c != "block"
        },
    )
    st.caption(
        "KK and VK are not bounded in the paper; they are checked against the QQ and VQ terms with "
        "W_Q and W_K exchanged. A ratio below 1 is a violation."
    )
    with hva.guard("the random study"), st.spinner("Evaluating random configurations…"):
        att = hva.cache.bounds_study(n_cases, view.seed)
    fig = plots.scatter_figure(
        {f"M ({ver})": (att["true_total"], att[f"M_{ver}"]) for ver in bounds.VERSIONS},
        title="Bound M vs exact ‖H‖₂ over random configurations",
        xlabel="exact ‖H‖₂",
        ylabel="bound",
        diagonal=True,
    )
    hva.chart(fig, "attention_bounds", npz=lambda: att)
    # the table's convention, bound / exact: a ratio below the line at 1 is a violation
    qq = {ver: att[f"{ver}_QQ_outer"] / att["true_QQ_outer"] for ver in bounds.VERSIONS}
    fig2 = plots.scatter_figure(
        {ver: (att["s"] * att["L"], qq[ver]) for ver in bounds.VERSIONS},
        title="QQ outer: bound / exact vs s·L (uniform attention: s·L = 1)",
        xlabel="s · L",
        ylabel="bound / exact",
        level=(1.0, "bound = exact (below: violated)"),
    )
    hva.chart(
        fig2,
        "qq_outer_ratio",
        csv=lambda: {"sL": att["s"] * att["L"], **{f"bound_over_exact_{v}": r for v, r in qq.items()}},
    )
else:
    with hva.guard("the LayerNorm study"), st.spinner("Evaluating random LayerNorm inputs…"):
        ln = hva.cache.ln_bounds_study(n_cases, view.seed)
    counts = pd.DataFrame(
        {
            "σ_min read as": ["row standard deviation (the proof)", "centred row norm (the Lemma's wording)"],
            "Jacobian violations": [
                violations(ln["J"], ln["J_bound_std"]),
                violations(ln["J"], ln["J_bound_rownorm"]),
            ],
            "Hessian violations": [
                violations(ln["H"], ln["H_bound_std"]),
                violations(ln["H"], ln["H_bound_rownorm"]),
            ],
            "cases": [ln["J"].size] * 2,
        }
    )
    st.dataframe(counts, hide_index=True)
    pos = ln["H"] > 0
    fig = plots.scatter_figure(
        {
            "Jacobian, σ = row std": (ln["J"][pos], ln["J_bound_std"][pos]),
            "Hessian, σ = row std": (ln["H"][pos], ln["H_bound_std"][pos]),
            "Jacobian, σ = row norm": (ln["J"][pos], ln["J_bound_rownorm"][pos]),
            "Hessian, σ = row norm": (ln["H"][pos], ln["H_bound_rownorm"][pos]),
        },
        title="LayerNorm Lemma: bound vs exact norm (rows of scales 1e-3…10)",
        xlabel="exact",
        ylabel="bound",
        diagonal=True,
    )
    hva.chart(fig, "layernorm_bounds", csv=lambda: {k: np.asarray(v) for k, v in ln.items()})
