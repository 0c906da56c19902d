"""The hosted app survives the public (issue 8): budget, gates, shared caches, hostile URLs, load.

It runs in-process and is quick: the profile's limits, the budget's verdict on the
heaviest URLs, the queue of the gate, the byte-bounded store, concurrent autograd references,
the outer term's spectrum from its range, and a list of hostile URLs under AppTest.

The cold-server sequence in Chromium (four concurrent visitors on the
heaviest pages, refusals, thirty distinct views, the server's memory and where a re-render's time
goes) is a measurement and lives in ``benchmarks/hosting.py``, which writes
``assets/screenshots/hosting.json``; the tests of ``test_app_crowd.py`` and ``test_app_load.py`` hold
the same guarantees on smaller crowds. No timing is asserted.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import hessviz as hv
from hessviz.app import budget, cache, gates, profiles, progress, runlog, state
from hessviz.app.registry import PAGES
from hessviz.checks import cost
from hessviz.matfree import spectra
from hessviz.runtime.tasks import usable_cores
from tests.test_app_pages import drawn

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
SMALL = {"L": "4", "d": "8", "dk": "4", "dff": "8"}
HOSTED = profiles.limits_from_env(
    {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=400 * 2**20
)

# ----------------------------------------------------------------------------- limits and costs


def test_hosted_profile_limits_come_from_one_setting():
    assert HOSTED.profile == "hosted"
    assert HOSTED.results_bytes == (800 - 400 - 128) * 2**20  # ceiling − baseline − headroom
    assert HOSTED.heavy == usable_cores()  # affinity and the cgroup's quota (tests/test_cli_guard.py)
    local = profiles.limits_from_env({})
    assert local.profile == "local" and local.max_seconds > HOSTED.max_seconds
    raised = profiles.limits_from_env(
        {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MAX_SECONDS": "30", "HESSVIZ_HEAVY": "3"}, baseline_bytes=0
    )
    assert (raised.max_seconds, raised.heavy) == (30.0, 3)
    with pytest.raises(ValueError, match="HESSVIZ_PROFILE"):
        profiles.limits_from_env({"HESSVIZ_PROFILE": "cloud"})


HEAVIEST = [  # the URLs of issue 8 that tied up the machine for minutes
    ("spectrum", dict(seq_len=64, d_model=32, d_k=32, d_ff=48), {"dense_limit": 2048, "k": 64}),
    ("bounds", dict(seq_len=64, d_model=64, d_k=64, norm="attention"), {"cases": 40}),
    (
        "ln_collapse",
        dict(seq_len=64, d_model=64, d_k=64, d_ff=256, norm="post"),
        {"points": 22 * 5, "whole": 0},
    ),
    ("verify", dict(seq_len=64, d_model=32, d_k=8, d_ff=24), {}),
    ("map", dict(seq_len=64, d_model=64, d_k=64, d_ff=256), {}),
]


@pytest.mark.parametrize("kind,fields,extra", HEAVIEST, ids=[h[0] for h in HEAVIEST])
def test_heaviest_urls_are_refused_with_what_to_change(kind, fields, extra):
    cfg = hv.BlockConfig(**fields)
    verdict = budget.check(budget.cost(kind, cfg, **extra), HOSTED, cfg)
    assert not verdict.ok
    assert "this server allows" in verdict.reason or "keeps at most" in verdict.reason
    assert "Lower d" in verdict.advice


@pytest.mark.parametrize(
    "kind",
    ["map", "spectrum", "verify", "learn", "bounds", "optimization", "spectrum_matfree", "heterogeneity"],
)
def test_default_view_is_affordable_when_hosted(kind):
    cfg = state.View.from_values({}).cfg
    assert budget.check(budget.cost(kind, cfg, dense_limit=2048, cases=40), HOSTED, cfg).ok


@pytest.mark.parametrize("kind", ["map", "spectrum", "spectrum_matfree", "heterogeneity"])
def test_real_layer_costs_grow_with_heads_and_layer_parts(kind):
    """More heads of the same width, and biases with γ/β, cost more; a dense term also costs more
    per entry with more heads at equal P (a product does not: its heads run batched, measured
    0.62 ms for 1 head of 8 and 0.56 ms for 8 heads of 1 at P = 1,536)."""
    base = dict(seq_len=8, d_model=16, d_ff=32, out_proj=True)
    one, four = hv.BlockConfig(d_k=8, n_heads=1, **base), hv.BlockConfig(d_k=8, n_heads=4, **base)
    full = hv.BlockConfig(d_k=8, n_heads=4, bias=True, ln_affine=True, **base)
    seconds = [budget.cost(kind, c).seconds for c in (one, four, full)]
    assert seconds[0] < seconds[1] < seconds[2]
    if kind in ("map", "spectrum"):
        eight = hv.BlockConfig(d_k=1, n_heads=8, **base)
        assert eight.num_params == one.num_params
        assert budget.cost(kind, eight).seconds > budget.cost(kind, one).seconds


def test_matrix_free_views_are_affordable_past_the_dense_limit():
    """The largest block the sidebar offers: the dense spectrum is refused even locally, the
    matrix-free spectrum fits the local profile, and the hosted refusal says what to lower."""
    cfg = hv.BlockConfig(
        seq_len=64, d_model=64, d_k=64, d_ff=256, n_heads=8, out_proj=True, bias=True, ln_affine=True
    )
    local = profiles.Limits("local", 8 << 30, 120.0, 2, 1 << 30)
    assert not budget.check(budget.cost("spectrum", cfg), local, cfg).ok
    assert budget.check(budget.cost("spectrum_matfree", cfg, terms=1), local, cfg).ok
    hosted = budget.check(budget.cost("spectrum_matfree", cfg), HOSTED, cfg)
    assert not hosted.ok and "Lower d" in hosted.advice


@pytest.mark.parametrize("axis", ["L", "d", "xnorm"])
def test_a_sweep_is_priced_at_its_costliest_grid_point(axis):
    """The Scaling page prices every point of a sweep at the grid's largest L or d: never less than
    the sum of each point's own cost, and for a sweep over L the same whatever the sidebar's L."""
    from hessviz.laws import sweeps

    grid, pair = sweeps.DEFAULT_GRIDS[axis], ("W_Q", "W_Q")
    for sidebar in ((2, 32, 32, 64), (64, 8, 4, 16)):
        cfg = hv.BlockConfig(**dict(zip(("seq_len", "d_model", "d_k", "d_ff"), sidebar)))
        largest = sweeps.largest_weight(cfg, axis, grid, pair)
        priced = budget.cost(
            "sweep", sweeps.costliest_config(cfg, axis, grid), points=len(grid), weight_count=largest
        ).seconds
        each = sum(
            budget.cost("sweep", c, weight_count=c.param_size("W_Q")).seconds
            for c in (sweeps.config_at(cfg, axis, g)[0] for g in grid)
        )
        assert priced >= each * (1 - 1e-12)
    if axis == "L":
        at = [
            budget.cost(
                "sweep",
                sweeps.costliest_config(hv.BlockConfig(seq_len=L, d_model=32, d_k=32), axis, grid),
                points=24,
                weight_count=1024,
            ).seconds
            for L in (2, 64)
        ]
        assert at[0] == at[1]


def test_the_issue_sweep_url_is_refused_on_the_hosted_profile():
    """``/scaling?sc_axis=L&sc_seeds=9&L=64&d=32&dk=32&dff=64`` (issue 16: ran 47 s): 8 seeds (the
    most offered), six lengths, four sweeps of a 1,024-weight block: refused before any work."""
    from hessviz.laws import sweeps

    cfg = state.View.from_values({"L": 64, "d": 32, "dk": 32, "dff": 64}).cfg
    grid = sweeps.DEFAULT_GRIDS["L"]
    c = budget.cost(
        "sweep",
        sweeps.costliest_config(cfg, "L", grid),
        points=len(grid) * 8 * 4,
        weight_count=sweeps.largest_weight(cfg, "L", grid, ("W_Q", "W_Q")),
    )
    assert not budget.check(c, HOSTED, cfg).ok


def test_the_depth_pages_default_view_is_affordable_when_hosted():
    """The Depth page prices each of its points at its own stack depth (3 placements, Post, Pre and
    Peri, × 2 seeds × the 2-block profile and stacks of 1…4 blocks,
    ``hessviz.checks.cost.sweep_point_cost``), not every point at the deepest stack: the default view is
    drawn on the hosted profile; twenty seeds are refused, saying what to lower. (The carried curvature
    is priced as it runs, ``hessviz.checks.cost.STACK_CARRY``: 0.8 s estimated for the default view;
    ``/depth?layers=3`` ran 1.25 s of CPU for the whole page, issue 44.)"""
    from hessviz.laws import sweeps

    view = state.View.from_values({})
    one = view.with_values(norm="post", layers=1).cfg
    weight_count = one.param_size("W_Q")
    points = budget.depth_points(one, 2, 2)
    assert sorted(p.n_layers for p in points) == sorted([2] * 12 + [1, 2, 3, 4] * 6)
    default = budget.cost("depth", one, depth=2, seeds=2, weight_count=weight_count)
    assert budget.check(default, HOSTED, one).ok
    deep = view.with_values(norm="post", layers=sweeps.DEFAULT_GRIDS["layers"][-1]).cfg
    deepest = budget.cost("sweep", deep, points=len(points), weight_count=weight_count)
    assert default.seconds < deepest.seconds
    many = budget.check(budget.cost("depth", one, depth=2, seeds=20, weight_count=weight_count), HOSTED, one)
    assert not many.ok and "this server allows" in many.reason


def test_a_view_stops_once_its_computations_pass_the_work_bound(monkeypatch):
    """Whatever the estimate missed, a run's priced computations stop at the next checkpoint once
    they have used more CPU than the bound (here 0.1 s); what was computed stays cached, and a
    computation without an estimate is not charged. The CPU clock is the test's own: each
    computation uses 0.04 s of it, so the count of points is exact and no timing is read."""
    clock = [0.0]
    monkeypatch.setattr(time, "thread_time", lambda: clock[0])

    def burn() -> np.ndarray:  # 0.04 s of the test's CPU clock
        clock[0] += 0.04
        return np.zeros(4)

    store = cache.Store(gates.Ledger(2**30), work_limit=0.1, profile="test")
    status = progress.open_status("the test sweep")
    try:
        store.get(("free",), burn, 64, "unpriced")  # no estimate: not charged
        assert status.work == 0
        done = []
        with pytest.raises(budget.OverBudget, match="stopped after .* s of computation"):
            for k in range(20):
                store.get(("point", k), burn, 64, "a point", seconds=0.01)
                done.append(k)
        assert done == [0, 1, 2] and all(("point", k) in store for k in done)  # 0.12 s > 0.1 s after three
        assert status.work == pytest.approx(0.12)
    finally:
        progress.close_status(status)


class _LeavesAfter:
    """A page status whose visitor leaves after ``n`` progress steps (what moving a control does)."""

    what = "the test"

    def __init__(self, n: int):
        self.n, self.calls = n, 0

    def checkpoint(self) -> None:
        self.calls += 1
        if self.calls > self.n:
            raise progress.Cancelled(self.what)

    def step(self, done: int, total: int, text: str = "") -> None:
        self.checkpoint()

    def waiting(self, place: int) -> None:
        self.checkpoint()

    def hold(self, gate):
        return gate.slot()

    def begin(self, limit: float, profile: str = "") -> None:
        pass

    def charge(self, seconds: float, limit: float, profile: str = "") -> None:
        pass


@pytest.mark.parametrize("view_of", ["matfree_spectrum", "block_table"])
def test_matrix_free_views_stop_when_the_visitor_leaves(view_of):
    """The library's progress callbacks reach the page's status; raising there cancels the run,
    and nothing half-done is cached."""
    key = state.View.from_values({"L": 4, "d": 8, "dk": 4, "dff": 8, "heads": 2, "wo": True}).key
    args = ("full", 3, 2, 10, 7) if view_of == "matfree_spectrum" else ("full", True, 9, 7)
    leaving = _LeavesAfter(3)
    progress._local.status = leaving
    try:
        with pytest.raises(progress.Cancelled):
            getattr(cache, view_of)(key, *args)
    finally:
        progress._local.status = None
    assert leaving.calls == 4  # stopped at the first check after the visitor left
    assert not [k for k in cache.STORE._items if k[0] == view_of and k[1] == key and k[-1] == 7]


def test_progress_bars_are_throttled_but_the_last_step_is_drawn():
    drawn = []
    bar = progress.throttled(lambda done, total: drawn.append(done), every=60)
    for i in range(1, 121):  # a sweep of 120 cached points
        bar(i, 120)
    assert drawn == [1, 120]


def test_run_log_times_each_script_run_only_when_asked(monkeypatch, capfd):
    from streamlit.runtime.scriptrunner_utils.exceptions import StopException

    with runlog.timed("spectrum"):
        pass
    assert capfd.readouterr().err == ""
    monkeypatch.setenv(runlog.ENV, "1")
    with runlog.timed("spectrum"):
        sum(range(10_000))
    with pytest.raises(StopException), runlog.timed("bounds"):
        raise StopException
    runs = runlog.parse(capfd.readouterr().err)
    assert [(r["page"], r["end"]) for r in runs] == [("spectrum", "finished"), ("bounds", "stopped")]
    assert all(r["wall_s"] >= 0 and r["cpu_s"] >= 0 for r in runs)


def test_the_store_logs_each_result_it_computes_once(monkeypatch, capfd):
    """One ``hessviz-compute`` line per computation, none for a result served from the store; the
    same key gives the same digest (how the load test finds a result computed twice)."""
    store = cache.Store(gates.Ledger(2**20))
    store.get(("quiet",), lambda: np.ones(2), 64, "x")
    assert capfd.readouterr().err == ""
    monkeypatch.setenv(runlog.ENV, "1")
    for k in ("a", "b", "a", "a"):
        store.get(("point", k), lambda: np.ones(2), 64, "x", seconds=0.3)
    store.clear()
    store.get(("point", "a"), lambda: np.ones(2), 64, "x", seconds=0.01)  # light: no gate
    lines = runlog.parse(capfd.readouterr().err, runlog.COMPUTE_PREFIX)
    assert [c["what"] for c in lines] == ["point"] * 3
    assert lines[0]["key"] == lines[2]["key"] != lines[1]["key"]
    assert [c["heavy"] for c in lines] == [True, True, False] and all(c["wall_s"] >= 0 for c in lines)


def test_figures_are_laid_out_once_in_the_theme_they_are_drawn_in():
    """The app draws every figure in its host's theme from the start (``plots.drawn_in``), so
    ``hva.chart`` does not replace a template; a download still gets the light one."""
    from hessviz import plots

    values = {"full": np.array([-1.0, 0.5, 2.0])}
    assert plots.spectrum_sorted(values).layout.template.layout.paper_bgcolor == "white"
    with plots.drawn_in("dark"):
        fig = plots.spectrum_sorted(values)
    assert fig.layout.template.layout.paper_bgcolor == "rgb(17,17,17)"
    fig.layout.template.layout.paper_bgcolor = "#123456"  # not replaced by a second call
    assert plots.apply_theme(fig, "dark").layout.template.layout.paper_bgcolor == "#123456"
    light = plots.apply_theme(go.Figure(fig), "light")
    assert light.layout.template.layout.paper_bgcolor == "white"
    with pytest.raises(ValueError, match="theme"), plots.drawn_in("sepia"):
        pass


# ----------------------------------------------------------------------------- gate and ledger


def test_gate_queues_in_arrival_order_and_reports_places():
    gate = gates.Gate(1)
    places: dict[str, list[int]] = {"b": [], "c": []}
    order: list[str] = []
    release = threading.Event()
    holding = threading.Event()

    def first():
        with gate.slot():
            holding.set()
            release.wait(10)
            order.append("a")

    def later(name: str):
        with gate.slot(lambda place: places[name].append(place), poll=0.02):
            order.append(name)

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert holding.wait(10)
    for name in ("b", "c"):
        threads.append(threading.Thread(target=later, args=(name,)))
        threads[-1].start()
        while gate.waiting < len(threads) - 1:
            time.sleep(0.01)
    deadline = time.monotonic() + 10  # each waiter has told its place at least once (no timing read)
    while not (places["b"] and places["c"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(10)
    assert order == ["a", "b", "c"]
    assert places["b"][0] == 1 and places["c"][0] == 2  # their place in line while waiting
    assert gate.running == 0 and gate.waiting == 0


def test_gate_forgets_a_visitor_who_gives_up():
    gate = gates.Gate(1)
    outcome = []

    class Left(Exception):
        pass

    def leave(place: int) -> None:
        raise Left

    def visitor():
        try:
            with gate.slot(leave, poll=0.01):
                outcome.append("ran")
        except Left:
            outcome.append("left")

    with gate.slot():
        t = threading.Thread(target=visitor)
        t.start()
        t.join(10)
    assert outcome == ["left"]
    assert gate.waiting == 0 and gate.running == 0
    with gate.slot():  # and the gate is free again
        assert gate.running == 1


class _LeavesWhenQueued(_LeavesAfter):
    """A page status whose visitor leaves as soon as they are told their place in the queue."""

    def waiting(self, place: int) -> None:
        raise progress.Cancelled(self.what)

    def hold(self, gate):
        return gate.slot(self.waiting, poll=0.01)


def test_light_work_does_not_queue_behind_heavy_work():
    """With every heavy slot taken, a computation under ``LIGHT_SECONDS`` runs at once; a heavy one
    queues (and its visitor, told their place, leaves)."""
    store = cache.Store(gates.Ledger(2**20))
    release = threading.Event()
    holders = [threading.Event() for _ in range(cache.GATE.slots)]
    threads = [threading.Thread(target=_hold, args=(ready, release)) for ready in holders]
    for t in threads:
        t.start()
    try:
        assert all(ready.wait(10) for ready in holders) and cache.GATE.running == cache.GATE.slots
        progress._local.status = _LeavesWhenQueued(100)
        light = store.get(
            ("light",), lambda: np.ones(2), 64, "a light result", seconds=budget.LIGHT_SECONDS / 2
        )
        assert light.tolist() == [1.0, 1.0]
        with pytest.raises(progress.Cancelled):
            store.get(("heavy",), lambda: np.ones(2), 64, "a heavy result", seconds=2 * budget.LIGHT_SECONDS)
    finally:
        progress._local.status = None
        release.set()
        for t in threads:
            t.join(10)
    assert ("heavy",) not in store and cache.GATE.running == 0


def _hold(ready: threading.Event, release: threading.Event) -> None:
    with cache.GATE.slot():
        ready.set()
        release.wait(10)


def test_store_is_bounded_by_bytes_and_evicts_least_recent():
    ledger = gates.Ledger(3 * 2**20)
    store = cache.Store(ledger)
    mib = lambda: np.zeros(2**17)  # noqa: E731 - 1 MiB of float64
    for k in range(5):
        store.get(("k", k), mib, 2**20, "a test result")
        assert ledger.cached <= ledger.capacity
    assert len(store) <= 3 and ledger.in_flight == 0
    assert ("k", 4) in store and ("k", 0) not in store
    with pytest.raises(hv.SizeError, match="keeps at most"):
        store.get(("huge",), mib, 4 * 2**20, "a huge result")
    store.clear()
    assert ledger.cached == 0 and len(store) == 0


def test_evicting_collects_the_cycles_that_still_hold_an_evicted_result():
    """Streamlit's collection after every script run is off (``.streamlit/config.toml``): a page
    run's namespace, a reference cycle, may still hold a result when the store evicts it, so the
    store collects then, and the result's memory is given back when it is wanted."""
    import gc
    import weakref

    store = cache.Store(gates.Ledger(3 * 2**20))
    result = store.get(("held",), lambda: np.zeros(2**17), 2**20, "a test result")
    held = weakref.ref(result)
    namespace: dict = {"result": result}
    namespace["self"] = namespace  # a cycle, as a page's module dict and its functions make
    del result, namespace
    enabled = gc.isenabled()
    gc.disable()  # only the eviction's own collection may free it
    try:
        assert held() is not None
        store.evict(2**20)
        assert held() is None and ("held",) not in store
    finally:
        if enabled:
            gc.enable()


