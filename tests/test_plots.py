"""The figure functions of :mod:`hessviz.plots` on small data, and the sweep helpers."""

from __future__ import annotations

import functools

import numpy as np
import plotly.graph_objects as go
import pytest

import hessviz as hv
from hessviz import plots
from hessviz.laws import sweeps

OFFSETS = {"W_Q": slice(0, 4), "W_K": slice(4, 8), "W_V": slice(8, 24)}


def sym(n: int, seed: int = 0) -> np.ndarray:
    A = np.random.default_rng(seed).standard_normal((n, n))
    return A + A.T


def test_symlog_is_odd_monotone_and_linear_near_zero():
    x = np.array([-1e3, -1.0, -1e-6, 0.0, 1e-6, 1.0, 1e3])
    y = plots.symlog(x, 1e-3)
    assert np.all(np.diff(y) > 0)
    assert np.allclose(y, -y[::-1])
    assert y[3] == 0 and abs(y[4] - 1e-3 / np.log(10)) < 1e-6  # ≈ x / (c ln 10) for |x| ≪ c


def test_symlog_ticks_label_true_values():
    vals, text = plots.symlog_ticks(10.0, 1e-3)
    assert "0" in text and "10" in text and "−10" in text and "10⁻³" in text
    assert vals == sorted(vals)


def test_hessian_heatmap_labels_blocks_and_hover():
    H = sym(24)
    fig = plots.hessian_heatmap(H, OFFSETS, title="t")
    assert isinstance(fig, go.Figure)
    hm = fig.data[0]
    assert np.asarray(hm.z).shape == (24, 24)
    assert np.allclose(np.asarray(hm.customdata), H.astype(np.float32))  # hover shows the true value
    assert hm.y[5] == "W_K row 1" and hm.x[9] == "W_V col 1"
    assert "H = %{customdata" in hm.hovertemplate
    assert len(fig.layout.shapes) == 4  # two boundaries, each a vertical and a horizontal line
    assert list(fig.layout.xaxis.ticktext) == ["W<sub>Q</sub>", "W<sub>K</sub>", "W<sub>V</sub>"]
    assert not fig.layout.annotations  # full resolution: nothing to say


def test_hessian_heatmap_reduces_large_matrices_and_says_so():
    H = sym(24)
    fig = plots.hessian_heatmap(H, OFFSETS, max_cells=8)
    z = np.asarray(fig.data[0].z)
    assert z.shape[0] < 24
    assert "Reduced view" in fig.layout.annotations[0].text
    # the reduced cell keeps the largest-magnitude entry of its tile, inside one block
    R, labels = plots.reduce_blocks(H, OFFSETS, 3)
    assert labels[0] == ("W_Q", 0, 2) and labels[1] == ("W_Q", 3, 3) and labels[2][0] == "W_K"
    tile = H[0:3, 0:3]
    assert R[0, 0] == tile.flat[np.argmax(np.abs(tile))]


def test_block_heatmap_names_weight_entries():
    B = np.arange(12.0).reshape(3, 4) - 5
    fig = plots.block_heatmap(B, "W_Q", "W_K", row_shape=(3, 1), col_shape=(2, 2))
    assert fig.data[0].x[3] == "col 3 (W_K[1, 1])"
    assert "W_Q × W_K" in fig.data[0].hovertemplate


def test_block_norm_matrix_and_bars():
    M = np.array([[1.0, 0.1], [0.1, 0.0]])
    fig = plots.block_norm_matrix(M, ["W_Q", "W_K"], kind="fro")
    assert np.isfinite(np.asarray(fig.data[0].z)).all()  # a zero block does not break the log scale
    assert fig.data[0].text[0][0] == "1"
    bars = plots.block_norm_bars({"outer": M, "full": 2 * M}, ["W_Q", "W_K"])
    assert [t.name for t in bars.data] == ["outer", "full"] and len(bars.data[0].x) == 3


def test_spectrum_figures():
    vals = {"full": np.linspace(-1, 2, 50), "outer": np.linspace(0, 2, 50)}
    s = plots.spectrum_sorted(vals)
    assert [t.name for t in s.data] == ["full", "outer"]
    assert np.allclose(s.data[0].customdata, vals["full"])
    h = plots.spectrum_histogram(vals, bins=10)
    assert sum(h.data[0].y) == 50 and h.layout.yaxis.type == "log"


