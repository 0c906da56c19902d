"""What a page computes and draws for one view, without Streamlit: the page and the lesson page
(:mod:`hessviz.app.lesson_page`) call the same functions, so a lesson page shows the page's figures.

Each function takes a :class:`~hessviz.app.state.View` and the page's own control values, reads
the server-wide caches (:mod:`hessviz.app.cache`) and returns the results and the figures, laid
out in the theme of the caller (:func:`hessviz.plots.drawn_in`). Only the Streamlit layout (columns,
metrics, captions, download buttons) stays in the page scripts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import hessviz as hv
from hessviz import plots
from hessviz.app import budget, cache, settings, state, warm
from hessviz.app.address import Lesson
from hessviz.app.state import View
from hessviz.block.config import NORMED
from hessviz.block.terms import NAMES
from hessviz.experiments.ln_collapse import sigma_axis
from hessviz.experiments.scaling import BEND_TOL
from hessviz.laws import sweeps
from hessviz.laws.fitting import bend_point, pooled_power_law_fit
from hessviz.matfree.spectra import DENSE_LIMIT

# ----------------------------------------------------------------------------- scaling

SCALING_SEEDS_MAX = 8
SCALING_PAIRS = (
    "W_Q,W_Q",
    "W_K,W_K",
    "W_V,W_V",
    "W_Q,W_K",
    "W_Q,W_V",
    "W_G,W_G",
    "W_G,W_1",
    "W_1,W_1",
    "W_2,W_2",
    "q_norm_gamma,q_norm_gamma",
    "ln1_gamma,ln1_gamma",
)
PLACEMENTS = ("attention", "post", "pre", "peri")
"""The placements of the Scaling page's side-by-side chart (Peri-LN, ``MODEL.md`` part 5, beside the rest)."""
FIT_REGIME = {
    "xnorm": "‖X‖₂ ≤ 1.",
    "L": "L ≥ 4.",
    "d": "all points.",
    "layers": "none (a geometric law r^N: the factor per block is shown).",
}


def scaling_pairs(view: View) -> tuple[str, ...]:
    """The block pairs the Scaling page offers for the view's block (one head's slices too)."""
    names = view.cfg.block.param_names
    pairs = tuple(p for p in SCALING_PAIRS + ("W_O,W_O",) if all(n in names for n in p.split(",")))
    if view.cfg.n_heads > 1:  # one head's slices: the same scaling laws, per head
        pairs += (
            "W_Q[0],W_Q[0]",
            "W_K[0],W_K[0]",
            "W_Q[0],W_K[0]",
            "W_Q[0],W_Q[1]",
            "W_V[0],W_V[0]",
            "W_O[0],W_O[0]",
        )
    return pairs


def placed(view: View, norm: str) -> View:
    """The view's block with LayerNorm placed at ``norm`` (no γ/β where there is no LayerNorm)."""
    return view.with_values(norm=norm, affine=view.cfg.ln_affine and norm in NORMED)


@dataclass
class Scaling:
    """The Scaling page's two sweeps and their figures."""

    pair: tuple[str, str]
    side_pair: tuple[str, str]
    main: sweeps.Sweep
    side: dict[str, sweeps.Sweep]
    fits: dict
    side_fits: dict
    figure: object
    side_figure: object


STAT = "median"
"""The centre the Scaling page draws and fits, and the tour quotes: the median over seeds."""


def side_pair(pair: tuple[str, ...]) -> tuple[str, ...]:
    """The pair of the side-by-side chart: the main one when it is an attention block, else W_Q–W_Q."""
    return pair if all(n.partition("[")[0] in ("W_Q", "W_K", "W_V") for n in pair) else ("W_Q", "W_Q")