def test_ledger_nested_reservation_is_checked_and_small_results_outlive_large():
    """A nested reservation counts with its thread's others: one that would pass the capacity is
    refused (issue 43: in flight reached 279 MiB against 100 MiB), one that fits is added and
    given back when it ends, and a thread that holds memory never queues for a slot."""
    ledger = gates.Ledger(100)
    with ledger.reserve(80, "a spectrum"):
        with pytest.raises(hv.SizeError, match="inside another computation"):
            with ledger.reserve(50, "its term"):
                pass
        with ledger.reserve(15, "its summary"):
            assert ledger.in_flight == 95
        assert ledger.in_flight == 80
        with pytest.raises(gates.Retry) as retry:
            with gates.Gate(1).slot():  # a slot, then memory: never the other way round
                pass
        assert retry.value.slot
    assert ledger.in_flight == 0 and not ledger.holding() and not gates.holding_memory()
    store = cache.Store(gates.Ledger(10 * 2**20))
    store.get(("small",), lambda: np.zeros(8), 64, "a sweep point")
    for k in range(3):
        store.get(("big", k), lambda: np.zeros(2**19), 4 * 2**20, "a term")  # 4 MiB each
    assert ("small",) in store and ("big", 0) not in store  # the oldest large one went first


def _threads(*targets, timeout: float = 30.0) -> list[str]:
    """Run ``targets`` in threads and join them with ``timeout``: the problems, with a deadlock
    (a thread still alive) reported as one rather than hanging the test."""
    problems: list[str] = []

    def run(target):
        try:
            target()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            problems.append(repr(err))

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [f"{t.name} still waiting after {timeout:g} s: a deadlock" for t in threads if t.is_alive()]
    return problems + stuck


