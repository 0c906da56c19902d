"""Every tour stop tells what its chart shows, in every variant it offers (issue 44).

Each test opens the stop's own page under :class:`streamlit.testing.v1.AppTest`, exactly as the
Learn page's live view does (the stop's URL keys, the variant's on top), reads the numbers and
the shape straight from the figure the page draws (the legend's fitted slope, a panel's title,
the eigenvalues under a trace, the points of a curve), and checks that the story prints the same
thing to the same precision: ``−0.05`` in the story is ``−0.05`` on the chart."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest

from hessviz.app import views
from hessviz.app.tour import LN_DECADES, TOUR, Stop, scaling_facts, side_facts
from hessviz.experiments.scaling import BEND_TOL
from hessviz.laws.fitting import bend_point
from hessviz.matfree.spectra import negative_summary
from hessviz.plots import PLACEMENT_NAMES
from tests.test_app_pages import figures, run_page

SLOPE = r"slope ([−\d.]+)"


def _settings(stop: Stop) -> list[tuple[str, dict[str, str]]]:
    """The stop's own setting (prefix ``""``) and each variant's (prefix ``"ce_"`` …)."""
    return [("", {})] + [(v.name + "_", v.params) for v in stop.variants]


def _live(stop: Stop, changes: dict[str, str]) -> list[dict]:
    """The figures of the stop's live view with ``changes`` (a variant's settings)."""
    return figures(run_page(f"pages/{stop.page}.py", **{**stop.params, **changes}))


def array(value) -> np.ndarray:
    """A figure's data array as Streamlit sends it: a list, or plotly's typed ``{dtype, bdata}``."""
    if isinstance(value, dict):
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).astype(float)
    return np.asarray(value, dtype=float)


def number(text: str) -> float:
    return float(text.replace("−", "-"))


def trace(fig: dict, name: str) -> dict:
    """The trace of ``fig`` whose legend name is ``name`` or starts with ``name ·`` (a fitted curve)."""
    found = [t for t in fig["data"] if t.get("name") == name or t.get("name", "").startswith(name + " ·")]
    assert len(found) == 1, (name, [t.get("name") for t in fig["data"]])
    return found[0]


def x_title(fig: dict) -> str:
    return fig["layout"]["xaxis"]["title"]["text"]


def test_every_variant_of_every_stop_is_a_setting_its_page_reads():
    for stop in TOUR:
        for _, params in _settings(stop):
            assert stop.view(**params).values != stop.view().values or not params, stop.title


@pytest.mark.parametrize("at", [i for i, s in enumerate(TOUR) if s.facts is scaling_facts])
def test_a_scaling_stop_quotes_the_slope_its_chart_fits_and_where_its_curve_bends(at):
    stop = TOUR[at]
    main = _live(stop, {})[0]
    outer = trace(main, "outer")
    drawn = re.search(SLOPE, outer["name"]).group(1)  # the legend: "outer · slope 5.98 (theory 6)"
    story, facts = stop.story(), stop.numbers()
    assert facts["slope"] == drawn and f"**{drawn}**" in story, (drawn, story)
    assert facts["factor"] == f"{2 ** number(drawn):.0f}"
    if "{bend}" in stop.notice:  # where the drawn curve's local slope first leaves 6 ± tol
        x, y = array(outer["x"]), array(outer["y"])
        bend = bend_point(x, y, 6.0, tol=BEND_TOL)
        said = f"at ‖X‖₂ ≈ {bend:.2g}" if np.isfinite(bend) else f"up to ‖X‖₂ = {x.max():g}"
        assert said in story, (said, story)
        assert "‖X‖₂" in x_title(main)
    if "five seeds" in stop.notice:  # the band it points at spans five seeds; the fit is flatter than −3
        assert stop.params["sc_seeds"] == "5" and any(t.get("fill") == "toself" for t in main["data"])
        assert "flatter than −3" in stop.notice and -3 < number(drawn) < 0


@pytest.mark.parametrize("at", [i for i, s in enumerate(TOUR) if s.facts is side_facts])
def test_a_placement_stop_quotes_each_panel_title_to_its_precision(at):
    """Stop 2 once said −0.05 where its panel said -0.0. The side-by-side chart draws every placement
    of :data:`views.PLACEMENTS` (Peri-LN among them); each one a story names is quoted as drawn."""
    stop = TOUR[at]
    side = _live(stop, {})[1]
    panels = {
        a["text"].split("<br>")[0]: a["text"] for a in side["layout"]["annotations"] if "<br>" in a["text"]
    }
    assert set(panels) >= {PLACEMENT_NAMES[n] for n in views.PLACEMENTS}, panels
    story, facts = stop.story(), stop.numbers()
    named = [n for n in views.PLACEMENTS if "{" + n + "}" in stop.notice]
    assert len(named) >= 3, named
    for norm in named:
        drawn = re.search(SLOPE, panels[PLACEMENT_NAMES[norm]]).group(1)
        assert facts[norm] == drawn and drawn in story, (norm, drawn, story)
        assert re.fullmatch(r"−?\d+\.\d\d", drawn), drawn  # two decimals, a true minus


def test_the_peri_stop_sets_peri_beside_post_and_pre_and_its_words_hold():
    """The Peri-LN stop: its own view is the Peri-LN block, its story quotes Post-LN, Pre-LN and
    Peri-LN, and says Peri-LN stays flat "as in Pre-LN" while Post-LN climbs: the drawn slopes agree
    (|slope| < 0.5 for both, Post-LN above 1). The chain-rule reason it gives is checked exactly in
    ``tests/test_block_peri.py`` and measured in the claim ``placement``."""
    [stop] = [s for s in TOUR if s.params.get("norm") == "peri"]
    assert stop.view().cfg.norm == "peri" and stop.view().cfg.describe().startswith("Peri-LN block")
    facts = {k: number(v) for k, v in stop.numbers().items()}
    assert all("{" + n + "}" in stop.notice for n in ("post", "pre", "peri"))
    assert abs(facts["peri"]) < 0.5 and abs(facts["pre"]) < 0.5 and facts["post"] > 1, facts
    assert "flat" in stop.notice and "as in Pre-LN" in stop.notice


def test_the_spectrum_stop_counts_the_eigenvalues_its_chart_draws_in_each_loss():
    stop = TOUR[2]
    story, facts = stop.story(), stop.numbers()
    for prefix, params in _settings(stop):
        sorted_eigs = _live(stop, params)[0]
        for term in ("outer", "full"):
            t = trace(sorted_eigs, term)  # the whole spectrum, not "(extremes)"
            lam = array(t["customdata"])
            spec = type("S", (), {"values": lam, "max_abs": float(np.abs(lam).max()), "size": lam.size})
            neg = negative_summary(spec)
            assert facts[prefix + term] == f"{neg.count:,}", (prefix, term, neg.count)
            assert facts[prefix + term] in story
            if term == "full":
                assert facts[prefix + "mass"] == f"{100 * neg.mass:.1f} %" and facts[prefix + "mass"] in story


def test_the_layernorm_stop_tells_the_shape_its_curve_has_at_each_epsilon():
    """Stop 5 once said the ε = 1e-6 curve 'levels off near σ ≈ √ε' over a curve that peaks and
    falls, drawn against √(σ² + ε) under an axis titled σ."""
    stop = TOUR[4]
    story, facts = stop.story(), stop.numbers()
    curves = {}
    for prefix, params in _settings(stop):
        at = run_page(f"pages/{stop.page}.py", **{**stop.params, **params})
        fig = figures(at)[0]
        assert x_title(fig) == "σ (std of the collapsing row)"
        t = trace(fig, views.LN_HESSIAN)
        x, h = array(t["x"]), array(t["y"])
        assert np.allclose(x, views.sigma_grid(LN_DECADES))  # the x axis is σ itself, evenly spread
        curves[prefix] = h
        shown = {m.label: m.value for m in at.get("metric")}
        assert facts[prefix + "slope"] == shown[f"slope {views.LN_HESSIAN_SLOPE}"]
        assert facts[prefix + "at_min"] == f"{h[np.argmin(x)]:.2g}" and facts[prefix + "at_min"] in story
        eps = float(stop.view(**params).cfg.ln_eps)
        top = int(np.argmax(h))
        if eps == 0:  # "exploding": rising all the way to the grid's smallest σ
            assert top == np.argmin(x) and np.all(np.diff(h) > 0)
            assert f"**{facts['slope']}**" in story
        else:  # peaks near √ε, then falls to the end
            assert 0 < top < len(x) - 1 and h[-1] < h[top] / 2 and np.all(np.diff(h[top:]) < 0)
            assert facts[prefix + "peak"] == f"{h[top]:.2g}" and facts[prefix + "peak_at"] == f"{x[top]:.2g}"
            for said in (facts[prefix + "peak"], facts[prefix + "peak_at"], facts[prefix + "root_eps"]):
                assert said in story
            assert np.sqrt(eps) / 4 <= x[top] <= np.sqrt(eps) * 4
            assert "levels off" not in story
    # "follows the same line until σ nears √ε": within 10 % of the ε = 0 curve for σ ≥ 4 √ε
    far = x >= 4 * np.sqrt(1e-6)
    assert np.allclose(curves["capped_"][far], curves[""][far], rtol=0.1)
