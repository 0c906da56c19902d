r"""Which server this is: one profile of limits, chosen by ``HESSVIZ_PROFILE`` (no Streamlit).

==============  =======================  =========================================
profile         for                      limits
==============  =======================  =========================================
``local``       a workstation (default)  results may use half of the free memory;
                                         a view may cost ~120 s of one core
``hosted``      a public 1 GB / 2-CPU    the process stays under 800 MiB
                host (Community Cloud)   (``HESSVIZ_MEMORY_LIMIT``); a view may
                                         cost ~4 s of one core; downloads ≤ 32 MiB
==============  =======================  =========================================

Each limit can be raised (or lowered) on its own with an environment variable:
``HESSVIZ_MEMORY_LIMIT`` (the process ceiling in the hosted profile, e.g. ``2GiB``),
``HESSVIZ_MAX_SECONDS`` (estimated core-seconds per view), ``HESSVIZ_HEAVY`` (heavy
computations at once, default one per core), ``HESSVIZ_RUNS`` (script runs at once, hosted:
default two per core, :mod:`hessviz.app.admission`) and ``HESSVIZ_DOWNLOAD_LIMIT``. What a view costs
is :mod:`hessviz.app.budget`; the server-wide gates that hold these limits are
:mod:`hessviz.app.gates`.

>>> lim = limits_from_env({"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=0)
>>> lim.profile, lim.max_seconds, lim.process_bytes == 800 * 2**20
('hosted', 4.0, True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hessviz.app.gates import rss_bytes
from hessviz.memory import memory_limit, parse_bytes

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


def profile_name(env: dict[str, str] | None = None) -> str:
    """``HESSVIZ_PROFILE`` (``local`` when unset); raises ``ValueError`` for an unknown name."""
    env = os.environ if env is None else env
    name = env.get("HESSVIZ_PROFILE", "local").strip().lower() or "local"
    if name not in PROFILES:
        raise ValueError(f"HESSVIZ_PROFILE must be one of {', '.join(PROFILES)}, got {name!r}")
    return name


def limits_from_env(env: dict[str, str] | None = None, *, baseline_bytes: int | None = None) -> Limits:
    """The limits of the profile named by ``HESSVIZ_PROFILE``, with per-limit overrides.

    In the hosted profile ``HESSVIZ_MEMORY_LIMIT`` is the ceiling of the whole process, and
    results get what is left above ``baseline_bytes`` (the resident size once everything is
    imported; measured now when not given) and :data:`HEADROOM_BYTES`, at least 64 MiB. In the
    local profile it keeps its library meaning, the limit for one result (default: half of the
    free memory).
    """
    env = os.environ if env is None else env
    name = profile_name(env)
    cores = os.cpu_count() or 1
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