def test_nested_ledger_reservations_from_many_visitors_never_pass_capacity():
    """Issue 43, item 3: six visitors each compute a result (40 MiB) whose computation needs another
    (40 MiB) under a 100 MiB capacity. Nested reservations used to skip the check (in flight reached
    279 MiB against 100); now one such pair fits at a time, the others wait without holding memory
    (:class:`hessviz.app.gates.Retry`), and everyone gets their result."""
    mib = 2**20
    ledger = gates.Ledger(100 * mib)
    store = cache.Store(ledger)
    seen: list[int] = []

    def inner(i: int) -> np.ndarray:
        seen.append(ledger.in_flight)
        time.sleep(0.05)
        seen.append(ledger.in_flight)
        return np.full(4, float(i))

    def visitor(i: int) -> None:
        def outer() -> np.ndarray:
            seen.append(ledger.in_flight)
            return 2 * store.get(("inner", i), lambda: inner(i), 40 * mib, "the inner result", seconds=0.0)

        value = store.get(("outer", i), outer, 40 * mib, "the outer result", seconds=0.0)
        assert value.tolist() == [2.0 * i] * 4

    assert not _threads(*(lambda i=i: visitor(i) for i in range(6)))
    assert max(seen) <= ledger.capacity, f"in flight reached {max(seen) / mib:.0f} MiB"
    assert max(seen) == 80 * mib and ledger.in_flight == 0  # a pair held both, and all was given back


