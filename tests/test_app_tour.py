"""The classroom tour's stories quote their live views (issue 33): the numbers a story prints are
the fitted slope and the curve the stop's page draws, computed here a second way (straight from
:mod:`hessviz.laws.sweeps` and :mod:`hessviz.experiments.ln_collapse`, not through the app's cache).
The browser test (``tests/test_browser_tour.py``) checks every stop's bold numbers against the text
of its live view."""

from __future__ import annotations

import string

import numpy as np

from hessviz.app.tour import TOUR
from hessviz.experiments.ln_collapse import ln_sweep, sigma_axis
from hessviz.laws import sweeps
from hessviz.laws.fitting import pooled_power_law_fit


def _fields(notice: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(notice) if name}


def test_every_story_is_filled_from_its_view_and_its_instructions_can_be_followed():
    for stop in TOUR:
        assert _fields(stop.notice), f"{stop.title}: the story quotes no number of its view"
        assert stop.facts is not None
        assert "sidebar" not in stop.notice, f"{stop.title}: the live view has no sidebar"
        if "switch" in stop.notice.lower():  # the setting to switch is offered over the live view
            assert stop.variants and f"*{stop.choice[0]}*" in stop.notice, stop.title


def test_the_length_stop_quotes_the_slope_its_chart_fits():
    stop = TOUR[3]
    assert stop.params["sc_axis"] == "L" and stop.params["norm"] == "attention"
    pair = ("W_Q", "W_Q")
    seeds = range(int(stop.params["sc_seeds"]))
    result = sweeps.sweep(
        stop.view().cfg,
        "L",
        sweeps.DEFAULT_GRIDS["L"],
        seeds,
        lambda c, x, s: sweeps.point(c, x, s, pair),
        input_norm=stop.view().input_norm,
    )
    slope = sweeps.fits(result, "attention", pair)["outer"].slope
    story = stop.story()
    assert f"**{slope:.2f}**".replace("-", "−") in story, story
    assert "near −3" not in story and -3.2 < slope < -2.0


def test_the_layernorm_stop_quotes_its_chart_and_the_capped_variant():
    stop = TOUR[4]
    sig = np.logspace(0, -4, 13)
    story = stop.story()
    for eps, field in ((0.0, "slope"), (1e-6, None)):
        view = stop.view(eps=f"{eps:g}")
        r = ln_sweep(sig, eps, m=view.cfg.seq_len, n=view.cfg.d_model, seeds=(0, 1))
        x = sigma_axis(r)
        h_min = np.exp(np.log(r["H"]).mean(axis=0))[np.argmin(x)]
        assert f"{h_min:.2g}" in story, (eps, story)
        if field:
            slope = pooled_power_law_fit(x, r["H"], hi=1e-2, n_boot=0).slope
            assert f"**{slope:.2f}**".replace("-", "−") in story, story
