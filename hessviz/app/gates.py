r"""The server's two gates, memory and concurrent work, and the allocator (numeric and threading only).

:class:`Ledger` holds the bytes of results in flight plus what caches keep, against one
server-wide capacity, evicting cached results first (least recently used); given the process
ceiling (:attr:`hessviz.app.profiles.Limits.process_bytes`, hosted) it also measures the
process's resident memory and keeps it, with the reservation, under that ceiling.
:class:`Gate` lets at most ``slots`` heavy computations run at once; the others wait in
arrival order and are told their place. Both take a ``waiting`` callback that may raise
to abandon the wait (the visitor left or moved a control).

One order, so that no two visitors wait for each other: **a slot, then memory**. A thread that
holds memory never waits, neither for a slot nor for more memory: a computation nested in another
(a spectrum's term, a view's figures built from a result evicted meanwhile) that needs a slot it
does not hold, or more memory than fits now, raises :class:`Retry`. Its outermost computation
(:meth:`hessviz.app.cache.Store.get`) then gives everything back and asks again, a slot first if
one is needed, for the memory of the whole computation at once. Waiting threads therefore hold no
memory, and every thread that holds memory is computing; the ceiling holds for nested
reservations too, since every reservation is checked against it.

>>> gate = Gate(1)
>>> with gate.slot():
...     gate.running
1
"""

from __future__ import annotations

import collections
import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hessviz.errors import SizeError
from hessviz.runtime.memory import format_bytes