def _sweep(values: dict, grid=(0.1, 0.2, 0.4), axis="xnorm") -> sweeps.Sweep:
    return sweeps.Sweep(axis, np.asarray(grid), tuple(range(next(iter(values.values())).shape[0])), values)


def test_sweep_plot_draws_the_named_statistic_band_and_fit():
    x = np.array([0.1, 0.2, 0.4])
    Y = np.stack([x**6, 4 * x**6, 9 * x**6])  # seeds (3) × grid (3)
    sw = _sweep({"outer": Y})
    fit = sweeps.fits(sw, "attention", ("W_Q", "W_Q"), terms=("outer",))
    fig = plots.sweep_plot(sw, stat="median", fits=fit)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert fig.layout.xaxis.title.text == "input size ‖X‖₂"
    band, line, fitted = fig.data
    assert np.allclose(line.y, 4 * x**6)  # median over seeds
    assert np.allclose(band.y, np.concatenate([9 * x**6, (x**6)[::-1]]))  # max, then min reversed
    assert "slope 6.00 (theory 6)" in line.name
    assert np.allclose(fitted.y, 4 * fitted.x**6)
    geo = plots.sweep_plot(sw, stat="geomean")
    assert np.allclose(geo.data[1].y, (1 * 4 * 9) ** (1 / 3) * x**6)
    with pytest.raises(ValueError, match="stat must be one of"):
        plots.sweep_plot(sw, stat="mean")


def test_side_by_side_and_compare_plot():
    Y = np.ones((2, 3))
    side = {"attention": _sweep({"outer": Y}), "pre": _sweep({"outer": 2 * Y})}
    fig = plots.side_by_side(side, stat="median")
    assert [a.text for a in fig.layout.annotations] == ["attention alone", "Pre-LN"]
    cmp = plots.compare_plot(side, "outer", stat="geomean", guide=-3.0, guide_label="guide")
    lines = [t for t in cmp.data if t.mode == "lines+markers"]
    assert [t.name for t in lines] == ["attention alone", "Pre-LN"]
    assert lines[1].line.color == plots.PLACEMENT_COLORS["pre"]
    guides = [t for t in cmp.data if t.name == "guide"]
    assert len(guides) == 2 and [g.showlegend for g in guides] == [True, False]


def test_themes():
    fig = plots.block_norm_matrix(np.eye(2), ["W_Q", "W_K"])
    assert fig.layout.template.layout.paper_bgcolor == "white"  # light by default
    dark = plots.block_norm_matrix(np.eye(2), ["W_Q", "W_K"], theme="dark")
    assert dark.layout.template.layout.paper_bgcolor == "rgb(17,17,17)"
    with pytest.raises(ValueError, match="theme must be one of"):
        plots.apply_theme(fig, "sepia")


def test_one_tile_reduction_for_both_heatmaps():
    B = sym(9)
    fig = plots.block_heatmap(B, "W_Q", "W_Q", max_cells=3)
    assert np.allclose(np.asarray(fig.data[0].customdata), plots.tile_extremes(B, [0, 3, 6], [0, 3, 6]))


def test_verify_figures():
    E = {"full": np.full((2, 2), 1e-16), "outer": np.zeros((2, 2))}
    fig = plots.error_matrix(E, ["W_Q", "W_K"])
    assert len(fig.data) == 2
    t = plots.timing_bars({"closed_form": 0.01, "autograd": 0.1})
    assert list(t.data[0].text) == ["10 ms", "100 ms"]


def test_figures_export_to_html():
    fig = plots.hessian_heatmap(sym(8), {"W_Q": slice(0, 8)})
    html = fig.to_html(include_plotlyjs=False)
    assert "plotly" in html.lower()


