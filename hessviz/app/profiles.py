r"""Which server this is: one profile of limits, chosen by ``HESSVIZ_PROFILE``, else by the address
the server binds (Streamlit is read only for that address).

==============  =========================  =========================================
profile         for                        limits
==============  =========================  =========================================
``local``       a workstation (default on  results may use half of the free memory;
                loopback, ``hessviz app``) a view may cost ~120 s of one core; the
                                           Real model page opens server folders
``hosted``      a public 1 GB / 2-CPU      the process stays under 800 MiB
                host (default on any other (``HESSVIZ_MEMORY_LIMIT``); a view may
                address)                   cost ~4 s of one core; downloads ≤ 32 MiB;
                                           no stack traces
==============  =========================  =========================================

Each limit can be raised (or lowered) on its own with an environment variable:
``HESSVIZ_MEMORY_LIMIT`` (the process ceiling in the hosted profile, e.g. ``2GiB``),
``HESSVIZ_MAX_SECONDS`` (estimated core-seconds per view), ``HESSVIZ_HEAVY`` (heavy
computations at once, default one per core the process may use: :func:`hessviz.runtime.tasks.usable_cores`),
``HESSVIZ_RUNS`` (script runs at once, hosted: default two per core, :mod:`hessviz.app.admission`) and
``HESSVIZ_DOWNLOAD_LIMIT``. What a view costs is :mod:`hessviz.app.budget`; the server-wide gates that
hold these limits are :mod:`hessviz.app.gates`.

>>> lim = limits_from_env({"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=0)
>>> lim.profile, lim.max_seconds, lim.process_bytes == 800 * 2**20
('hosted', 4.0, True)
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from dataclasses import dataclass

from hessviz.app.gates import rss_bytes
from hessviz.runtime.memory import memory_limit, parse_bytes
from hessviz.runtime.tasks import usable_cores

PROFILES = ("local", "hosted")
HOSTED_PROCESS_BYTES = 800 * 2**20
"""Default ceiling for the whole server process in the hosted profile (a 1 GB host)."""
HEADROOM_BYTES = 128 * 2**20
"""Kept free under the ceiling for what no ledger counts: Streamlit's sessions, figures, transient copies."""
MIN_RESULTS_BYTES = 64 * 2**20
RUNS_PER_CORE = 2
"""Script runs admitted at once per core in the hosted profile: runs share the cores (and Python's
lock) anyway, so more at once only hold more figures in memory and finish later, all together."""


@dataclass(frozen=True)
class Limits:
    """The limits of one server process."""

    profile: str
    results_bytes: int
    """Server-wide bytes for results in flight plus everything the caches keep."""
    max_seconds: float
    """Estimated core-seconds one view may cost."""
    heavy: int
    """Heavy computations that may run at once (others queue)."""
    download_bytes: int
    """Largest data file built for a download."""
    timing_repeats: int = 2
    """Timed runs per method on the Verify page (best of them); 1 on a shared host, whose
    timings other visitors disturb anyway."""
    process_bytes: int | None = None
    """The ceiling of the whole process's resident memory (hosted: ``HESSVIZ_MEMORY_LIMIT``), which
    the :class:`Ledger` keeps to by measuring it; None (local) leaves only ``results_bytes``."""
    runs: int | None = None
    """Script runs admitted at once (others wait in line, :mod:`hessviz.app.admission`); None
    (local) admits every run at once."""


def is_loopback(address: str | None) -> bool:
    """Whether a server bound to ``address`` is reachable from this machine only.

    ``None`` or ``""`` is Streamlit's default: every interface, IPv4 and IPv6.

    >>> [is_loopback(a) for a in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "", None, "10.0.0.5")]
    [True, True, True, False, False, False, False]
    """
    if not address:
        return False
    if address.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def served_address() -> str | None:
    """The address this process's Streamlit server binds (``server.address``; ``None``: every interface).

    Outside a running server (the command line, a test's ``AppTest``, a notebook) nothing is served, and
    the answer is loopback. A server is started by Streamlit's bootstrap (``streamlit run``, ``hessviz
    app``), which it has imported before it runs the app; an ``AppTest`` has a runtime but no bootstrap
    and no server, so a process without the bootstrap loaded serves nothing (and this never imports it)."""
    if "streamlit.web.bootstrap" not in sys.modules:
        return "127.0.0.1"
    from streamlit import config, runtime

    return config.get_option("server.address") if runtime.exists() else "127.0.0.1"


