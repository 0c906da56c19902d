"""Every page of the app under ``streamlit.testing.v1.AppTest``, routed through ``app.py``.

For each page: it renders without an exception, and changing a control changes what is
drawn (asserted on the figure's JSON, a caption or a metric). Small blocks keep it quick.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from hessviz.app.registry import PAGES  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "app.py")
SMALL = {"L": "4", "d": "8", "dk": "4", "dff": "8"}


def run_page(script: str, **query: str) -> AppTest:
    """The app routed to ``script`` (``pages/spectrum.py``: a page of :data:`PAGES`) with ``query``."""
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page(str(PAGES / Path(script).name))
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def figures(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def titles(at: AppTest) -> list[str]:
    """Each figure's title as it reads (a long one is wrapped onto lines by ``<br>``)."""
    out = []
    for f in figures(at):
        t = f.get("layout", {}).get("title", {})
        out.append((t.get("text", "") if isinstance(t, dict) else str(t)).replace("<br>", " "))
    return out


def caption(at: AppTest) -> str:
    return at.main.get("caption")[0].value


def drawn(markdown: str) -> str:
    """What a line of Markdown drawn through :func:`hessviz.app.state.plain` reads: each backslash
    escape as its character (CommonMark's rule for ASCII punctuation), the word joiners gone."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace("\u2060", "")


def test_every_file_in_pages_is_a_registered_page_at_its_name():
    """A cold server whose script has ``pages/`` beside it (``hessviz app``'s
    ``hessviz/app/streamlit_app.py``) first routes ``/spectrum`` to ``pages/spectrum.py`` by the
    file's name, and :func:`hessviz.app.controls._through_app` reruns it through the app's script at
    the same url path: the two must agree, file by file."""
    from hessviz.app.registry import ALL_PAGES, PAGES

    files = sorted(p.name for p in PAGES.glob("*.py") if p.name != "__init__.py")
    assert files == sorted(Path(s.script).name for s in ALL_PAGES)
    assert [s.url_path for s in ALL_PAGES] == [Path(s.script).stem for s in ALL_PAGES]


def test_hessian_map_renders_and_reacts():
    at = run_page("pages/hessian_map.py", **SMALL)
    assert caption(at).startswith("Post-LN block, L = 4, d = 8")
    assert len(at.get("plotly_chart")) == 2
    before = titles(at)
    assert any("full Hessian" in t for t in before)
    at.segmented_control(key="term").set_value("functional").run()
    assert not at.exception
    assert any("functional Hessian" in t for t in titles(at))
    at.slider(key="dk").set_value(2).run()  # P changes: the map is recomputed
    P = sum(int(s) for s in [8 * 2, 8 * 2, 8 * 8, 8 * 8, 8 * 8])
    assert any(f"P = {P:,}" in t for t in titles(at))
    at.selectbox(key="blk").set_value("W_Q,W_K").run()  # zoom into one block
    assert len(at.get("plotly_chart")) == 3
    assert any("W_Q × W_K" in t for t in titles(at))


def test_hessian_map_refuses_too_large():
    at = run_page("pages/hessian_map.py", d="64", dff="256")
    assert not at.get("plotly_chart")
    assert "P = " in at.warning[0].value and "Lower d" in at.warning[0].value


def test_a_width_the_block_cannot_take_is_settled_in_one_line():
    """d = 1 (or /?d=0, clamped to 1) in the default Post-LN block with ε = 0: no error box, the title
    stays, d = 2 is drawn and one line says why; the slider shows the value used. With ε > 0 d = 1 is a
    block, drawn as asked."""
    for asked in ("1", "0"):
        at = run_page("pages/hessian_map.py", d=asked, L="4", dk="4", dff="8")
        assert not at.error and at.title[0].value == "Hessian map"
        assert at.get("plotly_chart") and caption(at).startswith("Post-LN block, L = 4, d = 2")
        assert any("d = 2 is used" in drawn(w.value) for w in at.warning)
        assert at.slider(key="d").value == 2
    at.slider(key="d").set_value(1).run()  # moved by hand: settled again
    assert not at.error and at.slider(key="d").value == 2
    at = run_page("pages/hessian_map.py", d="1", eps="0.1", L="4", dk="4", dff="8")
    assert not at.error and caption(at).startswith("Post-LN block, L = 4, d = 1")


def test_spectrum_renders_and_reacts():
    at = run_page("pages/spectrum.py", **SMALL)
    assert len(at.get("plotly_chart")) == 3
    metrics = {m.label: m.value for m in at.metric}
    assert "negative mass" in metrics
    assert at.success or at.info  # the message the data supports
    before = [m.value for m in at.metric]
    at.segmented_control(key="norm").set_value("attention").run()
    assert not at.exception
    assert caption(at).startswith("Self-attention alone")
    assert [m.value for m in at.metric] != before
    bars = figures(at)[2]
    assert all("W_1" not in x for trace in bars["data"] for x in trace["x"])  # no FFN blocks any more


def test_spectrum_terms_drawn_come_from_the_url():
    at = run_page("pages/spectrum.py", spec_terms=["outer"], **SMALL)
    sorted_plot = figures(at)[0]
    assert [trace["name"] for trace in sorted_plot["data"]] == ["outer"]
    assert "spec_terms=outer" in at.sidebar.code[0].value  # and in the link to this view
    at.button_group(key="spec_terms").set_value([]).run()  # every term off: none drawn
    assert not at.exception and not at.get("plotly_chart")
    assert "pick at least one under *Terms drawn*" in at.info[0].value


def test_scaling_renders_and_reacts():
    at = run_page("pages/scaling.py", norm="attention", sc_seeds="2", **SMALL)
    figs = figures(at)
    assert len(figs) == 2
    assert figs[0]["layout"]["xaxis"]["title"]["text"] == "input size ‖X‖₂"
    table = next(m.value for m in at.markdown if m.value.startswith("| term | fitted slope | theory |"))
    outer = next(line.split(" | ") for line in table.splitlines() if line.startswith("| outer "))
    slope, theory = outer[1], outer[2].rstrip(" |")  # | outer | 5.98 | 6 |
    assert theory == "6" and abs(float(slope) - 6.0) < 0.5
    at.segmented_control(key="sc_axis").set_value("L").run()
    assert not at.exception
    assert figures(at)[0]["layout"]["xaxis"]["title"]["text"] == "sequence length L"


def test_verify_a_view_whose_gradients_cancel_agrees_to_rounding():
    """/verify?d=1 (drawn at d = 2: every token normalised to ±1, so every gradient is zero) said
    "please report this view"; the two methods differ there by round-off alone (issue 43)."""
    at = run_page("pages/verify.py", d="1", L="4", dk="4", dff="8")
    assert at.success and not at.error, [e.value for e in at.error]
    assert caption(at).startswith("Post-LN block, L = 4, d = 2")


def test_verify_renders_and_reacts():
    at = run_page("pages/verify.py", **SMALL)
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["worst relative error"]) < 1e-10
    assert at.success
    ticks = figures(at)[0]["data"][0]["x"]
    assert len(ticks) == 5
    at.segmented_control(key="norm").set_value("attention").run()
    assert not at.exception
    assert len(figures(at)[0]["data"][0]["x"]) == 3


def test_learn_renders_and_reacts():
    at = run_page("pages/learn.py", tour="4", **SMALL)  # stops 4 and 5: their stories compute least
    assert len(at.latex) >= 4
    links = at.main.get("page_link")  # the tour's stop: its full page, with its settings
    assert len(links) == 1
    assert "norm=attention" in links[0].proto.query_string and "sc_axis=L" in links[0].proto.query_string
    frame = at.main.get("iframe")[0].proto.src  # the live view beside the story
    assert "scaling?norm=attention" in frame and "hide=sidebar" in frame and "present=1" in frame
    assert any("fitted slope of **−" in m.value for m in at.markdown)  # the live slope, not "near −3"
    at.button(key="tour_next").click().run()  # Next: stop 5, LayerNorm collapse
    assert not at.exception
    assert "layernorm_collapse" in at.main.get("iframe")[0].proto.src
    assert at.segmented_control(key="tour").value == "5"
    at.segmented_control(key="tour_variant_5").set_value("ε = 1e-06").run()  # the story's switch
    assert "eps=1e-06" in at.main.get("iframe")[0].proto.src
    at.button(key="tour_back").click().run()
    assert at.segmented_control(key="tour").value == "4"
    bars = figures(at)[0]
    assert len(bars["data"][0]["x"]) == 5
    at.segmented_control(key="norm").set_value("attention").run()
    assert not at.exception
    assert len(figures(at)[0]["data"][0]["x"]) == 3


# ----------------------------------------------------------------------------- real layers, matrix-free

REAL = {**SMALL, "heads": "2", "wo": "true", "bias": "true", "affine": "true"}


def array(value) -> np.ndarray:
    """A figure's array as numpy: plotly writes large arrays as typed arrays (dtype, base64 bdata, shape)."""
    if isinstance(value, dict) and "bdata" in value:
        import base64

        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return a.reshape([int(n) for n in str(value.get("shape", a.size)).split(",")]).astype(np.float64)
    return np.asarray(value, dtype=np.float64)


