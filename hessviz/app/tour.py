"""The classroom tour: six stops, each a page of the app with its settings and what to notice.

The Learn page steps through them (Back / Next, the story beside a live view of the stop); each
stop is also a plain link a teacher can paste into slides (:meth:`Stop.query`), and the browser
test opens every one and checks that it shows the view it names.

A story quotes its own view's numbers: :meth:`Stop.story` fills the ``{fields}`` of the story
from :meth:`Stop.numbers`, which reads the very results the stop's page draws (the same cached
sweep points, spectra and LayerNorm sweeps, fitted the same way). A stop whose story asks the
visitor to change a setting offers that setting as a :class:`Variant` of the live view, so the
instruction can be followed there (the live view has no sidebar).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hessviz import plots
from hessviz.app import cache, views
from hessviz.app.address import Query, encode_query
from hessviz.app.state import SHARED_KEYS, View, parse_value
from hessviz.laws.fitting import center


@dataclass(frozen=True)
class Variant:
    """A second setting of a stop's live view that its story asks the visitor to try: ``name``
    prefixes the story's numbers for it (``{ce_full}``), ``label`` is the choice the Learn page shows."""

    name: str
    label: str
    params: dict[str, str]


@dataclass(frozen=True)
class Stop:
    """One stop: a ``title``, the page (its URL path), the URL keys it sets, and the story: a
    template whose ``{fields}`` are the numbers ``facts`` reads from the stop's own view."""

    title: str
    page: str
    params: dict[str, str]
    notice: str
    facts: Callable[[Stop], dict[str, str]] | None = None
    variants: tuple[Variant, ...] = field(default=())
    choice: tuple[str, str] = ("", "")
    """With ``variants``: the Learn page's control over the live view, its label and the label of
    the stop's own setting, e.g. ``("Loss", "mean squared error")``."""

    def query(self, **flags: str) -> Query:
        """The stop's settings as a query, with lesson flags (``hide``, ``present``) added."""
        return {k: [v] for k, v in {**self.params, **flags}.items()}

    def link(self, **flags: str) -> str:
        """``page?key=value…``, relative to the app's root.

        >>> TOUR[0].link()
        'scaling?norm=attention&sc_axis=xnorm&sc_blk=W_Q%2CW_Q'
        """
        return f"{self.page}?{encode_query(self.query(**flags))}"

    def view(self, **changes: str) -> View:
        """The block the stop's page computes (its shared URL keys, ``changes`` on top)."""
        given = {**self.params, **changes}
        return View.from_values({k: parse_value(k, v) for k, v in given.items() if k in SHARED_KEYS})

    def numbers(self) -> dict[str, str]:
        """The story's numbers, formatted as the story prints them (computed, or read from the cache)."""
        return self.facts(self) if self.facts else {}

    def story(self) -> str:
        """What to notice, with the live view's own numbers in it."""
        return self.notice.format(**self.numbers())


# ----------------------------------------------------------------------------- each stop's numbers


def _signed(value: float) -> str:
    """Two decimals with a true minus sign, as the story and its chart print a slope: ``−2.58``."""
    return plots.signed(value)


def _seeds(stop: Stop) -> list[int]:
    view = stop.view()
    return list(range(view.seed, view.seed + int(stop.params.get("sc_seeds", "3"))))


def _pair(stop: Stop) -> tuple[str, str]:
    return tuple(stop.params.get("sc_blk", "W_Q,W_Q").split(","))


def scaling_facts(stop: Stop) -> dict[str, str]:
    """The outer curve's fitted slope and where it bends, on the Scaling page's first chart."""
    view, pair, axis = stop.view(), _pair(stop), stop.params.get("sc_axis", "xnorm")
    result = views.sweep(view, axis, pair, _seeds(stop))
    slope = views.outer_slope(result, view.cfg.norm, pair)
    bend = views.bend(result, view.cfg.norm, pair)
    top = float(result.grid.max())
    bent = (
        f"first leaves 6 ± {views.BEND_TOL:g} at ‖X‖₂ ≈ {bend:.2g}"
        if np.isfinite(bend)
        else f"stays within 6 ± {views.BEND_TOL:g} up to ‖X‖₂ = {top:g}, the grid's end"
    )
    return {"slope": _signed(slope), "bend": bent, "factor": f"{2**slope:.0f}"}