def test_sweep_attention_qq_outer_grows_like_x6():
    cfg = hv.BlockConfig(seq_len=4, d_model=4, d_k=2, d_ff=4, norm="attention")
    seen = []
    measure = sweeps.block_norms_measure(sweeps.TERM_CURVES, key=sweeps.term_key)
    res = sweeps.sweep(
        cfg,
        "xnorm",
        [0.05, 0.1, 0.2],
        seeds=[0, 1],
        measure=measure,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert seen == [(k, 6) for k in range(1, 7)]
    fits = sweeps.fits(res, "attention", ("W_Q", "W_Q"))
    assert fits["outer"].expected == 6.0 and fits["outer"].slope == pytest.approx(6.0, abs=0.1)
    assert res.values["outer"].shape == (2, 3)  # (seeds, grid)
    assert res.values["outer"][1, 2] == sweeps.point(cfg, 0.2, 1, ("W_Q", "W_Q"))["outer"]
    table = res.table()
    assert len(table["norm"]) == 3 * 2 * 3
    assert table["norm"][1] == res.values["outer"][1, 0]  # grid-major, then seed


def test_sweep_on_an_executor_gives_the_in_process_values():
    """A sweep's points as tasks on a spawned two-process pool (a fresh interpreter each): the same
    values to the bit, progress once per point in order; a closed pool is refused by name."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    cfg = hv.BlockConfig(seq_len=4, d_model=4, d_k=2, d_ff=4, norm="post")
    measure = sweeps.block_norms_measure(sweeps.term_curves(("W_Q", "W_Q")), key=sweeps.term_key)
    here = sweeps.sweep(cfg, "L", [3, 4, 5], seeds=[0, 1], measure=measure)
    seen = []
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        there = sweeps.sweep(
            cfg,
            "L",
            [3, 4, 5],
            seeds=[0, 1],
            measure=measure,
            executor=pool,
            progress=lambda d, t: seen.append((d, t)),
        )
    assert seen == [(k, 6) for k in range(1, 7)]
    assert here.values.keys() == there.values.keys()
    assert all(np.array_equal(here.values[k], there.values[k]) for k in here.values)
    with pytest.raises(hv.InputError, match="executor is closed"):
        sweeps.sweep(cfg, "L", [3], seeds=[0], measure=measure, executor=pool)


def test_sweep_stops_when_progress_raises():
    cfg = hv.BlockConfig(seq_len=4, d_model=4, d_k=2, d_ff=4, norm="attention")
    calls = []

    def measure(c, xn, s):
        calls.append((xn, s))
        return {"v": xn}

    def cancel(done, total):
        if done == 2:
            raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt):
        sweeps.sweep(cfg, "xnorm", [1.0, 2.0, 3.0], seeds=[0, 1], measure=measure, progress=cancel)
    assert calls == [(1.0, 0), (1.0, 1)]


def test_per_seed_and_center_fits():
    x = np.logspace(-2, 0, 7)
    sw = sweeps.Sweep("xnorm", x, (0, 1), {"a": np.stack([x**2, 3 * x**2])})
    assert sw.fit_per_seed("a", 0.01, 0.1).slope == pytest.approx(2.0)
    assert sw.fit_center("a", "geomean").slope == pytest.approx(2.0)
    assert sw.to_arrays("p_").keys() == {"p_input_norm", "p_seeds", "p_a"}


def test_sweep_over_length_and_width_changes_the_config():
    cfg = hv.BlockConfig(seq_len=4, d_model=4, d_k=2, d_ff=4, norm="post")
    assert sweeps.config_at(cfg, "L", 7)[0].seq_len == 7
    assert sweeps.config_at(cfg, "d", 6)[0].d_model == 6
    assert sweeps.largest_weight(cfg, "d", [4, 8], ("W_1", "W_1")) == 8 * 4
    with pytest.raises(hv.ConfigError):
        sweeps.config_at(cfg, "bogus", 1)


def test_sweep_refuses_a_block_the_config_does_not_have():
    cfg = hv.BlockConfig(seq_len=4, d_model=4, d_k=2, norm="attention")
    measure = sweeps.block_norms_measure(sweeps.term_curves(("W_1", "W_1")), key=sweeps.term_key)
    with pytest.raises(hv.ConfigError, match="W_1"):
        sweeps.sweep(cfg, "xnorm", [1.0], seeds=[0], measure=measure)


def test_heads_drawn_head_by_head_with_thin_lines():
    # W_Q (2, 4) with 2 heads of 2 columns: head 0 is vec_r positions 0, 1, 4, 5
    heads = {"W_Q": [np.array([0, 1, 4, 5]), np.array([2, 3, 6, 7])]}
    H = np.arange(100.0).reshape(10, 10)
    fig = plots.hessian_heatmap(H, {"W_Q": slice(0, 8), "b_1": slice(8, 10)}, heads=heads)
    assert list(fig.layout.xaxis.ticktext) == ["W<sub>Q</sub>[0]", "W<sub>Q</sub>[1]", "b<sub>1</sub>"]
    order = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9]
    np.testing.assert_array_equal(np.asarray(fig.data[0].customdata), H[np.ix_(order, order)])
    dashes = sorted((s.line.dash or "solid", s.x0) for s in fig.layout.shapes if s.x0 == s.x1)
    assert dashes == [("dot", 3.5), ("solid", 7.5)]
    R, labels = plots.reduce_segments(H, [("a", np.array(order[:4])), ("b", np.array(order[4:]))], 3)
    assert labels == [("a", 0, 2), ("a", 3, 3), ("b", 0, 2), ("b", 3, 5)]
    tile = H[np.ix_(order[:3], order[:3])]
    assert R[0, 0] == tile.flat[np.argmax(np.abs(tile))]


def test_vector_and_head_slice_blocks_name_whole_weight_entries():
    B = np.ones((2, 3))
    fig = plots.block_heatmap(
        B,
        "b_Q[1]",
        "W_Q[1]",
        row_shape=(4,),
        col_shape=(2, 4),
        row_index=np.array([2, 3]),
        col_index=np.array([2, 3, 6]),
    )
    assert fig.data[0].y[1] == "row 1 (b_Q[3])" and fig.data[0].x[2] == "col 2 (W_Q[1, 2])"
    names = (
        "ln2_beta",
        "W_O[3]",
        "x",
        "l1.ln1_out_gamma",
        "ln1_outer_beta",
        "l2.q_norm_gamma",
        "v_norm_gamma",
    )
    assert [plots.pretty(n) for n in names] == [
        "β<sub>2</sub>",
        "W<sub>O</sub>[3]",
        "x",
        "l1.γ<sub>1,out</sub>",
        "ln1_outer_beta",
        "l2.γ<sub>q</sub>",
        "v_norm_gamma",
    ]


def test_block_spectrum_bars_and_density():
    fig = plots.block_spectrum_bars(
        ["W_Q[0]", "W_Q[1]", "W_1"], [1.0, 2.0, 30.0], [-1.0, 2.0, 5.0], trace_errors=[0.0, 0.0, 0.5]
    )
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type != "log"  # negative trace: linear
    assert fig.data[0].marker.color[0] == fig.data[0].marker.color[1] != fig.data[0].marker.color[2]
    dens = plots.spectral_density(
        {"full": (np.linspace(-1, 1, 5), np.array([0, 1, 2, 1, 0.0]))},
        extremes={"full": np.array([-1.0, 1.0])},
    )
    assert [t.name for t in dens.data] == ["full density", "full extremes (Lanczos)"]
    assert min(dens.data[0].y) > 0  # log axis: no zeros


# ----------------------------------------------------------------------------- projector and phone


@functools.cache
def _every_figure() -> dict[str, go.Figure]:
    """One figure of every function of :mod:`hessviz.plots`, on small data (built once; the tests
    only read them)."""
    M = np.abs(sym(5)) + 1e-3
    names = ["W_Q", "W_K", "W_V", "W_1", "W_2"]
    sw = _sweep({"outer": np.ones((2, 3)), "full": 2 * np.ones((2, 3))})
    return {
        "hessian_heatmap": plots.hessian_heatmap(sym(24), OFFSETS, title="t"),
        "block_heatmap": plots.block_heatmap(sym(6), "W_Q", "W_K"),
        "block_norm_matrix": plots.block_norm_matrix(M, names),
        "attention_map": plots.attention_map(np.full((3, 3), 1 / 3), ["a", "b", "c"]),
        "error_matrix": plots.error_matrix({"full": M * 1e-15, "outer": M * 1e-16}, names),
        "spectrum_sorted": plots.spectrum_sorted(
            {"full": np.linspace(-1, 1, 9), "outer": np.linspace(0, 1, 9)}
        ),
        "spectrum_histogram": plots.spectrum_histogram({"full": np.linspace(-1, 1, 9)}),
        "spectral_density": plots.spectral_density({"full": (np.linspace(-1, 1, 5), np.ones(5))}),
        "block_norm_bars": plots.block_norm_bars({"full": M, "outer": M}, names),
        "diagonal_norm_bars": plots.diagonal_norm_bars({"full": {"W_Q": 1.0}, "outer": {"W_Q": 0.5}}),
        "timing_bars": plots.timing_bars({"closed_form": 0.01, "autograd": 0.1}),
        "grouped_bars": plots.grouped_bars(["a"], {"post": [1.0], "pre": [2.0]}, title="t", ylabel="y"),
        "block_spectrum_bars": plots.block_spectrum_bars(names, np.ones(5), np.ones(5)),
        "sweep_plot": plots.sweep_plot(sw, stat="median"),
        "compare_plot": plots.compare_plot({"post": sw, "pre": sw}, "outer", stat="median"),
        "side_by_side": plots.side_by_side({"attention": sw, "post": sw, "pre": sw}, stat="median"),
        "training_curves": plots.training_curves({"SGD": np.ones((2, 4)), "Adam": np.ones((2, 4))}),
        "scatter_figure": plots.scatter_figure(
            {"post": ([1.0, 2.0], [1.0, 2.0])}, title="t", xlabel="x", ylabel="y", diagonal=True
        ),
    }


@pytest.mark.parametrize("name", list(_every_figure()))
def test_every_figure_puts_its_legend_below_the_plot(name):
    """On a phone a legend beside the plot takes half its width: every figure's legend is
    horizontal, anchored at the bottom of the figure (below the axis titles) and left-aligned."""
    legend = _every_figure()[name].layout.legend
    assert legend.orientation == "h"
    assert (legend.yref, legend.y, legend.yanchor) == ("container", 0.0, "bottom")
    assert (legend.xref, legend.x, legend.xanchor) == ("container", 0.0, "left")


@pytest.mark.parametrize("name", list(_every_figure()))
def test_titles_wrap_to_a_phone_and_log_axes_ask_for_few_labels(name):
    fig = _every_figure()[name]
    style = plots.style
    if fig.layout.title.text:
        lines = fig.layout.title.text.split("<br>")
        assert max(len(style.visible(s)) for s in lines) <= style.TITLE_CHARS
        assert style.text_width(fig.layout.title.text, style.TITLE_SIZE) <= style.PHONE_WIDTH
    for axis in [*fig.select_xaxes(), *fig.select_yaxes()]:
        if axis.type == "log" and axis.tickvals is None:
            assert axis.nticks is not None and axis.nticks <= 4  # no overprinted minor digits 2 … 9


@pytest.mark.parametrize("name", list(_every_figure()))
def test_every_axis_keeps_one_tick_notation(name):
    """Log axes labelled from their data (1-2-5, or powers of ten throughout), linear axes in
    powers of ten rather than SI prefixes ("1µ")."""
    fig = _every_figure()[name]
    for axis in [*fig.select_xaxes(), *fig.select_yaxes()]:
        if axis.ticktext:
            powers = {
                "×" in t or any(c in t for c in "⁰¹²³⁴⁵⁶⁷⁸⁹")
                for t in axis.ticktext
                if t.lstrip("−") not in ("0", "1", "10")
            }
            assert len(powers) <= 1, axis.ticktext
        elif axis.type != "log" and axis.tickvals is None:
            assert axis.exponentformat == "power", name


@pytest.mark.parametrize("name", list(_every_figure()))
def test_every_bar_names_its_category_on_hover(name):
    """A phone skips every other category label of a long bar axis; the hover names each bar (its
    category, or a histogram bin's range of true values)."""
    for trace in _every_figure()[name].data:
        if trace.type == "bar" and trace.hoverinfo != "skip":
            category = "%{y}" if trace.orientation == "h" else "%{x}"
            where = trace.hovertemplate
            assert where is None or category in where or "customdata" in where, (name, trace.name)


def test_log_ticks_read_as_numbers():
    vals, text = plots.style.log_ticks(0.0316, 10.0)
    assert text == ["0.1", "0.3", "1", "3", "10"] and vals == sorted(vals)
    assert plots.style.log_ticks(3.0, 4.0) is None  # plotly's own ticks inside one step


def test_long_titles_wrap_and_the_figure_grows_for_them():
    short = plots.timing_bars({"closed_form": 0.01}, title="Time")
    long = plots.timing_bars(
        {"closed_form": 0.01}, title="Time for all three terms: closed form is 16.7× faster than autograd"
    )
    assert long.layout.title.text.count("<br>") == 2 and short.layout.title.text == "Time"
    assert long.layout.height > short.layout.height
    assert plots.style.wrap("a <sub>bb</sub> c", 4) == "a <sub>bb</sub><br>c"  # tags are not counted


def test_block_norm_numbers_fit_their_cells_or_stay_in_the_hover():
    """Five weights: short numbers at a font that fits a cell on a phone; sixteen (a real layer):
    no numbers written (they would overprint), the hover still gives each value."""
    names16 = [f"W_{i}" for i in range(16)]
    small = plots.block_norm_matrix(np.full((5, 5), 0.000351), ["W_Q", "W_K", "W_V", "W_1", "W_2"])
    hm = small.data[0]
    assert hm.texttemplate == "%{text}" and hm.text[0][0] == "4e-4"
    side = min(small.layout.height - 150, plots.style.PHONE_WIDTH - 160) / 5
    assert plots.style.text_width("4e-4", hm.textfont.size) <= side and hm.textfont.size >= 10
    big = plots.block_norm_matrix(np.full((16, 16), 0.5), names16)
    assert big.data[0].texttemplate is None and "customdata" in big.data[0].hovertemplate
    assert [plots.matrices.short_number(v) for v in (0.4412, 12.34, 4.5e5, -0.0002)] == [
        "0.44",
        "12",
        "4e+5",
        "-2e-4",
    ]


def test_heatmap_tick_labels_do_not_overlap_on_a_phone():
    """Two narrow blocks side by side (W_Q, W_K of 128 in P = 1,536): the second one's label
    goes to the hover; every pair of kept labels is at least their half-extents apart on a phone
    (text widths side by side; line heights when the x labels stand up, as with many heads)."""
    offsets = {
        "W_Q": slice(0, 128),
        "W_K": slice(128, 256),
        "W_V": slice(256, 512),
        "W_1": slice(512, 1024),
        "W_2": slice(1024, 1536),
    }
    fig = plots.hessian_heatmap(np.eye(1536), offsets, max_cells=1536)
    assert [plots.style.visible(s) for s in fig.layout.xaxis.ticktext] == ["WQ", "WV", "W1", "W2"]
    two = {"W_Q": slice(0, 512), "W_K": slice(512, 1024), "W_1": slice(1024, 1536)}  # two heads each
    heads = {"W_Q": [np.arange(h, 512, 2) for h in range(2)], "W_K": [np.arange(h, 512, 2) for h in range(2)]}
    many = plots.hessian_heatmap(np.eye(1536), two, heads=heads, max_cells=1536)
    for f in (fig, many):
        ax = f.layout.xaxis
        size, side = ax.tickfont.size, plots.style.PHONE_WIDTH - 160
        pos = [list(f.data[0].x).index(v) for v in ax.tickvals]
        extent = [1.3 * size if ax.tickangle == -90 else plots.style.text_width(s, size) for s in ax.ticktext]
        for i in range(len(pos) - 1):
            assert (pos[i + 1] - pos[i]) / 1536 * side >= (extent[i] + extent[i + 1]) / 2
    assert many.layout.xaxis.tickangle == -90 and len(many.layout.xaxis.ticktext) == 5  # all, stood up


@pytest.mark.parametrize("name", ["side_by_side", "error_matrix", "block_spectrum_bars"])
def test_subplot_titles_fit_their_panels_and_stay_below_the_title(name):
    """Subplot titles (``make_subplots``) of neighbouring panels never meet: each, at its font,
    is narrower on a phone than its panel's domain plus the gap to the next; and the top margin
    holds the figure's title above them."""
    fig = _every_figure()[name]
    titles = [a for a in fig.layout.annotations if a.yanchor == "bottom" and a.yref == "paper"]
    assert titles
    plot_width = plots.style.PHONE_WIDTH - fig.layout.margin.l - fig.layout.margin.r
    by_row: dict[float, list] = {}
    for a in titles:
        by_row.setdefault(round(a.y, 6), []).append(a)
    for row in by_row.values():
        row.sort(key=lambda a: a.x)
        for left, right in zip(row, row[1:]):
            half = (
                plots.style.text_width(left.text, left.font.size)
                + plots.style.text_width(right.text, right.font.size)
            ) / 2
            assert half <= (right.x - left.x) * plot_width, (left.text, right.text)
    top_row = max(by_row)
    lines = max(a.text.count("<br>") + 1 for a in by_row[top_row])
    needed = 1.3 * max(a.font.size for a in by_row[top_row]) * lines
    if fig.layout.title.text:
        needed += 1.3 * plots.style.TITLE_SIZE * (fig.layout.title.text.count("<br>") + 1)
    assert fig.layout.margin.t >= needed


def test_side_by_side_panel_titles_put_the_slope_on_its_own_line():
    x = np.array([0.1, 0.2, 0.4])
    sw = _sweep({"outer": np.stack([x**6, 2 * x**6])})
    fits = {"attention": sweeps.fits(sw, "attention", ("W_Q", "W_Q"), terms=("outer",))}
    fig = plots.side_by_side({"attention": sw, "pre": sw}, stat="median", fits=fits)
    assert fig.layout.annotations[0].text == "attention alone<br>outer slope 6.00"
    assert [ax.title.text for ax in fig.select_xaxes()].count(None) == 1  # one x title for two panels
