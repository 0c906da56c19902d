r"""Admission control: how many script runs at once, and whether one more fits the process's memory.

The ledger (:class:`hessviz.app.gates.Ledger`) counts results, in flight and cached. A crowd costs
more than its results: every session keeps its state, and every script run holds its figures, their
JSON and the messages that carry them until they are sent. 150 tabs opening 150 distinct views at
once (issue 43) ran 150 scripts at once, and the hosted server, limited to 800 MiB, passed 1.7 GB.

:class:`Door` admits script runs in arrival order, at most ``runs`` at once
(:attr:`hessviz.app.profiles.Limits.runs`), each charged what it may cost: :data:`RUN_BYTES` for the
results it holds, its figures in flight and their serialisations, plus :data:`SESSION_BYTES` for a
session's first run (the state the session keeps after). A run is admitted when the process's
measured resident memory, plus what the runs already admitted are charged (what they will use is
not all resident yet), plus its own charge and the ledger's slack, stays under the ceiling. When it
does not, the run waits for the runs in flight, which give memory back as they end; once none is
left, cached results are evicted to make the room (a cache can be refilled, a visitor's session
cannot). A run that waits is told its place after a second. One that cannot be admitted within
:data:`WAIT_S`, or at all once nothing is left to evict and nothing is in flight, is refused with
:class:`Full`, and the visitor gets a short page instead: the class is full, retry in a moment
(:func:`admit`). A waiting run holds no figures and no results, and draws nothing else.

Without a ceiling and a count (the local profile, one visitor) every run is admitted at once.

>>> door = Door(runs=1, ceiling=None)
>>> with door.run(RUN_BYTES):
...     door.running
1
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from hessviz.app.gates import PROCESS_SLACK_BYTES, Line, rss_bytes

RUN_BYTES = 32 * 2**20
"""Charged to a script run while it runs: the results it holds (a result the store evicts while a
page still draws it stays in memory, uncounted by the ledger, until the run ends: 18 MiB for the
default Hessian map, P = 1,536), its figures, their JSON (Streamlit serialises a plotly figure to a
JSON string, then into a protobuf message) and the messages queued to the browser. Measured on
the hosted server: eight runs of distinct Hessian maps at once peaked 33 MiB above what their eight
results left cached, about 4 MiB each besides their results."""
SESSION_BYTES = 4 * 2**20
"""Charged to a session's first run: the state the session keeps once the run has ended (its
widgets, Session State, Streamlit's per-session objects). Measured: 60 sessions connected to the
Hessian map grew the hosted server by 2.1 MiB each; charged twice that for pages with more controls."""
WAIT_S = 40.0
"""Longest a run waits to be admitted before its visitor is told the class is full."""
ROOM_EVERY_S = 0.5
"""Seconds between two attempts to make room (each evicts, collects and trims: tens of milliseconds
with a crowd connected), so that a line of visitors refused at once does not pay one each."""
FULL_TITLE = "The class is full"
"""The first words of the page a visitor who cannot be admitted gets."""


class Full(Exception):
    """The server cannot take this script run now (its memory or its line is full)."""


class Door(Line):
    """At most ``runs`` script runs at once (None: any number), first come first served, each charged
    its cost against the process ``ceiling`` (None: not measured); see the module's docstring.

    ``make_room(nbytes)`` frees at least ``nbytes`` if it can (the store evicts cached results, then
    collects and trims the heap) and returns what it freed."""

    def __init__(
        self,
        runs: int | None,
        ceiling: int | None,
        rss: Callable[[], int] = rss_bytes,
        make_room: Callable[[int], int] = lambda nbytes: 0,
        wait_s: float = WAIT_S,
    ):
        self.runs = None if runs is None else max(1, int(runs))
        self.ceiling = None if ceiling is None else int(ceiling)
        self.rss, self.make_room, self.wait_s = rss, make_room, wait_s
        super().__init__()
        self._charged = 0
        self.refused = 0
        """Runs refused so far (:class:`Full`)."""
        self._room_at = -1.0

    @property
    def charged(self) -> int:
        """Bytes the admitted runs are charged now (not all of it resident yet)."""
        return self._charged

    def over(self, nbytes: int = 0) -> int:
        """Bytes by which the measured process, the admitted runs' charges, ``nbytes`` and the slack
        pass the ceiling (0 or less: under it; 0 without a ceiling or a measurement)."""
        if self.ceiling is None:
            return 0
        rss = self.rss()
        return rss + self._charged + nbytes + PROCESS_SLACK_BYTES - self.ceiling if rss else 0

    def _line_free(self) -> bool:
        return self.runs is None or self._running < self.runs

    @contextlib.contextmanager
    def run(
        self, nbytes: int, waiting: Callable[[int], None] | None = None, poll: float = 0.25
    ) -> Iterator[None]:
        """Hold a place for one script run charged ``nbytes``; wait in line for it (``waiting(place)``
        about every ``poll`` s, 1 = next; it may raise to give up), or raise :class:`Full`."""
        nbytes = int(nbytes)
        start = time.monotonic()
        try:
            with self._ticket() as ticket:
                self._admit(ticket, nbytes, start, waiting, poll)
        except Full:
            with self._cv:
                self.refused += 1
            raise
        try:
            yield
        finally:
            with self._cv:
                self._running -= 1
                self._charged -= nbytes
                self._cv.notify_all()

    def _admit(
        self, ticket: object, nbytes: int, start: float, waiting: Callable[[int], None] | None, poll: float
    ) -> None:
        """Wait until ``ticket`` is first, the line has room and ``nbytes`` fits; or raise :class:`Full`."""
        while True:
            with self._cv:
                first = self._queue[0] is ticket
                over = self.over(nbytes) if first and self._line_free() else 0
                if first and self._line_free() and over <= 0:
                    self._queue.popleft()
                    self._running += 1
                    self._charged += nbytes
                    self._cv.notify_all()
                    return
                place, in_flight = self._queue.index(ticket) + 1, self._running
            if over > 0 and in_flight == 0:  # nothing in flight will give memory back: make room now
                if time.monotonic() - self._room_at > ROOM_EVERY_S and self.make_room(over) > 0:
                    continue  # cached results went: measure again
                self._room_at = time.monotonic()  # nothing left to evict (or just found so)
                if self.over(nbytes) > 0:
                    raise Full("the server's memory is full with the sessions it has")
                continue
            if time.monotonic() - start > self.wait_s:
                raise Full(f"waited {self.wait_s:g} s in line")
            with self._cv:
                self._cv.wait(poll)
            if waiting is not None:
                waiting(place)


_SESSION_KEY = "_hessviz_admitted"
"""Session State key set once a session's first run was admitted (later runs are not charged its state)."""
WAIT_DRAWN_AFTER_S = 1.0
"""A run waits this long before its visitor is told the place in line (a short wait shows nothing)."""