@pytest.mark.parametrize("first", ["memory", "slot"])
def test_gate_and_ledger_from_two_visitors_in_both_orders_complete(monkeypatch, first):
    """Issue 43, item 3: visitor A holds 50 of 100 MiB for a light result whose computation turns
    out to need a heavy one (a slot and 50 MiB more), while visitor B holds the only slot and asks
    for 60 MiB. The gate and the ledger were taken in opposite orders and the two waited for each
    other forever; now A, holding memory, does not queue for the slot: it gives its memory back and
    starts again, a slot first. Either may arrive first; both finish (a deadlock fails at the
    join's timeout instead of hanging)."""
    mib = 2**20
    monkeypatch.setattr(cache, "GATE", gates.Gate(1))
    ledger = gates.Ledger(100 * mib)
    store = cache.Store(ledger)
    a_holds, b_holds = threading.Event(), threading.Event()
    out: dict[str, object] = {}

    def heavy(name: str, value: float, nbytes: int) -> np.ndarray:
        return store.get((name,), lambda: np.full(2, value), nbytes, name, seconds=2 * budget.LIGHT_SECONDS)

    def a() -> None:
        if first == "slot":
            assert b_holds.wait(10)
        attempts = []

        def light() -> np.ndarray:
            attempts.append(ledger.in_flight)
            a_holds.set()
            if first == "memory":
                assert b_holds.wait(10)
            return heavy("a's heavy part", 1.0, 50 * mib) + 1

        out["a"] = store.get(("a's light view",), light, 50 * mib, "a light view", seconds=0.0).tolist()
        out["a attempts"] = len(attempts)

    def b() -> None:
        if first == "memory":
            assert a_holds.wait(10)
        with cache.GATE.slot():
            b_holds.set()
            if first == "slot":
                assert a_holds.wait(10)
            out["b"] = heavy("b's heavy view", 3.0, 60 * mib).tolist()

    assert not _threads(a, b, timeout=30.0)
    assert out["a"] == [2.0, 2.0] and out["b"] == [3.0, 3.0]
    assert out["a attempts"] == 2  # A gave its memory back once, and started again with the slot
    assert ledger.in_flight == 0 and cache.GATE.running == 0 and cache.GATE.waiting == 0


