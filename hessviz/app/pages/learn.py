"""Learn: the block's equations, the decomposition, the pages, the papers and a classroom tour."""

import streamlit as st

from hessviz import app as hva
from hessviz import plots
from hessviz.app.registry import ALL_PAGES, spec
from hessviz.app.tour import TOUR

view = hva.sidebar()
hva.header("Learn", view)

tour = st.container(key="hv_tour")  # one block: presentation mode lifts it whole, under the title
tour.markdown("#### Classroom tour")
stops = [str(i) for i in range(1, len(TOUR) + 1)]


STEPPED = "tour_stepped"
"""Set by Back / Next: the run they start brings the live view back on screen (on a phone)."""
SHOW_LIVE = """<script>
setTimeout(() => {
  const live = document.querySelector(".st-key-hv_live");
  if (live && window.matchMedia("(max-width: 640px)").matches) {
    live.style.scrollMarginTop = "64px";
    live.scrollIntoView({block: "start"});
  }
}, 60);
</script>"""
"""On a phone the live view sits above the story, whose Back / Next are under it: after a step
the page would stay where the button was, the new stop's live view off screen above. This puts
the live view's top under Streamlit's header bar (64 px) on a screen 640 px wide or less."""


def go(to: int) -> None:
    st.session_state["tour"] = str(min(max(to, 1), len(TOUR)))
    st.session_state[STEPPED] = True


live, story = tour.columns([3, 2], gap="medium")  # on a phone the live view comes first
with story:
    at = int(
        hva.choice(
            "Stop",
            stops,
            key="tour",
            default="1",
            help="six stops for a 20-minute lesson; each is also a plain link for slides",
        )
    )
    steps = st.container(horizontal=True, gap="small")
    steps.button(
        "Back",
        icon=":material/arrow_back:",
        on_click=go,
        args=(at - 1,),
        disabled=at == 1,
        width="stretch",
        key="tour_back",
    )
    steps.button(
        "Next",
        icon=":material/arrow_forward:",
        on_click=go,
        args=(at + 1,),
        disabled=at == len(TOUR),
        width="stretch",
        key="tour_next",
    )
stop = TOUR[at - 1]
with live, st.container(key="hv_live"):  # the stop's own page, live, without its sidebar
    shown = {}
    if stop.variants:
        label, own = stop.choice
        labels = {own: {}, **{v.label: v.params for v in stop.variants}}
        picked = st.segmented_control(
            label,
            tuple(labels),
            default=own,
            key=f"tour_variant_{at}",
            help="the live view below, with this setting",
        )
        shown = labels.get(picked or own, {})
    st.iframe(
        hva.controls.app_root() + stop.link(**shown, embed="true", hide="sidebar", present="1"), height=560
    )
    if st.session_state.pop(STEPPED, False):
        st.html(SHOW_LIVE, unsafe_allow_javascript=True)
with story, st.container(border=True):
    st.markdown(f"#### {at}. {stop.title}")
    with hva.guard("the numbers of this stop"), st.spinner("Reading the live view's numbers…"):
        words = stop.story()
    st.markdown(f"**What to notice.** {words}")
    p = spec(stop.page)
    st.page_link(
        str(p.path),
        label=f"Open the full page: {p.title}",
        icon=p.icon,
        query_params=hva.address.link_params({**stop.query(), **hva.lesson().query()}),
    )
    st.caption("This stop as a link (for slides):")
    st.code(hva.controls.app_root() + stop.link(), language=None, wrap_lines=True)
    hva.controls.lesson_download(stop.link(), key=f"tour_page_{at}")

with st.expander("Every stop as a link", icon=":material/link:"):
    for i, s in enumerate(TOUR, start=1):
        st.markdown(f"{i}. **{s.title}**: `{hva.controls.app_root() + s.link()}`")

st.markdown(
    "Further down: [the block](#the-block) · [today's blocks](#todays-blocks) · "
    "[the pages](#the-pages) · [papers](#papers)"
)

