"""SmolLM2 on a student's own text on the hosted profile (issue 44, items 1 and 2).

Real model: the page computes a view that fits the hosted profile (4 s a view, 800 MiB for the whole
process) for a short typed text, reading the model's 30 layers one at a time and keeping only the layer
drawn; a view that does not fit says what to change, and the change it names draws the view. Every
stage runs under a spinner or a bar. No test here asserts a time: the estimates' accuracy is
``benchmarks/real_llm_estimates.py``'s business (``benchmarks/REAL_LLM.md``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")
from hessviz import pretrained  # noqa: E402
from tests.test_app_pages import run_page, titles  # noqa: E402

MODEL = "smollm2-135m"
pytestmark = pytest.mark.skipif(MODEL not in pretrained.available_models(), reason="SmolLM2 not installed")
SHORT = "The cat sat on the mat."


@pytest.fixture
def hosted(monkeypatch):
    """The hosted profile's limits (4 s per view, 800 MiB for the process, 400 MiB of it taken by the
    server as the other hosted tests assume), and an empty store bounded by them."""
    from hessviz.app import cache, gates, profiles, real_cache

    lim = profiles.limits_from_env(
        {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=400 << 20
    )
    ledger = gates.Ledger(lim.results_bytes)
    monkeypatch.setattr(cache, "LIMITS", lim)
    monkeypatch.setattr(cache, "LEDGER", ledger)
    monkeypatch.setattr(cache, "STORE", cache.Store(ledger, 3 * lim.max_seconds, lim.profile))
    monkeypatch.setattr(real_cache, "PRECOMPUTED", None)
    return cache


def said(at) -> str:
    return " ".join(m.value for m in [*at.warning, *at.info, *at.error, *at.caption])


def test_hosted_real_model_draws_smollm2_on_a_short_text_keeping_one_layer(hosted):
    at = run_page("pages/real_model.py", rm_model=MODEL, rm_text=SHORT)
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) >= 3, said(at)  # attention, the Hessian block, gradients, …
    assert "read one at a time" in said(at)
    kept = [k for k, _ in hosted.STORE.items()]
    assert not [k for k in kept if k[0] == "real_stack"]  # the 810 MiB stack was never held
    assert [k for k in kept if k[0] == "real_layer"] == [("real_layer", MODEL, 3)]


def _drawn_or_refused_with_advice_that_works(at) -> None:
    """The next-token view drew, or its refusal (the budget's warning, or the memory ledger's line:
    the window and the 226 MiB LM head together pass the hosted results budget) names the synthetic
    loss, and that change draws every view."""
    refusals = [w.value for w in at.warning] + [e.value for e in at.error]
    assert not any("is too large" in w or w[:1].islower() for w in refusals), refusals
    if refusals:
        assert "Loss = synthetic" in refusals[0], refusals
        at = run_page("pages/real_model.py", rm_model=MODEL, rm_text=SHORT, rm_loss="synthetic")
        assert not at.warning and not at.error, [e.value for e in at.error]
    assert at.get("plotly_chart")


def test_hosted_real_model_next_token_draws_or_names_a_change_that_works(hosted):
    at = run_page("pages/real_model.py", rm_model=MODEL, rm_text=SHORT, rm_loss="next token")
    assert "next-token loss" in at.info[0].value
    _drawn_or_refused_with_advice_that_works(at)


def test_whole_model_sends_a_students_text_to_the_view_that_computes_it(hosted):
    """SmolLM2's whole-model table is stored (one fixed text); the page names where a typed text is
    computed, and that link's view draws the model's next-token loss on the hosted profile."""
    at = run_page("pages/whole_model.py", wm_model=MODEL)
    link = [m.value for m in at.markdown if "On your own text" in m.value]
    assert link and f"real_model?rm_model={MODEL}&rm_loss=next+token" in link[0]
    at = run_page("pages/real_model.py", rm_model=MODEL, rm_loss="next token", rm_text=SHORT)
    assert "next-token loss" in at.info[0].value
    _drawn_or_refused_with_advice_that_works(at)


def test_a_window_that_does_not_fit_names_the_change_that_draws_it(hosted, monkeypatch):
    """A server whose budget holds one row of ``W_Q[0]`` under the synthetic loss but not under the
    next-token loss (its LM head): the refusal names the synthetic loss, in a sentence, and that change
    draws the window."""
    import dataclasses

    from hessviz.app import real_cache
    from hessviz.checks import cost

    cfg = real_cache.real_config(MODEL, SHORT)
    cols = cfg.shape_of("W_Q[0]")[1]
    synthetic = cost.real_window_cost(cfg, "W_Q[0]", cols).seconds
    own = cost.real_window_cost(cfg, "W_Q[0]", cols, pretrained.model_info(MODEL).vocab_size).seconds
    assert synthetic < own
    monkeypatch.setattr(
        hosted, "LIMITS", dataclasses.replace(hosted.LIMITS, max_seconds=(synthetic + own) / 2)
    )
    at = run_page("pages/real_model.py", rm_model=MODEL, rm_text=SHORT, rm_loss="next token")
    refusal = at.warning[0].value
    assert "Too much for this server" in refusal and "Choose a shorter text, or Loss = synthetic" in refusal
    assert not any("Hessian of W_Q[0]" in t for t in titles(at))
    at.segmented_control(key="rm_loss").set_value("synthetic").run()
    assert not at.exception
    assert any("Hessian of W_Q[0]" in t for t in titles(at)), titles(at)


def test_the_work_bound_stops_a_computation_while_it_runs(monkeypatch):
    """The bound counts the CPU of the computation still running (:meth:`Status.begin`): the first
    checkpoint past it stops the view, not the end of the computation (issue 44: 427 s of CPU under a
    bound of 360 s), and nothing half-done is cached. Here a bound of 0.05 s and 0.2 s of the test's own
    CPU clock before the first checkpoint (no timing is read)."""
    import time

    import numpy as np

    from hessviz.app import budget, cache, gates, progress

    clock = [0.0]
    monkeypatch.setattr(time, "thread_time", lambda: clock[0])

    def compute() -> np.ndarray:
        clock[0] += 0.2
        progress.current().checkpoint()
        return np.ones(2)

    store = cache.Store(gates.Ledger(2**20), work_limit=0.05, profile="test")
    status = progress.open_status("the test view")
    try:
        with pytest.raises(budget.OverBudget, match="The test view was stopped after"):
            store.get(("running",), compute, 64, "a result", seconds=1.0)
    finally:
        progress.close_status(status)
    assert ("running",) not in store


@pytest.mark.parametrize(
    "page, query", [("pages/scaling.py", {"sc_axis": "layers"}), ("pages/depth.py", {"layers": "3"})]
)
def test_hosted_stack_views_are_drawn_at_their_default_sizes(hosted, page, query):
    """The stack's carried curvature is priced as it runs (:data:`hessviz.checks.cost.STACK_CARRY`): these
    views were refused on the hosted profile at about 5 s against 4 s (issue 44, item 7)."""
    at = run_page(page, **query)
    assert not [w.value for w in at.warning if "Too much" in w.value]
    assert at.get("plotly_chart")


# ----------------------------------------------------------------------------- in Chromium

SPINNER = """() => [...document.querySelectorAll(
    '[data-testid="stSpinner"], [data-testid="stProgress"], [data-testid="stStatusWidget"]')]
    .some(e => e.getClientRects().length > 0)"""
"""Is a spinner, a progress bar or Streamlit's running indicator on screen?"""
BADGE = """() => { const s = getComputedStyle(document.querySelector('[data-testid="stApp"]'), '::after');
    return s.content.includes('Running') && parseFloat(s.opacity) > 0.5; }"""