class _SaysWhenWaiting(_LeavesAfter):
    """A page status that sets ``event`` when it is told to wait (and never leaves)."""

    def __init__(self, event: threading.Event):
        super().__init__(10**9)
        self.event = event

    def waiting(self, place: int) -> None:
        self.event.set()


def test_visitors_holding_memory_wait_only_for_a_result_that_is_computing():
    """Visitors A and C each hold 30 of 100 MiB for a result whose computation needs the same term
    (50 MiB), which visitor B asks for first and must wait for memory for. B used to register the
    term as its own before waiting: A and C then waited for B's term while B waited for their
    memory. B now registers once it holds its memory, so A and C, finding nobody computing the
    term, try to compute it themselves (or start over without their memory), and all three finish.
    All light (no slot), so that memory alone decides."""
    mib = 2**20
    ledger = gates.Ledger(100 * mib)
    store = cache.Store(ledger)
    holds = {"a": threading.Event(), "c": threading.Event()}
    b_waits = threading.Event()
    out: dict[str, list[float]] = {}

    def term() -> np.ndarray:
        return store.get(("term",), lambda: np.ones(2), 50 * mib, "the term", seconds=0.0)

    def outer(name: str) -> None:
        def compute() -> np.ndarray:
            holds[name].set()
            assert b_waits.wait(10)
            return term() * 5

        out[name] = store.get(("result", name), compute, 30 * mib, "a result", seconds=0.0).tolist()

    def b() -> None:
        assert all(e.wait(10) for e in holds.values())
        progress._local.status = _SaysWhenWaiting(b_waits)
        try:
            out["b"] = term().tolist()
        finally:
            progress._local.status = None

    assert not _threads(lambda: outer("a"), lambda: outer("c"), b, timeout=30.0)
    assert out == {"a": [5.0, 5.0], "c": [5.0, 5.0], "b": [1.0, 1.0]} and ledger.in_flight == 0