def profile_name(env: dict[str, str] | None = None, address: str | None = "127.0.0.1") -> str:
    """The profile of a server bound to ``address``: ``HESSVIZ_PROFILE`` when set, else ``local`` on
    loopback and ``hosted`` anywhere else (the local profile reads server paths: no business of a room's
    network). An explicit ``local`` on another address is the operator's choice, said in the log as a
    warning. Raises ``ValueError`` for an unknown name.

    >>> profile_name({}), profile_name({}, address=None), profile_name({"HESSVIZ_PROFILE": "hosted"})
    ('local', 'hosted', 'hosted')
    """
    env = os.environ if env is None else env
    name = env.get("HESSVIZ_PROFILE", "").strip().lower()
    public = not is_loopback(address)
    if not name:
        return "hosted" if public else "local"
    if name not in PROFILES:
        raise ValueError(f"HESSVIZ_PROFILE must be one of {', '.join(PROFILES)}, got {name!r}")
    if name == "local" and public:
        logging.getLogger("hessviz.app").warning(
            "hessviz: warning: HESSVIZ_PROFILE=local on %s: every visitor who reaches this address may "
            "read server paths and use the workstation's limits (docs/hosting.md, the threat model)",
            address or "every interface",
        )
    return name


def limits_from_env(
    env: dict[str, str] | None = None, *, baseline_bytes: int | None = None, address: str | None = "127.0.0.1"
) -> Limits:
    """The limits of the profile named by ``HESSVIZ_PROFILE``, with per-limit overrides.

    In the hosted profile ``HESSVIZ_MEMORY_LIMIT`` is the ceiling of the whole process, and
    results get what is left above ``baseline_bytes`` (the resident size once everything is
    imported; measured now when not given) and :data:`HEADROOM_BYTES`, at least 64 MiB. In the
    local profile it keeps its library meaning, the limit for one result (default: half of the
    free memory).
    """
    env = os.environ if env is None else env
    name = profile_name(env, address)
    cores = usable_cores()  # affinity and the cgroup's quota, not every core of the machine
    heavy = int(env.get("HESSVIZ_HEAVY", "0") or 0) or cores
    if name == "hosted":
        ceiling = (
            parse_bytes(env["HESSVIZ_MEMORY_LIMIT"])
            if env.get("HESSVIZ_MEMORY_LIMIT")
            else HOSTED_PROCESS_BYTES
        )
        base = rss_bytes() if baseline_bytes is None else baseline_bytes
        results = max(MIN_RESULTS_BYTES, ceiling - base - HEADROOM_BYTES)
        seconds, download, repeats = 4.0, 32 * 2**20, 1
        runs = int(env.get("HESSVIZ_RUNS", "0") or 0) or RUNS_PER_CORE * cores
    else:
        results = memory_limit("cpu")
        seconds, download, repeats = 120.0, 1 << 30, 2
        runs = int(env.get("HESSVIZ_RUNS", "0") or 0) or None
    if env.get("HESSVIZ_MAX_SECONDS"):
        seconds = float(env["HESSVIZ_MAX_SECONDS"])
        if not seconds > 0:
            raise ValueError(f"HESSVIZ_MAX_SECONDS must be > 0, got {env['HESSVIZ_MAX_SECONDS']!r}")
    if env.get("HESSVIZ_DOWNLOAD_LIMIT"):
        download = parse_bytes(env["HESSVIZ_DOWNLOAD_LIMIT"])
    return Limits(
        name,
        int(results),
        seconds,
        max(1, heavy),
        int(download),
        repeats,
        int(ceiling) if name == "hosted" else None,
        None if runs is None else max(1, runs),
    )