def side_facts(stop: Stop) -> dict[str, str]:
    """The outer slopes of the Scaling page's side-by-side chart, one per placement."""
    view, pair, axis = stop.view(), views.side_pair(_pair(stop)), stop.params.get("sc_axis", "xnorm")
    out = {}
    for norm in views.PLACEMENTS:
        result = views.sweep(views.placed(view, norm), axis, pair, _seeds(stop))
        out[norm] = _signed(views.outer_slope(result, norm, pair))
    return out


SPECTRUM_K = 64
"""The Spectrum page's number of extreme eigenvalues past the dense limit (its ``K``)."""


def spectrum_facts(stop: Stop) -> dict[str, str]:
    """Negative eigenvalues of the outer and full terms and the full term's negative mass, for the
    stop's loss and for each variant's (``ce_…`` for cross-entropy)."""
    from hessviz.matfree.spectra import DENSE_LIMIT

    out = {}
    for prefix, changes in (("", {}), *((v.name + "_", v.params) for v in stop.variants)):
        key = stop.view(**changes).key
        spec = {t: cache.spectrum(key, t, k=SPECTRUM_K, dense_limit=DENSE_LIMIT) for t in ("outer", "full")}
        out[prefix + "outer"] = f"{spec['outer']['negative_count']:,}"
        out[prefix + "full"] = f"{spec['full']['negative_count']:,}"
        out[prefix + "mass"] = f"{100 * spec['full']['negative_mass']:.1f} %"  # as the page's line
    return out


LN_SEEDS = 2
LN_DECADES = 4
"""The LayerNorm collapse page's default seeds and decades of σ."""


def layernorm_facts(stop: Stop) -> dict[str, str]:
    """The LayerNorm-alone chart (:func:`hessviz.app.views.layernorm_collapse`, the page's own
    figure data) at the stop's ε and at each variant's: the fitted slope of ‖H_LN‖ for σ ≤ 1e-2,
    ‖H_LN‖ at the smallest σ, and the curve's peak and where it lies.

    With ε = 0 the curve rises to the grid's end (``σ⁻²``). With ε > 0 LayerNorm's denominator is
    ``√(σ² + ε)``: the Hessian's terms go like ``σ/(σ² + ε)^{3/2}``, which peak near ``σ ≈ √ε``
    and fall again, linearly in σ, below it; the story says which of the two the chart shows."""
    out = {}
    for prefix, changes in (("", {}), *((v.name + "_", v.params) for v in stop.variants)):
        view = stop.view(**changes)
        drawn = views.layernorm_collapse(view, LN_DECADES, LN_SEEDS)
        x, h = drawn.x, center(drawn.curves[views.LN_HESSIAN], "geomean")
        top = int(np.argmax(h))
        out[prefix + "slope"] = drawn.slopes[views.LN_HESSIAN_SLOPE]
        out[prefix + "at_min"] = f"{h[np.argmin(x)]:.2g}"
        out[prefix + "peak"] = f"{h[top]:.2g}"
        out[prefix + "peak_at"] = f"{x[top]:.2g}"
        out[prefix + "eps"] = f"{view.cfg.ln_eps:g}"
        out[prefix + "root_eps"] = f"{np.sqrt(view.cfg.ln_eps):.2g}"
    out["sigma_min"] = f"{10.0**-LN_DECADES:g}"
    return out