def test_ledger_keeps_the_cache_while_work_in_flight_leaves_no_room():
    """Another visitor's computation holds 70 of 100 MiB: a 50 MiB reservation waits for it and
    leaves the 28 MiB of cached results alone (emptying the cache would not have made room);
    once that computation ends, there is room for both."""
    ledger = gates.Ledger(100 * 2**20)
    store = cache.Store(ledger)
    for k in range(4):
        store.get(("kept", k), lambda: np.zeros(7 * 2**17), 7 * 2**20, "a result")  # 7 MiB each
    holding, release = threading.Event(), threading.Event()

    def other_visitor():
        with ledger.reserve(70 * 2**20, "another visitor's view"):
            holding.set()
            release.wait(10)

    t = threading.Thread(target=other_visitor)
    t.start()
    assert holding.wait(10)
    cached_while_waiting = []

    def waiting(place: int) -> None:
        cached_while_waiting.append(len(store))
        if len(cached_while_waiting) == 3:
            release.set()

    with ledger.reserve(50 * 2**20, "a view", waiting, poll=0.01):
        assert cached_while_waiting[:3] == [4, 4, 4] and len(store) == 4
    t.join(10)
    assert ledger.in_flight == 0


def test_ledger_keeps_the_measured_process_under_its_ceiling():
    """The accounting has room (28 of 100 MiB cached), but the process, measured, holds 80 MiB
    besides the cache: a 10 MiB reservation under a 173 MiB ceiling (64 MiB slack) first evicts
    the two oldest results. While another visitor's computation is in flight it waits for it with
    the cache kept, then evicts; with nothing left to evict and nothing in flight it goes ahead."""
    mib = 2**20
    base = [80 * mib]
    ledger = gates.Ledger(100 * mib, ceiling=173 * mib, rss=lambda: base[0] + ledger.cached)
    store = cache.Store(ledger)
    for k in range(4):
        store.get(("kept", k), lambda: np.zeros(7 * 2**17), 7 * mib, "a result")  # 7 MiB each
    assert len(store) == 4  # 80 + 28 + 64 slack is still under 173
    with ledger.reserve(10 * mib, "a view"):
        assert [k for k in [("kept", i) for i in range(4)] if k in store] == [("kept", 2), ("kept", 3)]
    holding, release, kept = threading.Event(), threading.Event(), []

    def other_visitor():  # its work in flight is part of what is measured
        with ledger.reserve(5 * mib, "another visitor's view"):
            holding.set()
            release.wait(10)

    def waiting(place: int) -> None:
        kept.append(len(store))
        if len(kept) == 3:
            release.set()

    t = threading.Thread(target=other_visitor)
    t.start()
    assert holding.wait(10)
    base[0] = 100 * mib  # 100 + 14 + 10 + 64 is over 173 while it computes
    with ledger.reserve(10 * mib, "a view", waiting, poll=0.01):
        assert kept[:3] == [2, 2, 2] and len(store) < 2  # waited with the cache kept, then evicted
    t.join(10)
    base[0] = 200 * mib  # over the ceiling with an empty cache
    store.clear()
    with ledger.reserve(10 * mib, "a view", poll=0.01):
        assert ledger.in_flight == 10 * mib
    assert gates.Ledger(10, rss=lambda: 10**12).process_over(5) == 0  # no ceiling: not measured


