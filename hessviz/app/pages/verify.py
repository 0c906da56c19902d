"""Verify & speed: the closed form against autograd, block by block, and both timings."""

import streamlit as st

from hessviz import app as hva
from hessviz import plots

view = hva.page(
    "Verify & speed",
    "hessviz computes the Hessian from explicit derivative formulas of each piece of the block "
    "(softmax, LayerNorm, the activation, the bilinear attention score, the residual sums), "
    "composed with the second-order chain rule. Here the same Hessian is computed a second, "
    "independent way: by automatic differentiation (torch.func). For every block pair and every "
    "term the page shows the relative difference of the two results; values near 10⁻¹⁵ are "
    "floating-point round-off, so the two agree to machine precision. A block whose curvature "
    "cancels to zero (in a Post-LN block of width d = 2 every token is normalised to ±1, so no "
    "weight moves the output) holds only round-off in both methods: its difference is measured "
    "against its rounding scale s, the size of the numbers it is computed from (the closed form "
    "once more in float32: its departure from float64 over float32's round-off ε₃₂). The bars time "
    "both methods for all three terms.",
    r"\text{rel. error}_{ab} = \frac{\|H^{\text{closed}}_{ab} - H^{\text{autograd}}_{ab}\|_F}"
    r"{\max(\|H^{\text{autograd}}_{ab}\|_F,\ s_{ab})},\qquad "
    r"s_{ab} = \frac{\|H^{\text{float32}}_{ab} - H_{ab}\|_F}{\varepsilon_{32}},\qquad "
    r"\text{speed-up} = \frac{t_{\text{autograd}}}{t_{\text{closed}}}",
)
hva.afford(view, "verify", repeats=hva.cache.LIMITS.timing_repeats)
if st.button("Time again", icon=":material/timer:", help="measure both methods afresh"):
    st.session_state["verify_nonce"] = st.session_state.get("verify_nonce", 0) + 1
with st.spinner("Computing the Hessian twice (closed form and autograd)…"), hva.guard("the comparison"):
    out = hva.cache.verify(view.key, st.session_state.get("verify_nonce", 0))

names, rel, times = out["names"], out["rel_err"], out["times"]
worst, speedup = out["worst"], out["speedup"]
c1, c2, c3, c4 = st.columns(4)
c1.metric("worst relative error", f"{worst:.1e}")
c2.metric("closed form", f"{times['closed_form'] * 1e3:.0f} ms")
c3.metric("autograd", f"{times['autograd'] * 1e3:.0f} ms")
c4.metric("speed-up", f"{speedup:.1f}×")
if out["agrees"]:
    st.success(
        f"Closed form and autograd agree on every block of every term (worst relative error "
        f"{worst:.1e}, float64).",
        icon=":material/verified:",
    )
else:
    st.error(
        f"The two methods differ by up to {worst:.1e} (relative): please report this view "
        f"({view.describe()}).",
        icon=":material/error:",
    )

efig = plots.error_matrix(rel, names, wide=hva.controls.lesson().present)  # 300 px panels on a projector
hva.chart(
    efig,
    "verify_relative_error",
    csv=lambda: hva.block_columns(rel, names, "relative_error"),
)
tfig = plots.timing_bars(
    times,
    title=f"Time for all three terms: closed form is {speedup:.1f}× {'faster' if speedup >= 1 else 'slower'}",
)
hva.chart(tfig, "verify_timing", csv=lambda: {"method": list(times), "seconds": list(times.values())})
runs = hva.cache.LIMITS.timing_repeats
st.caption(
    f"{f'Best of {runs} runs' if runs > 1 else 'One run'} each, on {hva.device_label()}, "
    f"P = {view.num_params:,}. The first visit of a view also pays one-off costs; press *Time again* "
    "for a fresh measurement."
)
