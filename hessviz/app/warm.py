"""The next step made before it is asked: views one step away, computed while the server is idle.

A class on a lesson link moves together ("now d_k = 9"): thirty visitors ask for one new view at
once, and wait for it. Once a view has been shown to :data:`VISITORS` sessions (a class, a shared
link; a lone visitor starts nothing), its page offers the views one step away on each control the
page leaves open (:func:`steps`: one step up on each slider, in the order the sidebar and the page
draw them, then one step down on each: a lesson walks a control forward, and the step back is
usually to the view the class came from), and one background thread computes them into the store
of the server (:mod:`hessviz.app.cache`), where the class then finds them. The rules:

* **Only when idle: the lowest priority in the server.** A view is computed only while no script
  run is in progress, and none has been for :data:`IDLE_S`; between chunks (a sweep point, a few
  milliseconds) it waits while any visitor's run goes on, so a visitor waits at most for one
  chunk or one figure. One view at a time, in one daemon thread. (Its OS priority is the
  server's: on a host the visitors' runs are the work it must yield to, and it does; a lower
  nice value only starved it behind other processes on a shared machine.)
* **Bounded.** At most :data:`MAX_VIEWS` views per view offered, each priced by the budget at
  most :data:`MAX_SECONDS` core-seconds and affordable under the server's limits (a view the page
  would refuse is never warmed); the pending list keeps the :data:`MAX_PENDING` newest, the most
  recently offered view's neighbours first. A view already in the store is skipped.
* **Never at memory's expense.** Nothing is warmed while the process is within
  :data:`HEADROOM_BYTES` (plus the ledger's slack) of its ceiling, or while the store could not take
  the view without evicting a result (:func:`room`): warming never evicts anything; it stops, and
  drops what is pending, when memory gets short.
* **Cancellable.** :meth:`Warmer.stop` ends the thread after its current chunk; a failure while
  warming is dropped (the visitor who asks for that view computes it and sees the message).
* **Where.** On in the hosted profile, off in the local one; ``HESSVIZ_WARM=1`` or ``0`` says so
  for any server.

With ``HESSVIZ_RUN_LOG=1`` each view the warmer works on prints one line
(:func:`hessviz.app.runlog.warmed`), with the CPU it used, so a load test can tell the warmer's
work from the visitors'.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from hessviz import plots
from hessviz.app import cache, runlog, settings
from hessviz.app.settings import AppSetting

ENV = "HESSVIZ_WARM"
_log = logging.getLogger(__name__)
VISITORS = 2
"""Sessions that must have been shown a view before its neighbours are warmed."""
IDLE_S = 0.25
"""Seconds without any script run before warming (re)starts."""
MAX_VIEWS = 12
"""Neighbours warmed per view offered."""
MAX_PENDING = 24
MAX_SECONDS = 2.0
"""The largest budget estimate (core-seconds) of a view that is warmed."""
HEADROOM_BYTES = 96 * 2**20
"""Kept free under the process ceiling, besides the ledger's own slack, before anything is warmed."""
VIEW_BYTES = 4 * 2**20
"""Room a warmed view must find in the store without evicting (its points' reservations, its figures)."""


def enabled(env: Mapping[str, str] | None = None, profile: str | None = None) -> bool:
    """Whether warming is on: ``HESSVIZ_WARM`` (``1`` or ``0``) when set, else on in the hosted
    profile (a public server, where classes meet) and off in the local one (one visitor).

    >>> enabled({}, "hosted"), enabled({}, "local"), enabled({"HESSVIZ_WARM": "0"}, "hosted")
    (True, False, False)
    """
    word = (os.environ if env is None else env).get(ENV, "").strip().lower()
    if word:
        return word not in ("0", "false", "no", "off")
    return (cache.LIMITS.profile if profile is None else profile) == "hosted"


@dataclass(frozen=True)
class Job:
    """One view to warm: its store key, and ``make(pause)``, which computes it and calls ``pause()``
    between chunks (``pause`` waits while visitors' runs go on, and raises to stop)."""

    key: tuple
    make: Callable[[Callable[[], None]], object]


class Stop(Exception):
    """Raised by :meth:`Warmer.pause`: stopped, or memory is short."""


def room(nbytes: int = VIEW_BYTES) -> bool:
    """Whether ``nbytes`` more fit in the store without evicting, and the process is not within
    :data:`HEADROOM_BYTES` of its ceiling (:class:`hessviz.app.gates.Ledger`)."""
    ledger = cache.LEDGER
    fits = ledger.cached + ledger.in_flight + nbytes <= ledger.capacity
    return fits and ledger.process_over(HEADROOM_BYTES + nbytes) <= 0


