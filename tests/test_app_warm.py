"""The background warmer (:mod:`hessviz.app.warm`): it waits for a class and for an idle server,
stays out of memory's way, stops when told, and warms the Scaling views one step away."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("streamlit")

from hessviz.app import views, warm  # noqa: E402
from hessviz.app.address import Lesson  # noqa: E402
from hessviz.app.state import DEFAULTS, View  # noqa: E402


def _until(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


class Recorder:
    """Jobs that record when they ran, in ``chunks`` calls of ``pause``."""

    def __init__(self, n: int, chunks: int = 3):
        self.made: list[int] = []
        self.jobs = [warm.Job(("test_warm", time.time_ns(), i), self._make(i, chunks)) for i in range(n)]

    def _make(self, i: int, chunks: int):
        def make(pause):
            for _ in range(chunks):
                pause()
            self.made.append(i)

        return make


def test_a_view_is_warmed_once_a_second_visitor_sees_it_and_only_while_no_run_is_in_progress():
    w = warm.Warmer(room=lambda: True, idle_s=0.05)
    rec = Recorder(2)
    try:
        assert not w.offer(("view",), "session a", lambda: rec.jobs)  # a lone visitor: nothing
        assert not w.offer(("view",), "session a", lambda: rec.jobs)  # the same one again
        with w.serving():  # a visitor's run is in progress
            assert w.offer(("view",), "session b", lambda: rec.jobs)
            time.sleep(0.3)
            assert rec.made == [] and w.pending() + len(rec.made) >= 1
        assert _until(lambda: rec.made == [0, 1]), rec.made
        assert w.warmed == 2
        assert not w.offer(("view",), "session c", lambda: rec.jobs)  # offered once per view
    finally:
        w.stop()


def test_warming_stops_and_drops_what_is_pending_when_memory_is_short():
    short = threading.Event()
    w = warm.Warmer(room=lambda: not short.is_set(), idle_s=0.01)
    rec = Recorder(3)
    short.set()
    try:
        w.offer(("view",), "a", lambda: rec.jobs)
        w.offer(("view",), "b", lambda: rec.jobs)
        assert _until(lambda: w.pending() == 0)
        time.sleep(0.1)
        assert rec.made == [] and w.warmed == 0
    finally:
        w.stop()


def test_stop_ends_the_thread_between_chunks():
    w = warm.Warmer(room=lambda: True, idle_s=0.01)
    started = threading.Event()

    def slow(pause):
        started.set()
        while True:
            pause()
            time.sleep(0.01)

    w.offer(("view",), "a", lambda: [warm.Job(("test_warm", "slow", time.time_ns()), slow)])
    w.offer(("view",), "b", lambda: [warm.Job(("test_warm", "slow", time.time_ns()), slow)])
    assert started.wait(5)
    w.stop(timeout=5)
    assert not w._thread.is_alive()
    assert not w.offer(("other",), "a", list) and not w.offer(("other",), "b", list)


def test_the_lesson_links_neighbours_are_one_step_on_each_open_slider_and_are_made_as_the_page_makes_them():
    """``/scaling?norm=attention&sc_axis=xnorm&hide=norm,L``: one step up on each open slider first
    (d, d_k, heads, ‖X‖₂, then the page's seeds), then down; never the hidden L or placement, never
    a view the budget prices over the warmer's bound (a stack of two layers); d_ff and ε do not
    apply to attention alone. A job makes the view the page would read: in the app's theme, kept."""
    view = View.from_values({**DEFAULTS, "norm": "attention"})
    jobs = views.scaling_neighbours(view, "xnorm", "W_Q,W_Q", 3, 0, Lesson(frozenset({"norm", "L"})))
    moved = []
    for j in jobs:
        _, _, values, axis, pair, seeds, layer = j.key
        changed = {k: v for k, v in dict(values).items() if view.values[k] != v}
        assert (axis, pair, layer) == ("xnorm", "W_Q,W_Q", 0)
        moved.append((changed, seeds))
    assert moved[:4] == [({"d": 17}, 3), ({"dk": 9}, 3), ({"heads": 2, "wo": True}, 3), ({"xnorm": 2.0}, 3)]
    assert ({"dk": 7}, 3) in moved and ({}, 4) in moved and ({}, 2) in moved
    assert all(not {"L", "norm", "dff", "eps", "layers"} & set(c) for c, _ in moved)
    assert len(jobs) <= warm.MAX_VIEWS

    small = View.from_values({**DEFAULTS, "norm": "attention", "L": 4, "d": 8, "dk": 4})
    near = views.scaling_neighbours(small, "xnorm", "W_Q,W_Q", 1, 0, Lesson(frozenset({"norm", "L", "d"})))
    job = next(j for j in near if dict(j.key[2])["dk"] == 5)
    w = warm.Warmer(room=lambda: True, idle_s=0.01)
    try:
        w.offer(("small",), "a", lambda: [job])
        w.offer(("small",), "b", lambda: [job])
        assert _until(lambda: w.warmed == 1, timeout=60)
    finally:
        w.stop()
    _, _, values, axis, pair, seeds, layer = job.key
    made = views.cached_scaling(View.from_values(dict(values)), axis, pair, seeds, layer)
    assert made is not None and made.figure._hessviz_theme == "host"  # laid out as the app shows it


def test_a_failure_listing_the_neighbours_never_reaches_the_page():
    w = warm.Warmer(room=lambda: True, idle_s=0.01)

    def broken() -> list:
        raise RuntimeError("a bug in a page's neighbours")

    try:
        assert not w.offer(("view",), "a", broken)
        assert not w.offer(("view",), "b", broken)
        assert w.pending() == 0
    finally:
        w.stop()