"""Is the app's own running badge (:data:`hessviz.app.styles.RUNNING`) on screen?"""
STATE = """() => document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state')"""
LAST = """() => { const e = [...document.querySelectorAll('[data-testid="stMain"] :is(h1, h3),'
    + ' [data-testid="stAlert"], [data-testid="stMain"] [data-testid="stCaptionContainer"]')];
    return e.length ? e[e.length - 1].innerText.slice(0, 80) : '(nothing)'; }"""
"""The last heading, note or caption of the page (where a silent stretch happened)."""
SILENT_MAX = 2.0
"""Seconds a run may go on with nothing on screen saying that it works (issue 44: 338 s)."""


@pytest.mark.browser
@pytest.mark.slow
def test_smollm2_next_token_view_shows_work_all_along_on_a_phone():
    """SmolLM2's next-token view on a short text, on the hosted profile and a phone's screen: the page
    ends with its charts, or with the window refused in a line naming the change that draws it, and
    while it runs a spinner, a bar, Streamlit's indicator or
    the app's running badge is on screen: no stretch over :data:`SILENT_MAX` seconds without one
    (polled every 0.2 s; a stretch is counted in polls, so a slow poll on a busy machine does not make
    one). The stages' own spinners are seen too. The server is warmed by one run of the page first (its
    first run imports torch, before anything can be drawn). Bounded: 240 s."""
    import time
    from urllib.parse import quote

    from tests.streamlit_server import chromium, require_chromium, running_server

    require_chromium()
    env = {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB", "OMP_NUM_THREADS": "1"}
    query = f"rm_model={MODEL}&rm_loss=next+token&rm_text={quote(SHORT)}"
    with running_server("streamlit_llm_test.log", env) as srv, chromium() as b:
        ctx = b.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
        page = ctx.new_page()
        page.goto(f"{srv.base}/real_model")  # the server's first run imports torch (once per server)
        page.wait_for_function(f"({STATE})() === 'notRunning'", timeout=120_000)
        page.goto(f"{srv.base}/real_model?{query}")
        page.wait_for_function(f"({STATE})() === 'running'", timeout=60_000)
        silent, longest, where, spinners = 0, 0, "", 0
        deadline = time.monotonic() + 240
        while page.evaluate(STATE) == "running" and time.monotonic() < deadline:
            spinner = page.evaluate(SPINNER)
            spinners += spinner
            silent = 0 if spinner or page.evaluate(BADGE) else silent + 1
            if silent > longest:
                longest, where = silent, page.evaluate(LAST)
            page.wait_for_timeout(200)
        assert page.evaluate(STATE) == "notRunning", "still running after 240 s"
        assert longest * 0.2 <= SILENT_MAX, (
            f"{longest * 0.2:.1f} s with nothing saying it works, after {where!r}"
        )
        assert spinners > 0
        assert page.query_selector_all('[data-testid="stException"]') == []
        # the window's Hessian with the 226 MiB LM head passes a 1 GB host's results budget: refused in
        # one line that names the change that draws it (test_hosted_real_model_next_token_… follows it)
        errors = [e.inner_text() for e in page.query_selector_all('[data-testid="stAlertContentError"]')]
        assert all("Loss = synthetic" in e for e in errors), errors
        # the browser draws the charts after the run has ended (0.7 s later on a quiet machine): a count
        # taken at once found none in one full CI run
        want = 1 if errors else 3
        try:
            page.wait_for_function(
                f"document.querySelectorAll('.js-plotly-plot').length >= {want}", timeout=30_000
            )
        except Exception:  # noqa: BLE001 - Playwright's timeout: say what the page shows instead
            pytest.fail(
                f"fewer than {want} charts 30 s after the run; the page ends with {page.evaluate(LAST)!r}"
            )
        assert page.get_by_text("next-token loss", exact=False).count() >= 1
        ctx.close()