TOUR: tuple[Stop, ...] = (
    Stop(
        "The ‖X‖⁶ law",
        "scaling",
        {"norm": "attention", "sc_axis": "xnorm", "sc_blk": "W_Q,W_Q"},
        "Self-attention alone, W_Q–W_Q block, swept over the input size ‖X‖₂. Notice that the outer "
        "curve is a straight line on log–log axes: its fitted slope over ‖X‖₂ ≤ 1 is **{slope}** (the "
        "theory says 6), so doubling the input multiplies this curvature by about {factor}. The law "
        "holds while softmax stays nearly uniform, and these small random weights keep it so for "
        "long: the curve's local slope {bend}.",
        scaling_facts,
    ),
    Stop(
        "Pre-LN flattens it",
        "scaling",
        {"norm": "pre", "sc_axis": "xnorm", "sc_blk": "W_Q,W_Q"},
        "Same sweep; scroll the view to the side-by-side chart under the first one. The outer "
        "W_Q–W_Q block of attention alone climbs with slope **{attention}**, the Post-LN block with "
        "{post}, and the Pre-LN block with **{pre}**: LayerNorm in front of attention removes the "
        "scale of X before it reaches the query and key weights, so the curvature hardly depends "
        "on ‖X‖₂.",
        side_facts,
    ),
    Stop(
        "Negative eigenvalues come from the functional term",
        "spectrum",
        {"norm": "post"},
        "The default Post-LN block with the mean-squared-error loss. Notice that outer has **{outer}** "
        "negative eigenvalues while full has **{full}**, carrying {mass} of the curvature: the loss is "
        "convex in the block's output, but the block bends the landscape into saddles. Now switch the "
        "live view to cross-entropy (the *Loss* choice above it): outer has {ce_outer} negative "
        "eigenvalues and full {ce_full} ({ce_mass} of the curvature).",
        spectrum_facts,
        (Variant("ce", "cross-entropy", {"loss": "ce"}),),
        ("Loss", "mean squared error"),
    ),
    Stop(
        "1/L³ decay",
        "scaling",
        {"norm": "attention", "sc_axis": "L", "sc_blk": "W_Q,W_Q", "sc_seeds": "5"},
        "Attention alone at fixed ‖X‖₂, swept over the sequence length. Notice the outer W_Q–W_Q "
        "curve falling with a fitted slope of **{slope}** over L ≥ 4, against the theory's −3: with "
        "more tokens, each token's row of X is smaller and softmax averages over more of them. The "
        "band shows the seed-to-seed spread of the five seeds; the theory's exponent is asymptotic, "
        "so at these short lengths the fit comes out flatter than −3.",
        scaling_facts,
    ),
    Stop(
        "LayerNorm curvature as row variance collapses",
        "layernorm_collapse",
        {"norm": "post"},
        "LayerNorm alone, with one row of its input shrinking. LayerNorm divides each row by its "
        "standard deviation σ, so its Jacobian grows like 1/σ and its second derivative like 1/σ² "
        "as the row flattens. Notice ‖H_LN‖₂ exploding with ε = {eps}: fitted slope **{slope}** for "
        "σ ≤ 0.01, reaching {at_min} at σ = {sigma_min}. Now switch the live view to ε = {capped_eps} "
        "(the *LayerNorm ε* choice above it): the curve follows the ε = 0 line until σ nears √ε = "
        "{capped_root_eps}, peaks at {capped_peak} at σ = {capped_peak_at}, then falls to "
        "{capped_at_min} at σ = {sigma_min}. ε removes the singularity: once σ² is small against ε the "
        "denominator √(σ² + ε) stops shrinking, and the curvature fades with the row's own size.",
        layernorm_facts,
        (Variant("capped", "ε = 1e-06", {"eps": "1e-06"}),),
        ("LayerNorm ε", "ε = 0"),
    ),
    Stop(
        "Peri-LN: a norm on both sides",
        "scaling",
        {"norm": "peri", "sc_axis": "xnorm", "sc_blk": "W_Q,W_Q"},
        "Peri-LN, the placement of Gemma 2 and 3, puts a LayerNorm on both sides of each sublayer: "
        "Z₁ = X + LN(SA(LN(X))). Same sweep as the second stop; scroll to the side-by-side chart. The "
        "outer W_Q–W_Q block of the Peri-LN block has slope **{peri}**, beside Post-LN's {post} and "
        "Pre-LN's {pre}. Follow the chain rule from W_Q to the output: the attention sees LN(X), "
        "which does not depend on ‖X‖₂, and the norm after it divides out the scale of the "
        "attention's output, so no factor on the path carries ‖X‖₂ and the curvature stays flat, as "
        "in Pre-LN. What the second norm adds: each sublayer joins the residual stream with rows of "
        "unit scale, whatever its weights.",
        side_facts,
    ),
)
"""The tour, in the order a 20-minute lesson takes it."""