def real_view():
    import hessviz as hv
    from hessviz.app.state import View

    view = View.from_values(
        {"L": 4, "d": 8, "dk": 4, "dff": 8, "heads": 2, "wo": True, "bias": True, "affine": True}
    )
    return view, hv.hessian(view.cfg, *view.inputs)


def test_hessian_map_draws_heads_and_head_slice_blocks():
    at = run_page("pages/hessian_map.py", blk="W_Q[1],W_K[1]", **REAL)
    heat = figures(at)[0]
    ticks = heat["layout"]["xaxis"]["ticktext"]
    assert "W<sub>Q</sub>[0]" in ticks and "W<sub>O</sub>[0]" in ticks and "W<sub>1</sub>" in ticks
    assert any(x.startswith("W_O[1] col") for x in heat["data"][0]["x"])  # every head named in the hover
    assert any(y.startswith("ln1_gamma row") for y in heat["data"][0]["y"])  # narrow blocks: in the hover
    dotted = [s for s in heat["layout"]["shapes"] if s["line"].get("dash") == "dot"]
    assert dotted  # thin lines between heads
    view, res = real_view()
    block = array(figures(at)[2]["data"][0]["customdata"])
    want = res.block("W_Q[1]", "W_K[1]", "full").numpy()
    assert block.shape == want.shape == (32, 32)
    np.testing.assert_allclose(block, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    at.selectbox(key="blk").set_value("b_Q,ln1_gamma").run()  # vectors (n,) in the block view
    assert not at.exception
    assert figures(at)[2]["data"][0]["y"][3] == "row 3 (b_Q[3])"


def test_spectrum_matrix_free_matches_dense_and_says_so():
    at = run_page("pages/spectrum.py", spec_method="matrix-free", spec_terms=["full"], spec_k="3", **REAL)
    assert "Lanczos" in at.info[0].value and "stochastic Lanczos quadrature" in at.info[0].value
    assert "Error statement" in " ".join(c.value for c in at.main.get("caption"))
    metrics = {m.label: m.value for m in at.metric}
    _, res = real_view()
    eig = np.linalg.eigvalsh(res.full.numpy())
    assert abs(float(metrics["λ_max (Lanczos)"]) - eig[-1]) < 1e-3 * abs(eig[-1])
    assert abs(float(metrics["λ_min (Lanczos)"]) - eig[0]) < 1e-3 * abs(eig[0])
    assert [t["name"] for t in figures(at)[0]["data"]] == ["full density", "full extremes (Lanczos)"]


def test_spectrum_auto_switches_to_matrix_free_past_the_budget(monkeypatch):
    import dataclasses

    from hessviz.app import cache

    monkeypatch.setattr(cache, "LIMITS", dataclasses.replace(cache.LIMITS, results_bytes=2 << 20))
    at = run_page("pages/spectrum.py", spec_terms=["outer"], spec_probes="2", spec_steps="10", **REAL)
    line = at.info[0].value
    assert line.startswith(
        "**Matrix-free spectrum**, because the dense spectrum is over this server's budget. "
    )
    head = line.split(" No P × P")[0]  # the reason: one pair of brackets at most, no nesting
    assert head.count("(") == head.count(")") <= 1 and "((" not in head and "))" not in head, head
    labels = [m.label for m in at.metric]
    assert "λ_max (Lanczos)" in labels and any(lb.startswith("negative share (SLQ) ± ") for lb in labels)
    at.segmented_control(key="spec_method").set_value("dense").run()  # forced dense: refused
    assert not at.get("plotly_chart") and "Too much for this server" in at.warning[0].value


def test_heterogeneity_per_head_matches_the_dense_blocks():
    at = run_page("pages/heterogeneity.py", **REAL)
    table = at.dataframe[0].value
    names = list(table["block"])
    assert names[:4] == ["W_Q[0]", "W_Q[1]", "b_Q[0]", "b_Q[1]"] and "ln2_beta" in names
    _, res = real_view()
    for name in ("W_Q[1]", "W_O[0]", "ln1_gamma"):
        want = np.linalg.eigvalsh(res.block(name, name, "full").numpy())
        row = table[table["block"] == name]
        assert abs(row["λ_max"].iloc[0] - want[-1]) <= 1e-8 * max(1.0, abs(want[-1]))
        assert abs(row["trace"].iloc[0] - want.sum()) <= 1e-8 * max(1.0, abs(want).sum())
    at.segmented_control(key="het_by").set_value("weights").run()
    assert not at.exception
    assert list(at.dataframe[0].value["block"]) == list(res.cfg.param_names)
    hint = "With one attention head, heads and weights give the same blocks"
    assert not any(hint in c.value for c in at.caption)
    one = run_page("pages/heterogeneity.py", **SMALL)  # one head: the control says why it is idle
    assert any(hint in c.value for c in one.caption)


def test_scaling_accepts_a_head_slice_pair():
    at = run_page("pages/scaling.py", sc_seeds="1", sc_blk="W_Q[0],W_K[0]", **REAL)
    assert "W_Q[0]–W_K[0]" in titles(at)[0]


def test_real_model_page_renders_and_reacts():
    """The trained Post-LN model (in the repository, 4 heads of d = 128) on a short text: attention,
    a head slice's Hessian window, gradients with their Gini, the per-block table; the text, the
    head and the weight change what is drawn."""
    at = run_page(
        "pages/real_model.py", rm_model="pydoc-postln", rm_text="def add(a, b):", rm_layer="1", rm_rows="1"
    )
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 4
    assert "Loss drawn:" in at.info[0].value and "synthetic target" in at.info[0].value
    shown = titles(at)
    assert any("layer 1, head 0: attention" in t for t in shown)
    assert any("Hessian of W_Q[0], rows 0…0 (32 × 32)" in t for t in shown)
    assert any("Gini" in t for t in shown)

    def tokens() -> int:  # the attention map is (L, L)
        return len(figures(at)[0]["data"][0]["x"])

    before = tokens()
    at.text_area(key="rm_text").set_value("def add(a, b):\n    return a + b").run()
    assert not at.exception
    assert tokens() > before
    at.slider(key="rm_head").set_value(2).run()
    at.segmented_control(key="rm_w").set_value("W_O").run()
    assert not at.exception
    assert any("Hessian of W_O[2], rows 0…0 (128 × 128)" in t for t in titles(at))


def test_real_model_page_refuses_bad_text():
    at = run_page("pages/real_model.py", rm_model="pydoc-postln", rm_text="x " * 199)
    assert not at.get("plotly_chart")
    assert "positions" in at.error[0].value


def test_depth_page_layer_matrix_profile_and_first_layer():
    at = run_page("pages/depth.py", layers="3", dp_seeds="1", **SMALL)
    assert caption(at).startswith("Post-LN block × 3 layers, L = 4, d = 8")
    assert len(at.get("plotly_chart")) == 3  # layer-by-layer norms, per-layer profile, first layer vs N
    fig = figures(at)[0]
    norms = array(fig["data"][0]["customdata"])
    assert norms.shape == (3, 3) and np.allclose(norms, norms.T) and (norms > 0).all()
    profile = [d for d in figures(at)[1]["data"] if d.get("mode") == "lines+markers"]
    assert [array(d["y"]).size for d in profile] == [3, 3]  # Post-LN and Pre-LN, one point per layer
    at.segmented_control(key="dp_term").set_value("outer").run()
    assert not at.exception
    assert any("of outer, layer by layer" in t for t in titles(at))
    # the first layer's block norm at N = 1 is the one-block Hessian's (no stack around it)
    import hessviz as hv
    from hessviz.matfree.spectra import matrix_norm

    first = [d for d in figures(at)[2]["data"] if d.get("mode") == "lines+markers"][0]
    cfg = hv.BlockConfig(seq_len=4, d_model=8, d_k=4, d_ff=8, norm="post")
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0)
    exact = matrix_norm(hv.hessian(cfg, params, X, Y, wrt=("W_Q",)).block("W_Q", "W_Q", "outer"))
    assert array(first["y"])[0] == pytest.approx(exact, rel=1e-9)