st.header("The block", anchor="the-block")
st.markdown(
    "A sequence of *L* tokens is a matrix X with one row per token and *d* features. One "
    "block applies single-head self-attention (no biases, no output projection), a LayerNorm "
    "without learnable scale, and a two-layer feed-forward network with ReLU or GELU."
)
st.latex(
    r"\mathrm{SA}(X) = \operatorname{softmax}_{\text{row}}\!\Big(\frac{X W_Q W_K^\top X^\top}"
    r"{\sqrt{d_k}}\Big)\, X W_V, \qquad \mathrm{FFN}(Z) = \varphi(Z W_1)\, W_2"
)
st.latex(
    r"\mathrm{LN}(z) = \frac{z - \operatorname{mean}(z)}{\sqrt{\operatorname{var}(z) + \varepsilon}}"
    r"\quad\text{(row by row)}"
)
st.markdown("Where the LayerNorm sits is the *placement*:")
st.latex(
    r"\begin{array}{ll}"
    r"\text{Post-LN:} & Z_1 = \mathrm{LN}(X + \mathrm{SA}(X)),\ "
    r"Z = \mathrm{LN}(Z_1 + \mathrm{FFN}(Z_1))\\"
    r"\text{Pre-LN:} & Z_1 = X + \mathrm{SA}(\mathrm{LN}(X)),\ "
    r"Z = Z_1 + \mathrm{FFN}(\mathrm{LN}(Z_1))\\"
    r"\text{no LN:} & Z_1 = X + \mathrm{SA}(X),\ Z = Z_1 + \mathrm{FFN}(Z_1)\\"
    r"\text{attention alone:} & Z = \mathrm{SA}(X)\end{array}"
)
st.markdown(
    "The loss compares the output Z with a target: mean squared error, or cross-entropy "
    "with the *d* features as class scores."
)
st.latex(
    r"\ell_{\text{MSE}} = \frac{\|Z - Y\|_F^2}{L\,d},\qquad "
    r"\ell_{\text{CE}} = -\frac1L \sum_t \log \operatorname{softmax}(Z_t)_{y_t}"
)
st.markdown(
    "The weights are stacked into one vector θ = (W_Q, W_K, W_V, W_1, W_2), each matrix "
    "flattened row by row; the Hessian is the P × P matrix of second derivatives. The chain "
    "rule splits it in two: the **outer** (Gauss–Newton) term, made of first derivatives of "
    "the block and the loss's curvature in Z, and the **functional** term, made of the "
    "block's own second derivatives weighted by the loss gradient."
)
st.latex(
    r"H = \underbrace{J^\top\, \nabla^2_Z \ell\; J}_{\text{outer}\ \succeq\ 0}"
    r" + \underbrace{\sum_i \frac{\partial \ell}{\partial Z_i}\,"
    r"\nabla^2_\theta Z_i}_{\text{functional}},"
    r"\qquad J = \frac{\partial\, \mathrm{vec}_r(Z)}{\partial \theta} \in \mathbb{R}^{Ld \times P}"
)
st.markdown(
    "For the block in the sidebar, the spectral norm of each diagonal block in each term "
    "(the full term is not the sum of the two norms: the parts can cancel):"
)
names = view.cfg.param_names
if hva.afford(view, "learn", stop=False):
    with hva.guard("the block norms"):
        norms = {t: hva.cache.block_norms(view.key, t) for t in ("outer", "functional", "full")}
    diag = {t: {n: float(m[i, i]) for i, n in enumerate(names)} for t, m in norms.items()}
    fig = plots.diagonal_norm_bars(diag, title="Diagonal blocks: outer, functional and full")
    hva.chart(
        fig,
        "learn_decomposition",
        csv=lambda: {
            "term": [t for t in diag for _ in names],
            "block": [n for _ in diag for n in names],
            "spectral_norm": [diag[t][n] for t in diag for n in names],
        },
    )
st.markdown(
    "Because both losses are convex in Z, the outer term is positive semi-definite; only the "
    "functional term can make the Hessian indefinite. hessviz computes every block of both "
    "terms from explicit formulas for each component, composed by the chain rule, and checks "
    "them against automatic differentiation (see *Verify & speed*)."
)