def sweep(
    view: View,
    axis: str,
    pair: tuple[str, str],
    seeds: list[int],
    *,
    layer: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> sweeps.Sweep:
    """The block ``pair``'s norms (outer, functional, full) of ``view``'s block over the default
    grid of ``axis``, one cached point per grid value and seed (:func:`hessviz.app.cache.sweep_point`):
    the page, the tour's story and the lesson page read the same points."""

    def measure(c, input_norm: float, seed: int) -> dict[str, float]:
        return cache.sweep_point(c, input_norm, seed, pair, layer=layer)

    return sweeps.sweep(
        view.cfg,
        axis,
        sweeps.DEFAULT_GRIDS[axis],
        seeds,
        measure,
        input_norm=view.input_norm,
        progress=progress,
    )


def bend(result: sweeps.Sweep, norm: str, pair: tuple[str, str], term: str = "outer") -> float:
    """Where the drawn ``term`` curve leaves its theory's slope by more than ``BEND_TOL`` (``nan``
    when it never does, or when the theory gives no exponent)."""
    expected = sweeps.theory_exponent(norm, term, pair, result.axis)
    if expected is None:
        return float("nan")
    return bend_point(result.grid, result.center(term, STAT), expected, tol=BEND_TOL)


def outer_slope(result: sweeps.Sweep, norm: str, pair: tuple[str, str]) -> float:
    """The fitted slope of the drawn outer curve (the page's fit, over its marked regime)."""
    return float(sweeps.fits(result, norm, pair, stat=STAT)["outer"].slope)


def scaling_points(view: View, axis: str, pair_s: str, n_seeds: int, layer: int = 0) -> list[tuple]:
    """Every point :func:`scaling` measures, as :func:`hessviz.app.cache.prime_sweep_points` takes them."""
    pair = tuple(pair_s.split(","))
    seeds = range(view.seed, view.seed + n_seeds)
    sweeps_of = [(view.cfg, pair)] + [(placed(view, n).cfg, side_pair(pair)) for n in PLACEMENTS]
    out = []
    for cfg, p in sweeps_of:
        for x in sweeps.DEFAULT_GRIDS[axis]:
            c, xn = sweeps.config_at(cfg, axis, x)
            out += [(c, view.input_norm if xn is None else xn, s, p, "spectral", layer) for s in seeds]
    return out


def scaling_key(view: View, axis: str, pair_s: str, n_seeds: int, layer: int = 0) -> tuple:
    """The store's key of one Scaling view (:func:`scaling`)."""
    return ("scaling", view.key, axis, pair_s, int(n_seeds), int(layer))


def cached_scaling(view: View, axis: str, pair_s: str, n_seeds: int, layer: int = 0) -> Scaling | None:
    """The Scaling view :func:`scaling` has already made (for any visitor), or None: nothing is
    computed, so a page draws no progress bar for a view it only has to show."""
    return cache.cached_view(scaling_key(view, axis, pair_s, n_seeds, layer))


def scaling(
    view: View,
    axis: str,
    pair_s: str,
    n_seeds: int,
    layer: int = 0,
    progress: Callable[[float, str], None] | None = None,
) -> Scaling:
    """Sweep the ``pair_s`` block (``"W_Q,W_Q"``) over ``axis`` for ``n_seeds`` seeds, and the same
    for each of the :data:`PLACEMENTS`; ``progress(fraction, text)`` after each point. The sweeps
    read cached points; the fits and figures are made once per view and the whole result is kept
    (:func:`hessviz.app.cache.view`), so the view's next visitor reads it in one look-up."""
    key = scaling_key(view, axis, pair_s, n_seeds, layer)
    done = cache.cached_view(key)
    if done is not None:
        return done
    pair = tuple(pair_s.split(","))
    seeds = list(range(view.seed, view.seed + n_seeds))

    def run(v: View, label: str, pair: tuple[str, str], offset: float, share: float) -> sweeps.Sweep:
        def step(done: int, total: int) -> None:
            if progress is not None:
                progress(min(1.0, offset + share * done / total), f"Sweeping {label}: {done}/{total}")

        return sweep(v, axis, pair, seeds, layer=layer, progress=step)

    spair = side_pair(pair)
    main = run(view, view.cfg.describe(), pair, 0.0, 0.4)
    share = 0.6 / len(PLACEMENTS)
    side = {
        norm: run(placed(view, norm), norm, spair, 0.4 + share * k, share)
        for k, norm in enumerate(PLACEMENTS)
    }

    def made() -> Scaling:  # once per view, for every visitor of a lesson link
        by_depth = axis == "layers"  # a geometric law in N, not a power law: no slope fits
        fits = {} if by_depth else sweeps.fits(main, view.cfg.norm, pair, stat=STAT)
        side_fits = {} if by_depth else {n: sweeps.fits(r, n, spair, stat=STAT) for n, r in side.items()}
        fig = plots.sweep_plot(
            main,
            sweeps.TERMS,
            stat=STAT,
            fits=fits,
            y_title=f"‖H[{pair[0]}, {pair[1]}]‖₂",
            title=f"{pair[0]}–{pair[1]} block vs {sweeps.AXES[axis]}",
        )
        sfig = plots.side_by_side(side, stat=STAT, fits=side_fits, y_title=f"‖H[{spair[0]}, {spair[1]}]‖₂")
        return Scaling(pair, spair, main, side, fits, side_fits, fig, sfig)

    return cache.view(key, made)


def scaling_price(view: View, axis: str, pair_s: str, n_seeds: int) -> dict:
    """What a Scaling view asks the budget (:func:`hessviz.app.budget.cost` of kind ``"sweep"``):
    its ``points``, the largest swept weight's ``weight_count`` and the grid's costliest block ``cfg``. Raises
    :class:`hessviz.HessvizError` for a block pair the view's block does not have."""
    grid = sweeps.DEFAULT_GRIDS[axis]
    return {
        "points": len(grid) * n_seeds * (1 + len(PLACEMENTS)),
        "weight_count": sweeps.largest_weight(view.cfg, axis, grid, tuple(pair_s.split(","))),
        "cfg": sweeps.costliest_config(view.cfg, axis, grid),
    }


def scaling_neighbours(
    view: View, axis: str, pair_s: str, n_seeds: int, layer: int, lesson: Lesson
) -> list[warm.Job]:
    """The Scaling views one step away from this one on each slider the page leaves open
    (:func:`hessviz.app.warm.steps`: the sidebar's sizes, ε and ‖X‖₂, then the page's seeds and
    layer), as the app would show them (:func:`hessviz.app.state.reconcile`); only those the
    budget affords within :data:`hessviz.app.warm.MAX_SECONDS`, for :mod:`hessviz.app.warm`."""
    by_name = {s.name: view.values[s.url] for s in settings.SETTINGS}

    def shown(s: settings.AppSetting) -> bool:
        return lesson.sidebar and not lesson.hides(s.url) and settings.relevant(s.name, by_name)

    moves = [({k: v}, n_seeds, layer) for k, v in warm.steps(view.values, shown)]
    if not lesson.hides("sc_seeds"):  # the page's sliders after the sidebar's
        moves += [({}, n, layer) for n in warm.step(tuple(range(1, SCALING_SEEDS_MAX + 1)), n_seeds)]
    if view.cfg.is_stack and axis != "layers" and not lesson.hides("sc_layer"):
        moves += [({}, n_seeds, n) for n in warm.step(tuple(range(view.cfg.n_layers)), layer)]
    jobs, keys = [], {scaling_key(view, axis, pair_s, n_seeds, layer)}
    for change, seeds, lay in moves:
        try:
            near = View.from_values(state.reconcile({**view.values, **change})[0])
            if pair_s not in scaling_pairs(near):
                continue
            price = scaling_price(near, axis, pair_s, seeds)
        except hv.HessvizError:
            continue
        verdict = budget.check(budget.cost("sweep", price.pop("cfg"), **price), cache.LIMITS)
        key = scaling_key(near, axis, pair_s, seeds, lay)
        if not verdict.ok or verdict.cost.seconds > warm.MAX_SECONDS or key in keys:
            continue
        keys.add(key)

        def make(pause, near=near, seeds=seeds, lay=lay) -> Scaling:
            return scaling(near, axis, pair_s, seeds, lay, progress=lambda fraction, text: pause())

        jobs.append(warm.Job(cache.view_key(key), make))
    return jobs


def slopes_line(result: Scaling) -> str:
    """The fitted slopes per placement, in one line (empty for a sweep over the depth)."""
    if not result.side_fits:
        return ""
    return "Slopes per placement (outer / functional / full): " + "; ".join(
        f"{n}: " + " / ".join(plots.signed(result.side_fits[n][t].slope) for t in sweeps.TERMS)
        for n in PLACEMENTS
    )


# ----------------------------------------------------------------------------- spectrum

SPECTRUM_K = 64
"""Eigenvalues at each end when the spectrum is partial."""


@dataclass
class Spectrum:
    """The Spectrum page's dense eigenvalues and block norms of the three terms, and its figures."""

    spec: dict[str, dict]
    norms: dict[str, np.ndarray]
    sorted_figure: object
    histogram: object
    bars: object


def spectrum(
    view: View,
    shown: list[str] | tuple[str, ...] = NAMES,
    step: Callable[[int, int, str], None] | None = None,
) -> Spectrum:
    """Dense eigenvalues (:func:`hessviz.app.cache.spectrum`) and per-block spectral norms of the
    three terms; the figures draw the terms ``shown``. ``step(done, total, text)`` before each part."""
    spec, norms = {}, {}
    for i, t in enumerate(NAMES):
        if step is not None:
            step(2 * i, 2 * len(NAMES), f"Eigenvalues of the {t} term…")
        spec[t] = cache.spectrum(view.key, t, k=SPECTRUM_K, dense_limit=DENSE_LIMIT)
        if step is not None:
            step(2 * i + 1, 2 * len(NAMES), f"Block norms of the {t} term…")
        norms[t] = cache.block_norms(view.key, t, "spectral")
    values = {t: spec[t]["values"] for t in shown}
    fig = plots.spectrum_sorted(values, partial={t: spec[t]["partial"] for t in shown})
    hfig = plots.spectrum_histogram(values)
    bfig = plots.block_norm_bars({t: norms[t] for t in shown}, view.cfg.param_names)
    return Spectrum(spec, norms, fig, hfig, bfig)


def spectrum_line(result: Spectrum) -> str:
    """Negative eigenvalues and mass of each term, in one line."""
    return "; ".join(
        f"{t}: {s['negative_count']:,} negative λ, {100 * s['negative_mass']:.1f} % of the mass"
        for t, s in result.spec.items()
    )


# ----------------------------------------------------------------------------- LayerNorm collapse

LN_VIEWS = ("layernorm", "block")


def sigma_grid(decades: int) -> np.ndarray:
    """σ from 1 down to ``10^-decades``, three points a decade."""
    return np.logspace(0, -decades, 3 * decades + 1)


LN_HESSIAN = "‖H_LN‖₂ exact"
LN_HESSIAN_SLOPE = "‖H‖"
"""The LayerNorm-alone view's curve of ‖H_LN‖₂ and the label of its slope (the tour quotes both)."""


def slope(x, Y) -> str:
    """The pooled power-law slope of ``Y`` over ``σ ≤ 1e-2`` (two decimals, a true minus), or ``–``."""
    try:
        return plots.signed(pooled_power_law_fit(x, Y, hi=1e-2, n_boot=0).slope)
    except ValueError:  # fewer than two points with σ ≤ 1e-2
        return "–"


@dataclass
class Collapse:
    """The LayerNorm collapse page's sweep, its curves and figure."""

    result: dict
    x: np.ndarray
    curves: dict[str, np.ndarray]
    figure: object
    slopes: dict[str, str]


def layernorm_collapse(view: View, decades: int, n_seeds: int) -> Collapse:
    """LayerNorm alone on the view's ``(L, d)`` input: ‖J‖ and ‖H‖ of the collapsing row, with bounds.

    The x axis is σ, the standard deviation the collapsing row is given (the grid), not LayerNorm's
    denominator √(σ² + ε): with ε > 0 that one stops at √ε, and every point below σ ≈ √ε would be
    drawn on top of each other at the left edge."""
    eps, L, d = view.cfg.ln_eps, view.cfg.seq_len, view.cfg.d_model
    seeds = tuple(range(view.seed, view.seed + n_seeds))
    r = cache.ln_sweep(tuple(sigma_grid(decades)), eps, L, d, seeds)
    x = np.asarray(r["sigma"], dtype=float)
    curves = {
        "‖J_LN‖₂ exact": r["J"],
        LN_HESSIAN: r["H"],
        "‖J_LN‖₂ bound": r["J_bound"],
        "‖H_LN‖₂ bound": r["H_bound"],
    }
    fig = plots.collapse_plot(
        x,
        curves,
        title=f"LayerNorm alone on a {L} × {d} input, ε = {eps:g}",
        x_title="σ (std of the collapsing row)",
    )
    slopes = {
        "‖J‖ (σ ≤ 1e-2)": slope(x, r["J"]),
        LN_HESSIAN_SLOPE: slope(x, r["H"]),
        "of J bound": slope(x, r["J_bound"]),
        "of H bound": slope(x, r["H_bound"]),
    }
    return Collapse(r, x, curves, fig, slopes)


def block_collapse(view: View, decades: int, n_seeds: int, whole: bool) -> Collapse:
    """A Post-LN block's weight Hessian as the first LayerNorm's input row collapses (the W_Q–W_Q
    block; with ``whole`` also the whole-matrix norms of each term)."""
    c = view.cfg
    eps, L, d = c.ln_eps, c.seq_len, c.d_model
    seeds = tuple(range(view.seed, view.seed + n_seeds))
    r = cache.ln_block_sweep(
        tuple(sigma_grid(decades)), eps, seeds, L, d, c.d_k, c.d_ff, view.input_norm, whole
    )
    x = sigma_axis(r)
    keys = ("full", "outer", "functional", "QQ_full") if whole else ("QQ_full",)
    curves = {f"‖H_{k}‖₂": r[k] for k in keys}
    fig = plots.collapse_plot(
        x,
        curves,
        title=f"Post-LN block (L = {L}, d = {d}), ε = {eps:g}",
        x_title="σ_min of the first LayerNorm's input",
        guide=True,
    )
    slopes = {"‖H_QQ‖ (σ ≤ 1e-2)": slope(x, r["QQ_full"])}
    if whole:
        slopes["‖H_full‖"] = slope(x, r["full"])
    return Collapse(r, x, curves, fig, slopes)