@pytest.mark.slow  # a load test
def test_memory_stays_bounded_over_thirty_views():
    """Thirty distinct views through one store: what the process holds grows by the store's bound,
    not by thirty Hessians (6 MiB each here, 180 MiB in all)."""
    ledger = gates.Ledger(24 * 2**20)
    store = cache.Store(ledger)
    start = gates.rss_bytes()
    for i in range(30):
        view = state.View.from_values({"L": 8, "d": 12, "dk": 4 + i % 8, "dff": 24, "seed": 500 + i})

        def compute(view=view):
            params, X, Y = view.inputs
            return hv.hessian(view.cfg, params, X, Y).term("full").numpy()

        store.get(("term", view.key), compute, cost.term_cost(view.cfg).bytes, "a term")
        assert ledger.cached <= ledger.capacity
    assert len(store) < 30
    if start:  # /proc available
        assert gates.rss_bytes() - start < ledger.capacity + 64 * 2**20


def test_store_shares_one_computation_between_visitors():
    store = cache.Store(gates.Ledger(2**30))
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.3)
        return np.ones(3)

    out = []
    threads = [
        threading.Thread(target=lambda: out.append(store.get(("same",), slow, 64, "x"))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and len(out) == 3
    assert not out[0].flags.writeable  # cached results are read-only


@pytest.mark.slow  # a load test
def test_concurrent_autograd_references_do_not_collide():
    """Three visitors open Verify at once (issue 8: forward-AD level errors in 3 of 3 sessions)."""
    keys = [
        state.View.from_values({**{k: int(v) for k, v in SMALL.items()}, "seed": s}).key
        for s in (200, 201, 202)
    ]
    errors, results = [], []

    def visit(key):
        try:
            results.append(cache.verify(key))
        except Exception as err:  # noqa: BLE001 - collected and reported below
            errors.append(repr(err))

    threads = [threading.Thread(target=visit, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(max(float(np.max(r["rel_err"][t])) for t in r["rel_err"]) < 1e-10 for r in results)


# ----------------------------------------------------------------------------- spectrum of the outer term


def test_outer_spectrum_from_its_range_matches_dense():
    cfg = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=6)
    params = hv.init_params(cfg, seed=1)
    X, Y = hv.sample_inputs(cfg, seed=1)
    H = hv.hessian(cfg, params, X, Y).outer
    rank = cfg.seq_len * cfg.d_model
    got = spectra.eigenvalues(H, dense_limit=8, rank=rank)
    assert "range" in got.method and not got.partial and got.values.size == cfg.num_params
    want = np.sort(torch.linalg.eigvalsh(H).numpy())
    assert np.allclose(got.values, want, atol=1e-12 * np.abs(want).max())
    assert spectra.negative_summary(got).count == 0  # still positive semi-definite


# ----------------------------------------------------------------------------- hostile URLs (AppTest)

HOSTILE = [  # query, what the caption must then say, what the one-line note must mention
    ({"L": "100000"}, "L = 64", "L=100000 is out of range"),
    ({"L": ["4", "16"]}, "L = 16", "given 2 times"),
    ({"L": "nan"}, "L = 8", "is not an integer"),
    ({"d": "inf"}, "d = 16", "is not an integer"),
    ({"L": "1e999"}, "L = 8", "is not an integer"),
    ({"L": "9" * 5000}, "L = 8", "…"),
    ({"xnorm": "1e9"}, "‖X‖₂ = 100", "nearest"),
    ({"eps": "-1"}, "Post-LN", "nearest"),
    ({"seed": "-3"}, "seed 0", "out of range"),
    ({"norm": "<script>alert(1)</script>"}, "Post-LN", "norm=<script>alert(1)</script> is not one of"),
    ({"act": "x" * 10_000}, "ReLU", "…"),
    ({"term": "<img src=x onerror=alert(1)>"}, "Post-LN", "is not one of full, outer, functional"),
    ({"blk": "W_Q,W_X`"}, "Post-LN", "is not one of"),
    ({"heads": "1.2"}, "Post-LN", "is not an integer"),
    ({"wo": "maybe"}, "Post-LN", "is not true or false"),
]


@pytest.mark.parametrize("query,caption,note", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_url_is_clamped_or_refused_with_an_escaped_line(query, caption, note):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page(str(PAGES / "hessian_map.py"))
    for k, v in {"d": "8", "dff": "8", **query}.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert caption in at.main.get("caption")[0].value
    notes = [w.value for w in at.warning]
    assert any(note in drawn(n) for n in notes), notes
    for n in notes:  # every line is plain text (each Markdown character escaped), and short
        for line in n.split("  \n"):
            assert state.plain(drawn(line)) == line and len(drawn(line)) < 300, line


def test_page_control_keeps_allowed_values_of_a_repeated_key():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page(str(PAGES / "spectrum.py"))
    for k, v in {**SMALL, "spec_terms": ["outer", "<b>x</b>", "full"]}.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception
    assert any("ignored them" in w.value for w in at.warning)  # plain text: no Markdown in the words
    sorted_plot = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [t["name"] for t in sorted_plot["data"]] == ["full", "outer"]