@contextlib.contextmanager
def admit(door: Door) -> Iterator[None]:
    """Around one script run (:func:`hessviz.app.main.main`): wait for ``door``, the place in line
    shown after :data:`WAIT_DRAWN_AFTER_S`, and hold it while the page runs; or draw the short "the
    class is full" page and stop the run (no figures, nothing computed). A visitor who closes the
    tab while waiting is dropped; one who moves a control starts a new run (Streamlit interrupts
    this one at the next message drawn)."""
    import streamlit as st

    from hessviz.app import progress

    first = not st.session_state.get(_SESSION_KEY, False)
    since, drawn = time.monotonic(), []

    def waiting(place: int) -> None:
        if not progress.session_alive():
            st.stop()  # the tab was closed while it waited: nobody to draw for
        if time.monotonic() - since >= WAIT_DRAWN_AFTER_S:
            if not drawn:
                drawn.append(st.empty())
            ahead = "you are next" if place == 1 else f"{place - 1} visitors ahead of you"
            busy = f"The server is busy: {ahead}. Your page starts in a moment."
            drawn[0].info(busy, icon=":material/hourglass_top:")

    with contextlib.ExitStack() as held:
        try:
            held.enter_context(door.run(RUN_BYTES + (SESSION_BYTES if first else 0), waiting))
        except Full:
            (drawn[0] if drawn else st.empty()).info(
                f"**{FULL_TITLE}.** This server is at its limit with the visitors it has now. Retry in "
                "a moment: reload this page (your view is in its address).",
                icon=":material/groups:",
            )
            st.stop()
        if drawn:
            drawn[0].empty()
        st.session_state[_SESSION_KEY] = True
        yield