st.header("Today's blocks", anchor="todays-blocks")
st.markdown(
    "The papers study the BERT-era block above. The decoders people train now (Llama, Mistral, "
    "Qwen, SmolLM, Pythia) change five of its pieces; hessviz computes every term of their "
    "Hessians in closed form too (the sidebar's *Modern block* group and its presets)."
)
st.markdown(
    "**RMSNorm** drops LayerNorm's centring (and its shift β): each token is only rescaled "
    "to unit root-mean-square. Its Jacobian is LayerNorm's without the projection that removes "
    "the mean, so it keeps the direction 1 that LayerNorm flattens."
)
st.latex(
    r"\mathrm{RMS}(z) = \gamma \odot \frac{z}{\sqrt{\tfrac1d \|z\|^2 + \varepsilon}},\qquad "
    r"\frac{\partial\, \mathrm{RMS}}{\partial z} = \frac{\operatorname{diag}(\gamma)}{\rho}"
    r"\Big(I - \frac{z z^\top}{d\,\rho^2}\Big),\quad \rho = \sqrt{\tfrac1d\|z\|^2 + \varepsilon}"
)
st.markdown(
    "**A gated MLP** (SwiGLU with SiLU, GeGLU with GELU) multiplies an activated gate by a "
    "second linear map. The product makes the feed-forward branch bilinear in (W_G, W_1): the "
    "W_G–W_1 block of the functional term is non-zero even though neither map is squared."
)
st.latex(
    r"\mathrm{FFN}(Z) = \big(\varphi(Z W_G) \odot Z W_1\big) W_2,\qquad "
    r"\varphi(u) = u\,\sigma(u)\ \text{(SiLU)}"
)
st.markdown(
    "**Rotary positions (RoPE)** turn each head's query and key at position t by a fixed "
    "rotation R_t (pairs of features, one angle per frequency). The score then depends on the "
    "positions only through their difference, and, because R_t is orthogonal and does not "
    "depend on the weights, the curvature keeps its shape: R_t enters the W_Q–W_K block as a "
    "fixed change of basis per pair of tokens."
)
st.latex(
    r"S_{ts} = \frac{(R_t\, q_t)^\top (R_s\, k_s)}{\sqrt{d_k}} = \frac{q_t^\top R_{s-t}\, k_s}"
    r"{\sqrt{d_k}},\qquad \omega_i = \theta^{-2i/d_k}"
)
st.markdown(
    "**Grouped-query attention (GQA)** lets several query heads read one key/value head: "
    "with H query heads over G key/value heads, head h reads group h // (H/G). The Hessian "
    "block of a shared W_K[g] collects the curvature of every query head that reads it; G = 1 "
    "is multi-query attention."
)
st.latex(
    r"A_h = \operatorname{softmax}\!\Big(\frac{X W_Q^{h} (X W_K^{g(h)})^\top}{\sqrt{d_k}}\Big),"
    r"\qquad g(h) = \Big\lfloor \frac{h}{H/G} \Big\rfloor"
)
st.markdown(
    "**QK-norm** (Qwen3) puts an RMSNorm on each head's query and key before the score, which "
    "bounds the score's size whatever ‖X‖; **the parallel placement** (GPT-NeoX, Pythia) feeds "
    "attention and the MLP the same input, so neither branch sees the other's output."
)
st.latex(r"\text{parallel:}\quad Z = X + \mathrm{SA}(\mathrm{LN}_1(X)) + \mathrm{FFN}(\mathrm{LN}_2(X))")

st.header("The pages", anchor="the-pages")
for p in ALL_PAGES:
    st.markdown(f"- **{p.title}**: {p.summary}.")
st.markdown(
    "Every page has the same sidebar: the block (placement, activation, loss, sizes), the "
    "input size ‖X‖₂, LayerNorm's ε and the seed. All of them live in the URL, so the *link to "
    "this view* in the sidebar reopens exactly what you see. Each figure can be downloaded as "
    "an interactive HTML file and its data as CSV or NPZ."
)

st.header("Papers", anchor="papers")
st.markdown(
    "- **Ormaniec, Dangel & Singh**, *What Does It Mean to Be a Transformer? Insights from a "
    "Theoretical Hessian Analysis*, ICLR 2025, [arXiv:2410.10986](https://arxiv.org/abs/2410.10986). "
    "Derives the Hessian of a single self-attention layer and shows how differently its blocks "
    "depend on the input, e.g. the ‖X‖⁶ growth of the query block; the *Scaling laws* page "
    "reproduces it.\n"
    "- **Petrov, Kiselev, Meshkov & Grabovoy**, *Closing the Curvature Gap: Full Transformer "
    "Hessians and Their Implications for Scaling Laws*, "
    "[arXiv:2510.16927](https://arxiv.org/abs/2510.16927). Extends the analysis to LayerNorm and "
    "the feed-forward network, i.e. the whole block hessviz computes, with norm bounds per block.\n"
    "- **Tomihari & Sato**, *Gradient Heterogeneity Complements Hessian Heterogeneity in Transformer "
    "Optimization*; earlier versions, [arXiv:2502.00213](https://arxiv.org/abs/2502.00213), are titled "
    "*Understanding Transformer Optimization via Gradient Heterogeneity* and *Understanding Why Adam "
    "Outperforms SGD: Gradient Heterogeneity in Transformers*. Links the spread of "
    "gradient and curvature sizes across blocks, and LayerNorm placement, to why sign-based "
    "optimisers such as Adam beat SGD on Transformers."
)
st.markdown(
    "**How to cite.** When you use a figure from this app, cite the paper whose result it "
    "illustrates; for example:"
)
st.code(
    """@inproceedings{ormaniec2025transformer,
  title     = {What Does It Mean to Be a Transformer? Insights from a Theoretical Hessian Analysis},
  author    = {Ormaniec, Weronika and Dangel, Felix and Singh, Sidak Pal},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2025},
  note      = {arXiv:2410.10986}
}
@article{petrov2025curvature,
  title   = {Closing the Curvature Gap: Full Transformer Hessians and Their Implications for Scaling Laws},
  author  = {Petrov, Egor and Kiselev, Nikita and Meshkov, Vladislav and Grabovoy, Andrey},
  journal = {arXiv preprint arXiv:2510.16927},
  year    = {2025}
}
@article{tomihari2025gradient,
  title   = {Understanding Transformer Optimization via Gradient Heterogeneity},
  author  = {Tomihari, Akiyoshi and Sato, Issei},
  journal = {arXiv preprint arXiv:2502.00213},
  year    = {2025}
}""",
    language="bibtex",
)