def test_depth_page_one_block_says_how_to_see_a_stack():
    at = run_page("pages/depth.py", dp_seeds="1", **SMALL)
    assert any("Raise **Layers**" in i.value for i in at.info)
    assert len(at.get("plotly_chart")) == 2


def test_depth_page_default_view_is_drawn_on_the_hosted_profile(monkeypatch):
    """The default view (one block, two seeds) fits the hosted profile's 4 s once each point is priced
    at its own stack depth (issue 17: it was refused as "about 10 s of computation")."""
    from hessviz.app import cache, profiles

    hosted = profiles.limits_from_env(
        {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=400 << 20
    )
    monkeypatch.setattr(cache, "LIMITS", hosted)
    at = run_page("pages/depth.py")
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert len(at.get("plotly_chart")) == 2  # the per-layer profile and the first layer against N


def test_scaling_sweeps_depth_and_reads_a_layer_of_a_stack():
    at = run_page("pages/scaling.py", sc_axis="layers", sc_seeds="1", **SMALL)
    main = figures(at)[0]
    assert main["layout"]["xaxis"]["type"] == "linear"
    assert any("Factor per added block" in m.value for m in at.markdown)
    at = run_page("pages/scaling.py", sc_axis="xnorm", sc_seeds="1", layers="2", **SMALL)
    assert at.slider(key="sc_layer").value == 0
    at.slider(key="sc_layer").set_value(1).run()
    assert not at.exception


def test_real_model_page_draws_the_models_own_objective():
    """Sentence similarity (MiniLM's objective, here on the trained pair's Post-LN model, which was not
    trained on it and is not said to be): the last
    layer is drawn whatever the layer control says, the loss is named, and the Hessian differs from
    the synthetic loss's on the same layer."""
    query = dict(rm_model="pydoc-postln", rm_text="def add(a, b):", rm_rows="1")

    def block(at: AppTest) -> object:
        fig = next(f for f in figures(at) if "Hessian of W_Q[0]" in str(f["layout"]["title"]))
        return fig["data"][0]["z"]

    synthetic = run_page("pages/real_model.py", rm_layer="3", **query)
    at = run_page(
        "pages/real_model.py", rm_loss="sentence similarity", rm_other="import sys", rm_layer="1", **query
    )
    assert not at.error, [e.value for e in at.error]
    assert "1 − cos(m, e)" in at.info[0].value
    assert "not the one pydoc-postln was trained on" in drawn(at.info[0].value)  # not MiniLM
    assert "pydoc-postln was not trained on it" in drawn(at.button_group(key="rm_loss").help)
    assert any("layer 3, head 0: attention" in t for t in titles(at))  # the last layer
    assert len(at.get("plotly_chart")) == 4
    assert block(at) != block(synthetic)


def test_pages_without_stacks_show_one_block_and_no_layers_control():
    at = run_page("pages/verify.py", layers="3", **SMALL)
    assert caption(at).startswith("Post-LN block, L = 4")
    assert not [s for s in at.sidebar.get("slider") if s.key == "layers"]
    at = run_page("pages/hessian_map.py", layers="2", **SMALL)
    assert caption(at).startswith("Post-LN block × 2 layers")


# ------------------------------------------------------------------------- the Real model page: odd inputs
PYDOC = dict(
    rm_model="pydoc-postln", rm_text="def add(a, b):", rm_rows="1", rm_part="attention", rm_samples="6"
)


def shown_lines(at: AppTest) -> str:
    return drawn(" ".join(m.value for m in [*at.warning, *at.info, *at.error]))


@pytest.mark.parametrize("typed", ["", "   \n\t "], ids=["empty", "whitespace"])
def test_real_model_page_an_emptied_text_box_draws_the_default_text(typed):
    """Emptying the text box (or leaving blanks) used to raise on ``st.query_params``: now the
    default text is drawn, the box is still there, and one line says so."""
    from hessviz.app import real_model as rm

    at = run_page("pages/real_model.py", **PYDOC)
    at.text_area(key="rm_text").set_value(typed).run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Text: the box is empty, so the default text is drawn." in shown_lines(at)
    assert at.text_area(key="rm_text")  # the box is still drawn
    n_tokens = len(figures(at)[0]["data"][0]["x"])
    from hessviz import pretrained

    assert n_tokens == len(pretrained.token_ids("pydoc-postln", rm.DEFAULT_TEXT))
    at.text_area(key="rm_text").set_value("x = 1").run()  # and a new text works again
    assert not at.exception
    assert len(figures(at)[0]["data"][0]["x"]) == len(pretrained.token_ids("pydoc-postln", "x = 1"))


def test_real_model_page_a_very_long_text_gets_one_line():
    at = run_page("pages/real_model.py", rm_model="pydoc-postln", rm_text="word " * 300)
    assert (
        "Text: the text was 1,500 characters long, more than the 400 this box takes: cut to its first 400."
    ) in shown_lines(at)
    assert not at.text_area(key="rm_text").max_chars  # a browser's maxlength dropped a paste silently
    at.text_area(key="rm_text").set_value("word " * 1000).run()  # a paste: cut in the box too
    assert "was 5,000 characters long" in shown_lines(at) and len(at.text_area(key="rm_text").value) == 400
    assert "positions" in at.error[0].value  # 400 characters are still more than 64 tokens
    assert not at.get("plotly_chart")


def test_real_model_page_switches_model_under_its_own_loss():
    """pydoc-postln's own loss (sentence similarity, a BERT) → pydoc-preln (a GPT-2, whose own loss is
    next token) used to raise on ``rm_loss``; now the loss falls back to one the model has, with a line."""
    at = run_page("pages/real_model.py", **{**PYDOC, "rm_loss": "sentence similarity"})
    assert "1 − cos(m, e)" in at.info[0].value
    at.selectbox(key="rm_model").set_value("pydoc-preln").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Loss: sentence similarity is not offered here" in shown_lines(at)  # the control's name
    assert "synthetic target" in at.info[0].value
    at.segmented_control(key="rm_loss").set_value("next token").run()
    assert not at.exception
    assert "next-token loss" in at.info[0].value
    at.selectbox(key="rm_model").set_value("pydoc-postln").run()  # and back
    assert not at.exception
    assert len(at.get("plotly_chart")) == 4
    at.selectbox(key="rm_model").set_value("a local folder…").run()  # a folder: notes name its box
    for typed, line in (
        ("   ", ""),
        ("/no/such/dir", "is not a folder on this server"),
        ("/tmp", "has no config.json"),
    ):
        at.text_input(key="rm_folder").set_value(typed).run()
        assert not at.exception and not at.error
        assert (
            (line in shown_lines(at) and "Checkpoint folder" in shown_lines(at))
            if line
            else "Checkpoint folder: type the path" in " ".join(c.value for c in at.caption)
        )
        assert "Text:" not in shown_lines(at) and "source" not in shown_lines(at)


def test_real_model_page_every_weight_and_row_sequence():
    """Every weight of a head in turn, with the rows and the first row at their ends (the slice's shape
    changes with the weight: W_O[h] is d_k × d), then a head and a layer out of the new model's range."""
    at = run_page("pages/real_model.py", **{**PYDOC, "rm_rows": "4", "rm_row0": "124"})
    for w in ("W_K", "W_V", "W_O", "W_Q"):
        at.segmented_control(key="rm_w").set_value(w).run()
        assert not at.exception, (w, [e.value for e in at.exception])
        assert any(f"Hessian of {w}[0]" in t for t in titles(at)), w
    at.slider(key="rm_head").set_value(3).run()
    at.slider(key="rm_layer").set_value(0).run()
    at.segmented_control(key="rm_term").set_value("functional").run()
    at.segmented_control(key="rm_by").set_value("heads").run()
    assert not at.exception
    assert any("functional Hessian of W_Q[3]" in t for t in titles(at))
    assert len(at.get("plotly_chart")) == 4


def test_real_model_page_target_seed_recomputes_only_what_the_target_enters():
    from hessviz.app import real_cache

    at = run_page("pages/real_model.py", **PYDOC)
    attention = real_cache.real_attention("pydoc-postln", 3, "def add(a, b):")
    before = set(real_cache.real_results())
    at.slider(key="rm_seed").set_value(7).run()
    new = set(real_cache.real_results()) - before
    assert {k[0] for k in new} == {"window", "gradients", "table"}  # not the attention, not tokens
    assert real_cache.real_attention("pydoc-postln", 3, "def add(a, b):") is attention
    own = run_page("pages/real_model.py", **{**PYDOC, "rm_loss": "sentence similarity"})
    before = set(real_cache.real_results())
    own.slider(key="rm_seed").set_value(9).run()
    assert not own.exception
    assert set(real_cache.real_results()) == before  # the own loss has no target


def test_real_model_page_reduces_a_view_over_the_budget(monkeypatch):
    """A server that allows less work than the chosen view draws the largest window and the part of the
    layer that fit, each with one line, instead of refusing."""
    from hessviz.app import cache, real_cache
    from hessviz.app.profiles import Limits
    from hessviz.checks import cost
    from hessviz.pretrained import explore

    cfg = real_cache.real_config("pydoc-postln", "def add(a, b):")
    ffn = cost.real_table_cost(cfg, explore.part_blocks(cfg, False, "FFN"), 6).seconds  # the cheapest part
    tight = Limits("hosted", cache.LIMITS.results_bytes, 1.01 * ffn, 1, 1 << 20, 1)
    monkeypatch.setattr(cache, "LIMITS", tight)
    cache.clear()  # a result computed before is drawn at once, whatever it cost
    at = run_page(
        "pages/real_model.py",
        rm_model="pydoc-postln",
        rm_text="def add(a, b):",
        rm_rows="64",
        rm_part="every block",
        rm_samples="30",
    )
    assert not at.exception
    lines = [i.value for i in at.info if "reduced view" in i.value]
    assert len(lines) == 2, shown_lines(at)
    assert "64 rows of W_Q[0]" in lines[0]
    window = next(t for t in titles(at) if "Hessian of W_Q[0]" in t)
    assert "rows 0…63" not in window
    assert "drawn FFN with 6 products" in lines[1]
    assert len(figures(at)[3]["data"][0]["x"]) == 2  # W_1 and W_2
    assert len(at.get("plotly_chart")) == 4


def test_real_model_page_draws_a_precomputed_view_as_a_fresh_one(tmp_path, monkeypatch):
    """Precompute a short text's default view, draw the page from it (no model is loaded), then
    draw it computed afresh: every figure is the same."""
    from hessviz.app import cache, real_cache
    from hessviz.app import real_model as rm

    text = "x = 1"
    path = tmp_path / "views.npz"
    rm.precompute(["pydoc-postln"], path, text=text, say=lambda _: None)
    monkeypatch.setattr(real_cache, "PRECOMPUTED", path)
    cache.clear()
    query = dict(rm_model="pydoc-postln", rm_text=text)
    at = run_page("pages/real_model.py", **query)
    assert not [k for k, _ in cache.STORE.items() if k[0] == "real_stack"]  # nothing computed live
    stored = figures(at)
    assert len(stored) == 4
    monkeypatch.setattr(real_cache, "PRECOMPUTED", None)
    cache.clear()
    fresh = figures(run_page("pages/real_model.py", **query))
    assert [k for k, _ in cache.STORE.items() if k[0] == "real_stack"]
    for a, b in zip(stored, fresh):
        assert a["layout"]["title"] == b["layout"]["title"]
        assert_same_numbers(a["data"], b["data"], rtol=1e-6)  # Lanczos' tolerance: the thread count may
        #                                                            reorder a sum between the two runs


def assert_same_numbers(a, b, rtol: float, where: str = "data") -> None:
    """Two figures' JSON alike: the same structure and strings, numbers (and plotly's base64 arrays)
    equal to ``rtol``."""
    import base64

    def numbers(v):
        if isinstance(v, dict) and set(v) >= {"dtype", "bdata"}:
            return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
        return None

    if numbers(a) is not None or isinstance(a, (int, float)) and not isinstance(a, bool):
        x = numbers(a) if numbers(a) is not None else np.asarray(a, float)
        y = numbers(b) if numbers(b) is not None else np.asarray(b, float)
        scale = float(np.abs(x).max(initial=0))
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * scale, err_msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_numbers(a[k], b[k], rtol, f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_numbers(x, y, rtol, f"{where}[{i}]")
    else:
        assert a == b, where


def test_committed_precomputed_views_match_a_fresh_computation():
    """The committed hessviz/data/real_views.npz holds the default views of this code: pydoc-preln's
    attention and window of W_Q[1], recomputed here."""
    from hessviz.app import real_cache
    from hessviz.app import real_model as rm
    from hessviz.pretrained import precomputed

    entries, made = precomputed.read(precomputed.FILE)
    assert made["text"] == rm.DEFAULT_TEXT
    model, text, layer = "pydoc-preln", rm.DEFAULT_TEXT, 3
    keys = [
        k
        for k in entries
        if k[:4] in (("attention", model, text, layer), ("window", model, text, layer))
        and (k[0] == "attention" or k[6] == "W_Q[1]")
    ]
    assert sorted(k[0] for k in keys) == ["attention", "window"]
    fresh = {
        "attention": lambda k: real_cache.real_attention(model, layer, text),
        "window": lambda k: real_cache.real_window(model, layer, text, *k[5:]),
    }
    saved = real_cache.PRECOMPUTED
    try:
        real_cache.PRECOMPUTED = None
        for k in keys:
            stored = next(iter(entries[k].values()))
            np.testing.assert_allclose(fresh[k[0]](k), stored, rtol=1e-9, atol=1e-12 * np.abs(stored).max())
    finally:
        real_cache.PRECOMPUTED = saved


def test_real_model_page_on_the_hosted_profile_draws_the_precomputed_default(monkeypatch):
    """Under the hosted profile's limits (4 s, 800 MiB for the whole process) the default view of the
    first bundled model is drawn whole from the precomputed file: the exact window of W_Q[0] and the
    per-block table, which a live computation of that size could not afford, with no model loaded."""
    from hessviz import pretrained
    from hessviz.app import cache, profiles

    hosted = profiles.limits_from_env(
        {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=400 << 20
    )
    monkeypatch.setattr(cache, "LIMITS", hosted)
    cache.clear()
    model = pretrained.available_models()[0]
    at = run_page("pages/real_model.py", rm_model=model)
    assert not at.warning, [w.value for w in at.warning]
    assert len(at.get("plotly_chart")) == 4
    assert any("Hessian of W_Q[0], rows 0…" in t for t in titles(at))
    assert not [k for k, _ in cache.STORE.items() if k[0] == "real_stack"]
    at.slider(key="rm_head").set_value(1).run()  # every head is precomputed
    at.segmented_control(key="rm_w").set_value("W_V").run()
    assert not at.warning and not [k for k, _ in cache.STORE.items() if k[0] == "real_stack"]
    assert any("Hessian of W_V[1], rows 0…" in t for t in titles(at))