def rss_bytes() -> int:
    """Resident memory of this process now (``/proc/self/statm``; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@functools.cache
def _libc():
    """The C library of this process when it is glibc (``mallopt``/``malloc_trim``), else None."""
    import ctypes

    lib = ctypes.CDLL(None)
    return lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else None


def tune_allocator() -> bool:
    """Make glibc give freed result buffers back to the system (Linux; False elsewhere).

    By default glibc raises its mmap threshold after each large ``free`` (up to 32 MiB), so
    later Hessian-sized arrays come from heaps that never shrink and the resident size
    creeps up view after view. A fixed 1 MiB threshold keeps every large buffer in its own
    mapping, returned on ``free``; two arenas bound per-thread fragmentation (Streamlit runs
    each session in its own thread, and glibc would give each thread an arena of its own).
    Measured on the hosted load test: peak RSS 830 MiB with it, 1,035 MiB without.
    """
    lib = _libc()
    if lib is None:
        return False
    m_mmap_threshold, m_arena_max = -3, -8
    return bool(lib.mallopt(m_mmap_threshold, 1 << 20)) and bool(lib.mallopt(m_arena_max, 2))


def trim_memory() -> None:
    """Return free heap pages to the system now (glibc ``malloc_trim``; no-op elsewhere)."""
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)


Waiting = Callable[[int], None]
"""Called about every 0.25 s while waiting with the place in line (1 = next); may raise to give up."""


_memory = threading.local()
"""``_memory.reservations``: the outermost reservations this thread holds, over every ledger."""


def holding_memory() -> bool:
    """Whether this thread holds a reservation of any :class:`Ledger` (it is inside a computation)."""
    return getattr(_memory, "reservations", 0) > 0


class Retry(BaseException):  # noqa: N818 - a signal to the outermost computation, not an error
    """A thread that holds memory asked for what it would have to wait for: a heavy slot it does not
    hold (``slot``), or more memory than fits now (``nbytes``, all its reservations together).

    Raised instead of waiting, because a thread waiting while it holds memory is how two visitors
    end up waiting for each other (one holds the memory the other needs, the other the slot the
    first one needs). Its outermost computation catches it, gives everything back and asks again,
    a slot first, for ``nbytes`` at once. A :class:`BaseException`, like ``KeyboardInterrupt``, so
    that no ``except Exception`` in the library between the two swallows it.
    """

    def __init__(self, nbytes: int = 0, slot: bool = False):
        super().__init__(f"retry with {nbytes} bytes" + (" and a heavy slot" if slot else ""))
        self.nbytes, self.slot = int(nbytes), bool(slot)


class Line:
    """A first-come-first-served line under one condition ``_cv``: the tickets waiting (``_queue``,
    :attr:`waiting` long) and the count admitted (``_running``). What :class:`Gate` (heavy
    computations) and :class:`hessviz.app.admission.Door` (script runs) share; each admits by its own
    rule, the first ticket in line only."""

    def __init__(self):
        self._cv = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()
        self._running = 0

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @contextmanager
    def _ticket(self) -> Iterator[object]:
        """A ticket at the end of the line, held while the caller waits; if the wait raises (given up,
        refused), the ticket leaves the line and the others are woken."""
        ticket = object()
        with self._cv:
            self._queue.append(ticket)
        try:
            yield ticket
        except BaseException:
            with self._cv:
                if ticket in self._queue:
                    self._queue.remove(ticket)
                self._cv.notify_all()
            raise


class Gate(Line):
    """At most ``slots`` heavy computations at once, first come first served.

    Re-entrant per thread: a computation that needs another (a spectrum needs the term)
    does not queue behind itself. A thread that holds memory (a reservation of any
    :class:`Ledger`, :func:`holding_memory`) does not queue for a slot either: it raises
    :class:`Retry` (a slot, then memory, never the other way round).
    """

    def __init__(self, slots: int):
        super().__init__()
        self.slots = max(1, int(slots))
        self._local = threading.local()

    def held(self) -> bool:
        """Whether this thread holds a slot."""
        return getattr(self._local, "depth", 0) > 0

    @contextmanager
    def slot(self, waiting: Waiting | None = None, poll: float = 0.25) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if not depth and holding_memory():
            raise Retry(slot=True)
        if depth:
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth = depth
            return
        with self._ticket() as ticket:
            while True:
                with self._cv:
                    if self._running < self.slots and self._queue[0] is ticket:
                        self._queue.popleft()
                        self._running += 1
                        break
                    place = self._queue.index(ticket) + 1
                    self._cv.wait(poll)
                if waiting is not None:
                    waiting(place)
        self._local.depth = 1
        try:
            yield
        finally:
            self._local.depth = 0
            with self._cv:
                self._running -= 1
                self._cv.notify_all()


PROCESS_SLACK_BYTES = 64 * 2**20
"""Kept free under the process ceiling for what a reservation does not name (Streamlit's messages,
a figure, the copies a computation makes beyond its estimate): with 32 MiB the hosted server
peaked at 780 MiB under an 800 MiB ceiling, too close."""


class Ledger:
    """Server-wide bytes: results being computed plus what caches keep, against ``capacity``,
    and, given a ``ceiling``, the process's measured resident memory against it.

    ``evict(nbytes)`` is asked to free at least ``nbytes`` of cached results (least
    recently used first) and returns what it freed; it is set by the cache that registers.

    The bytes counted are estimates, and the process holds more than they count: memory that
    is only touched once the first visitors arrive (lazy imports, LAPACK workspaces, plotly's
    validators), every session's state and messages, allocator fragmentation. Measured on the
    hosted profile with an 800 MiB ceiling: 398 MiB resident when the limits were set, ~540 MiB
    besides the cached results after thirty views, so a full cache took the process to 823 MiB.
    With ``ceiling`` the ledger also measures the process (``rss()``, :func:`rss_bytes`) and treats
    ``rss() + nbytes + PROCESS_SLACK_BYTES`` over the ceiling like a full cache: it waits for the
    computations in flight, then evicts cached results, before a reservation goes ahead.
    """

    def __init__(self, capacity: int, ceiling: int | None = None, rss: Callable[[], int] = rss_bytes):
        self.capacity = int(capacity)
        self.ceiling = None if ceiling is None else int(ceiling)
        self.rss = rss
        self._lock = threading.Condition()
        self._in_flight = 0
        self._cached = 0
        self.evict: Callable[[int], int] = lambda nbytes: 0
        self._local = threading.local()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def cached(self) -> int:
        return self._cached

    def add_cached(self, nbytes: int) -> None:
        with self._lock:
            self._cached += int(nbytes)
            self._lock.notify_all()

    def _over(self, nbytes: int) -> int:
        return self._in_flight + self._cached + nbytes - self.capacity

    def process_over(self, nbytes: int = 0) -> int:
        """Bytes by which the measured process plus ``nbytes`` (and the slack) is over the ceiling
        (0 or less: under it; always 0 without a ceiling or where memory cannot be measured)."""
        if self.ceiling is None:
            return 0
        rss = self.rss()
        return rss + nbytes + PROCESS_SLACK_BYTES - self.ceiling if rss else 0

    def holding(self) -> bool:
        """Whether this thread holds a reservation (it is inside a computation)."""
        return getattr(self._local, "depth", 0) > 0

    def _must_wait(self, nbytes: int, mine: int = 0) -> bool:
        """Over the accounted capacity, or over the measured ceiling while others' computations
        (which will free memory; ``mine``: what this thread holds already) are in flight: the cache
        is evicted for the ceiling only once nothing else is computing, since what is in flight is
        part of what was measured (evicting then emptied the cache and every visitor's next view
        was computed again)."""
        return self._over(nbytes) > 0 or (self.process_over(nbytes) > 0 and self._in_flight > mine)

    def _make_room(self, nbytes: int, mine: int = 0) -> None:
        """Evict cached results where that makes room for ``nbytes``: for the capacity when the
        computations in flight leave room once the cache is emptied (else this would only empty
        it), for the measured ceiling when no other computation is in flight."""
        over = self._over(nbytes)
        if over > 0 and self._in_flight + nbytes <= self.capacity:
            self.evict(over)
        if self._cached > 0 and self._in_flight == mine and self.process_over(nbytes) > 0:
            self.evict(self.process_over(nbytes))

    def _refuse(self, nbytes: int, what: str) -> SizeError:
        return SizeError(
            f"{what} would take about {format_bytes(nbytes)}; this server keeps at most "
            f"{format_bytes(self.capacity)} of results for all visitors",
            needed_bytes=nbytes,
            limit_bytes=self.capacity,
        )

    @contextmanager
    def reserve(
        self,
        nbytes: int,
        what: str,
        waiting: Waiting | None = None,
        poll: float = 0.25,
        total: int = 0,
    ) -> Iterator[None]:
        """Hold ``nbytes`` while computing; evict cached results first, then wait for others.

        Cached results are evicted only when that makes room: while the computations in flight
        leave less than ``nbytes`` even with an empty cache, this waits for them and keeps the
        cache (emptying it then freed nothing that helped, and every visitor's next view was
        computed again).

        The outermost reservation of a thread holds ``max(nbytes, total)``: ``total`` is what the
        whole computation needs with the ones nested in it, when a first attempt found out
        (:class:`Retry`). A nested reservation (a spectrum computing its term) is counted with the
        thread's others, and checked like any: it is drawn from what the thread holds, or added to
        it when that fits now (evicting cached results as above), or else it raises
        :class:`Retry` with the bytes of all of them, never waiting while it holds memory. What a
        nested reservation added is given back when it ends.
        """
        nbytes = int(nbytes)
        if nbytes > self.capacity:
            raise self._refuse(nbytes, what)
        if self.holding():
            yield from self._nested(nbytes, what)
            return
        hold = max(nbytes, int(total))
        if hold > self.capacity:
            raise self._refuse(hold, what)
        while True:
            self._make_room(hold)
            with self._lock:
                if not self._must_wait(hold):
                    self._in_flight += hold
                    break
                self._lock.wait(poll)
            if waiting is not None:
                waiting(0)
        self._local.held, self._local.base, self._local.used = hold, hold, nbytes
        self._local.depth = 1
        _memory.reservations = getattr(_memory, "reservations", 0) + 1
        try:
            yield
        finally:
            _memory.reservations -= 1
            with self._lock:
                self._in_flight -= self._local.held
                self._local.held = self._local.base = self._local.used = self._local.depth = 0
                self._lock.notify_all()

    def _nested(self, nbytes: int, what: str) -> Iterator[None]:
        """A reservation inside another of this thread (see :meth:`reserve`)."""
        local = self._local
        need = local.used + nbytes
        if need > self.capacity:
            raise self._refuse(need, f"{what}, inside another computation,")
        if need > local.held:
            extra = need - local.held
            self._make_room(extra, local.held)
            with self._lock:
                if self._must_wait(extra, local.held):
                    raise Retry(need)
                self._in_flight += extra
                local.held = need
        local.used, local.depth = need, local.depth + 1
        try:
            yield
        finally:
            local.used, local.depth = local.used - nbytes, local.depth - 1
            keep = max(local.base, local.used)
            with self._lock:
                if local.held > keep:
                    self._in_flight -= local.held - keep
                    local.held = keep
                    self._lock.notify_all()
