"""Is this run still wanted? Status line, queue place and progress of a guarded computation.

A page computes inside :func:`hessviz.app.guard`, which opens a :class:`Status` for the
script thread. The caches call :func:`current` between chunks of work:

* :meth:`Status.checkpoint` raises :class:`Cancelled` when the visitor's session has no
  connection any more (tab closed), so the server stops working for nobody;
* :meth:`Status.waiting` shows the visitor's place in the queue of heavy computations;
* :meth:`Status.step` draws a progress bar;
* :meth:`Status.charge` adds the CPU a computation used, and :meth:`Status.checkpoint` raises
  :class:`hessviz.app.budget.OverBudget` once the run's computations are over
  :data:`hessviz.app.budget.WORK_FACTOR` times the per-view limit (the guard shows it in one line).

Each of them writes to a Streamlit placeholder. Writing is also how Streamlit interrupts a
run whose controls have moved (``runner.fastReruns``): the write raises Streamlit's rerun
exception, so a computation abandons a view as soon as nobody asks for it.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable

from hessviz.app import budget

_local = threading.local()


class Cancelled(Exception):
    """The visitor who asked for this computation has gone."""


def session_alive() -> bool:
    """False once this script run's browser session has disconnected (True outside a server)."""
    from streamlit import runtime  # Streamlit only where a page guards a computation (it draws)
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    if not runtime.exists():
        return True
    ctx = get_script_run_ctx()
    if ctx is None:
        return True
    return runtime.get_instance().is_active_session(ctx.session_id)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


DRAW_EVERY = 0.2
"""Seconds between two progress bars drawn: each one is a message to the browser and a re-render
there (a sweep of cached points drew 120 bars in a fraction of a second, three times the messages
of the whole page)."""


def throttled(draw: Callable[[int, int], None], every: float = DRAW_EVERY) -> Callable[[int, int], None]:
    """``draw(done, total)`` at most every ``every`` seconds, and always for the last step."""
    last = -math.inf

    def call(done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if done < total and now - last < every:
            return
        last = now
        draw(done, total)

    return call


class Status:
    """The status placeholder of one guarded computation (``what``: e.g. ``"the spectrum"``)."""

    def __init__(self, what: str):
        self.what = what
        import streamlit as st

        self.slot = st.empty()
        self._shown = ""
        self._last = 0.0
        self._held = contextlib.ExitStack()
        self._holding = False
        self.work, self.work_limit, self.profile = 0.0, math.inf, ""
        """CPU seconds this run's computations used (:meth:`charge`), and the bound on them."""
        self._since: float | None = None
        """Thread CPU clock when the computation now running began (:meth:`begin`), else None."""

    def hold(self, gate) -> contextlib.AbstractContextManager:
        """Take a slot of ``gate`` at the first computation and keep it until the guard ends, so a
        page's chunks (a sweep's points, a spectrum's terms) queue once, not once per chunk."""
        if not self._holding:
            self._held.enter_context(gate.slot(self.waiting))
            self._holding = True
        return contextlib.nullcontext()

    def begin(self, limit: float, profile: str = "") -> None:
        """A charged computation starts: from now on :meth:`checkpoint` counts the CPU it has used so
        far, so a computation that runs past ``limit`` stops at its next progress step, not after it
        ends (the SmolLM2 view of issue 44 ran 427 s of CPU under a 360 s bound)."""
        self._since = time.thread_time()
        self.work_limit, self.profile = limit, profile

    def used(self) -> float:
        """CPU seconds of this run's computations, the one running included."""
        return self.work + (0.0 if self._since is None else time.thread_time() - self._since)

    def charge(self, seconds: float, limit: float, profile: str = "") -> None:
        """Add ``seconds`` of CPU that this run's computations used (the one :meth:`begin` started
        ends); the next :meth:`checkpoint` raises :class:`hessviz.app.budget.OverBudget` once they are
        over ``limit``."""
        self.work += seconds
        self._since = None
        self.work_limit, self.profile = limit, profile

    def checkpoint(self) -> None:
        if not session_alive():
            raise Cancelled(self.what)
        used = self.used()
        if used > self.work_limit:
            raise budget.over_budget(self.what, used, self.work_limit / budget.WORK_FACTOR, self.profile)

    def _show(self, kind: str, text: str, value: float | None = None) -> None:
        now = time.monotonic()
        if kind == "queue" and text == self._shown and now - self._last < 1.0:
            return  # the same message: do not resend it four times a second
        if kind == "progress" and (value or 0.0) < 1.0 and now - self._last < DRAW_EVERY:
            return  # a bar at most five times a second
        self._shown, self._last = text, now
        if kind == "progress":
            self.slot.progress(min(1.0, max(0.0, value or 0.0)), text=text)
        else:
            self.slot.info(text, icon=":material/hourglass_top:")

    def waiting(self, place: int) -> None:
        """Called while queued (``place`` 1 = next) or waiting for memory (``place`` 0)."""
        self.checkpoint()
        if place > 0:
            self._show(
                "queue",
                f"**Queued: {_ordinal(place)} in line** for {self.what}. This server runs "
                "one heavy computation per core at a time; yours starts as soon as one ends.",
            )
        else:
            self._show("queue", f"Waiting for memory or for another visitor computing {self.what}…")

    def step(self, done: int, total: int, text: str = "") -> None:
        """Progress ``done / total`` (and a cancellation point)."""
        self.checkpoint()
        self._show(
            "progress", text or f"Computing {self.what}: {done}/{total}", done / total if total else 1.0
        )

    def release(self) -> None:
        self._held.close()
        self._holding = False


class _Quiet:
    """Used when no page guards the call (library use, tests): never cancels, draws nothing."""

    what = "this computation"

    def checkpoint(self) -> None:
        pass

    def begin(self, limit: float, profile: str = "") -> None:
        pass

    def charge(self, seconds: float, limit: float, profile: str = "") -> None:
        pass

    def waiting(self, place: int) -> None:
        pass

    def step(self, done: int, total: int, text: str = "") -> None:
        pass

    def hold(self, gate) -> contextlib.AbstractContextManager:
        return gate.slot()


def current() -> Status | _Quiet:
    """The status of the guarded computation running in this thread."""
    return getattr(_local, "status", None) or _Quiet()


def open_status(what: str) -> Status:
    status = Status(what)
    _local.status = status
    return status


def close_status(status: Status) -> None:
    """Release the guard's slot, forget it, and remove its status line (if the run goes on)."""
    status.release()
    if getattr(_local, "status", None) is status:
        _local.status = None
    status.slot.empty()


class Reporter:
    """A :mod:`hessviz.matfree` progress callback drawing one stage of a page's progress bar.

    ``progress(done, total, message)`` from the library (``total`` None when unknown: then
    ``expected`` products) becomes :meth:`~hessviz.app.progress.Status.step` of the guarded
    computation, at most five times a second; the step raises when the visitor has left or
    moved a control (Streamlit's rerun), which cancels the library's loop.
    """

    def __init__(self, stage: int, stages: int, expected: int, label: str):
        self.stage, self.stages, self.expected, self.label = stage, stages, max(1, expected), label
        self._last = 0.0

    def __call__(self, done: int, total: int | None, message: str) -> None:
        now = time.monotonic()
        status = current()
        if now - self._last < 0.2:
            status.checkpoint()
            return
        self._last = now
        frac = min(1.0, done / (total or self.expected))
        status.step(int(1000 * (self.stage + frac)), 1000 * self.stages, f"{self.label}: {message}")