class Warmer:
    """The background thread, the pending views and the count of script runs in progress."""

    def __init__(self, room: Callable[[], bool] = room, idle_s: float = IDLE_S, theme: str = "host"):
        self.room, self.idle_s, self.theme = room, idle_s, theme
        self._cv = threading.Condition()
        self._running = 0
        self._last_end = 0.0
        self._pending: collections.deque[Job] = collections.deque()
        self._seen: collections.OrderedDict[tuple, set[str]] = collections.OrderedDict()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.warmed = 0
        """Views computed by the warmer so far."""

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Around each script run (``app.py``): while any run is in progress, warming waits."""
        with self._cv:
            self._running += 1
        try:
            yield
        finally:
            with self._cv:
                self._running -= 1
                self._last_end = time.monotonic()
                self._cv.notify_all()

    def offer(self, key: tuple, session: str, jobs: Callable[[], list[Job]]) -> bool:
        """Session ``session`` was shown the view ``key``; when it is the :data:`VISITORS`-th, queue
        ``jobs()`` (called then, once per view). Returns whether jobs were queued."""
        with self._cv:
            if self._stopped:
                return False
            seen = self._seen.setdefault(key, set())
            self._seen.move_to_end(key)
            while len(self._seen) > 4 * MAX_PENDING:
                self._seen.popitem(last=False)
            if session in seen or len(seen) >= VISITORS:
                return False
            seen.add(session)
            if len(seen) < VISITORS:
                return False
        try:
            new = [j for j in jobs() if j.key not in cache.STORE][:MAX_VIEWS]
        except Exception:  # noqa: BLE001 - warming is never worth a visitor's page: log it, go on
            _log.exception("hessviz warm: the neighbours of a view could not be listed")
            return False
        with self._cv:
            keys = {j.key for j in new}
            self._pending = collections.deque(new + [j for j in self._pending if j.key not in keys])
            while len(self._pending) > MAX_PENDING:
                self._pending.pop()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="hessviz-warm", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return bool(new)

    def pending(self) -> int:
        with self._cv:
            return len(self._pending)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop warming: the thread ends after its current chunk, and what is pending is dropped."""
        with self._cv:
            self._stopped = True
            self._pending.clear()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def pause(self) -> None:
        """Wait until no script run has been in progress for :attr:`idle_s`; raise :class:`Stop` when
        stopped or when memory is short."""
        with self._cv:
            while not self._stopped:
                quiet = time.monotonic() - self._last_end
                if self._running == 0 and quiet >= self.idle_s:
                    break
                self._cv.wait(self.idle_s - quiet if self._running == 0 else None)
            if self._stopped:
                raise Stop("stopped")
        if not self.room():
            raise Stop("memory")

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                job = self._pending.popleft()
            start, cpu0 = time.time(), time.thread_time()
            end = "made"
            try:
                self.pause()
                if job.key in cache.STORE:
                    continue
                with plots.drawn_in(self.theme):
                    job.make(self.pause)
                self.warmed += 1
            except Stop as why:
                end = str(why)
                if end == "memory":
                    with self._cv:
                        self._pending.clear()
            except Exception as err:  # noqa: BLE001 - a visitor who asks for the view will see it
                end = f"failed: {type(err).__name__}"
            runlog.warmed(job.key, start, time.time() - start, time.thread_time() - cpu0, end)


WARMER = Warmer()


def offer(key: tuple, jobs: Callable[[], list[Job]]) -> bool:
    """This run's session was shown the view ``key`` (a page calls it once its view is drawn);
    see :meth:`Warmer.offer`. Nothing happens when warming is off or outside a server."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or not enabled():
        return False
    return WARMER.offer(key, ctx.session_id, jobs)


def serving() -> contextlib.AbstractContextManager:
    """:meth:`Warmer.serving` of the server's warmer (``app.py`` wraps each run in it)."""
    return WARMER.serving()


# ----------------------------------------------------------------------------- one step away


def _ordered(s: AppSetting) -> tuple | None:
    """The values of a stepped control (a slider over a range or a grid), or None for the others
    (choices, switches, the typed seed, the optional key/value heads)."""
    if s.grid is not None:
        return tuple(s.grid)
    if s.app_range is None or s.choices or s.members or s.optional or s.kind is not int:
        return None
    lo, hi = s.app_range
    return None if hi - lo > 256 else tuple(range(lo, hi + 1))


def step(values: tuple, value: object) -> list[object]:
    """The value one step up, then one step down, from ``value`` among ``values`` (ordered).

    >>> step((1, 2, 3), 1), step((0.5, 1.0, 2.0), 1.0), step((1, 2), 7)
    ([2], [2.0, 0.5], [])
    """
    if value not in values:
        return []
    i = values.index(value)
    return [values[j] for j in (i + 1, i - 1) if 0 <= j < len(values)]


def steps(values: Mapping[str, object], shown: Callable[[AppSetting], bool]) -> list[tuple[str, object]]:
    """``(url key, value)`` one step away from the shared ``values`` (by URL key) on each stepped
    control for which ``shown(setting)`` holds (drawn on the page, not hidden by the lesson, and
    relevant to the block), in the sidebar's order: every step up first, then every step down.

    >>> from hessviz.app.state import DEFAULTS
    >>> steps(DEFAULTS, lambda s: s.url in ("dk", "xnorm"))
    [('dk', 9), ('xnorm', 2.0), ('dk', 7), ('xnorm', 0.5)]
    """
    up, down = [], []
    for section in settings.SECTIONS:
        for s in settings.SETTINGS:
            grid = _ordered(s)
            if s.section == section and grid is not None and shown(s):
                near = step(grid, values[s.url])
                up += [(s.url, v) for v in near if grid.index(v) > grid.index(values[s.url])]
                down += [(s.url, v) for v in near if grid.index(v) < grid.index(values[s.url])]
    return up + down
