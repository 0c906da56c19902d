r"""What a shared server can afford: one profile of limits, the cost of a view, and two
server-wide gates (memory and concurrent work). Numeric and threading only, no Streamlit.

**Profiles.** ``HESSVIZ_PROFILE`` chooses the limits, stated once here (:data:`PROFILES`):

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
computations at once, default one per core) and ``HESSVIZ_DOWNLOAD_LIMIT``.

**Cost of a view.** :func:`cost` estimates, for one kind of view (:data:`KINDS`), the
core-seconds of work and the peak bytes of the results it holds, from the block's
sizes alone (before anything is allocated). The coefficients were measured on one core
of the 2-vCPU development machine: a dense ``(P, P)`` float64 term costs
``8 P²`` bytes; a dense symmetric eigendecomposition ``≈ 5·10⁻¹¹ P³`` s; the spectral
norm of an ``m × n`` block (Gram matrix, then ``eigvalsh``) ``≈ 5·10⁻¹¹ min(m,n)² (m+n)`` s;
the autograd reference ``≈ 3·10⁻⁸ · P · L(d² + d·d_ff + L·d)`` s per term; a sweep point
at least 6 ms.
:func:`check` compares a cost with the limits and, when it is over, says which control
to lower (:class:`Verdict`). An estimate can miss: the app also stops a view's computations
once they have used :data:`WORK_FACTOR` times the per-view seconds of CPU (:class:`OverBudget`).

**Gates.** :class:`Ledger` holds the bytes of results in flight plus what caches keep,
against one server-wide capacity, evicting cached results first (least recently used);
given the process ceiling (:attr:`Limits.process_bytes`, hosted) it also measures the
process's resident memory and keeps it, with the reservation, under that ceiling.
:class:`Gate` lets at most ``slots`` heavy computations run at once; the others wait in
arrival order and are told their place. Both take a ``waiting`` callback that may raise
to abandon the wait (the visitor left or moved a control).

>>> lim = Limits("test", results_bytes=100 << 20, max_seconds=4.0, heavy=1, download_bytes=1 << 20)
>>> import hessviz as hv
>>> check(cost("map", hv.BlockConfig(seq_len=8, d_model=16, d_k=8, d_ff=32)), lim).ok
True
>>> big = hv.BlockConfig(seq_len=8, d_model=64, d_k=64, d_ff=256)
>>> v = check(cost("spectrum", big), lim, big)
>>> v.ok, "d_ff" in v.advice
(False, True)
"""

from __future__ import annotations

import collections
import functools
import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hessviz.config import ATTENTION_PARAMS, BlockConfig
from hessviz.errors import HessvizError, SizeError
from hessviz.memory import format_bytes, memory_limit, parse_bytes

# ----------------------------------------------------------------------------- profiles

PROFILES = ("local", "hosted")
HOSTED_PROCESS_BYTES = 800 * 2**20
"""Default ceiling for the whole server process in the hosted profile (a 1 GB host)."""
HEADROOM_BYTES = 128 * 2**20
"""Kept free under the ceiling for what no ledger counts: Streamlit's sessions, figures, transient copies."""
MIN_RESULTS_BYTES = 64 * 2**20


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


def profile_name(env: dict[str, str] | None = None) -> str:
    """``HESSVIZ_PROFILE`` (``local`` when unset); raises ``ValueError`` for an unknown name."""
    env = os.environ if env is None else env
    name = env.get("HESSVIZ_PROFILE", "local").strip().lower() or "local"
    if name not in PROFILES:
        raise ValueError(f"HESSVIZ_PROFILE must be one of {', '.join(PROFILES)}, got {name!r}")
    return name


def rss_bytes() -> int:
    """Resident memory of this process now (``/proc/self/statm``; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


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
        ceiling = parse_bytes(env["HESSVIZ_MEMORY_LIMIT"]) if env.get("HESSVIZ_MEMORY_LIMIT") \
            else HOSTED_PROCESS_BYTES
        base = rss_bytes() if baseline_bytes is None else baseline_bytes
        results = max(MIN_RESULTS_BYTES, ceiling - base - HEADROOM_BYTES)
        seconds, download, repeats = 4.0, 32 * 2**20, 1
    else:
        results = memory_limit("cpu")
        seconds, download, repeats = 120.0, 1 << 30, 2
    if env.get("HESSVIZ_MAX_SECONDS"):
        seconds = float(env["HESSVIZ_MAX_SECONDS"])
        if not seconds > 0:
            raise ValueError(f"HESSVIZ_MAX_SECONDS must be > 0, got {env['HESSVIZ_MAX_SECONDS']!r}")
    if env.get("HESSVIZ_DOWNLOAD_LIMIT"):
        download = parse_bytes(env["HESSVIZ_DOWNLOAD_LIMIT"])
    return Limits(name, int(results), seconds, max(1, heavy), int(download), repeats,
                  int(ceiling) if name == "hosted" else None)


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


# ----------------------------------------------------------------------------- costs

EIG_S = 5e-11        # dense eigvalsh of n × n: EIG_S · n³ seconds
EIGSH_S = 5e-10      # Lanczos extremes (scipy eigsh, k largest and k smallest): EIGSH_S · n² · 2k
RANGE_S = 1e-10      # all eigenvalues from the range of a rank-r matrix: RANGE_S · n² · (r + 10)
NORM_S = 5e-11       # spectral norm of m × n via its Gram matrix: NORM_S · min² (m + n)
TERM_S = 1.5e-8      # one closed-form dense term: TERM_S · P² · (1 + L d / 512) · (1 + (H − 1)/5)
PAIR_S = 4e-4        # fixed work per block pair of a dense term at L d = 256
AUTOGRAD_S = 3e-8    # autograd reference: AUTOGRAD_S · P · L (d² + d d_ff + L d) per term
POINT_S = 0.006      # fixed cost of one sweep point (weights, inputs, the block's forward and backward)
CASE_S = 0.03        # one random configuration of the bounds / LayerNorm studies
STEP_S = 2e-9        # one optimizer step: STEP_S · P · L · d (forward + closed-form gradient)

MV_CALL_S = 3e-4     # one matrix-free product call (res.matvec, hessviz.matfree): fixed cost
MV_COL_S = 3.5e-4    # … plus per column MV_COL_S + MV_S · L · P (measured 19.5 ms at L = 64, P = 166,016)
MV_S = 2e-9
REORTH_S = 1e-9      # SLQ full reorthogonalisation: REORTH_S · steps² · P per probe
EXACT_BLOCK = 256    # hessviz.matfree.block_table's default exact_limit (dense eigvalsh of H[b, b])
LIGHT_SECONDS = 0.25
"""A computation estimated under this many core-seconds (a term, an eigendecomposition or a sweep
point of the default block) runs at once, without a heavy slot of the :class:`Gate`: queued behind
a multi-second one it waited seconds for a tenth of a second of work."""

KINDS = ("map", "spectrum", "verify", "learn", "sweep", "bounds", "ln_collapse", "optimization",
         "spectrum_matfree", "heterogeneity")


def matvec_cost(cfg: BlockConfig, columns: int = 1, calls: int = 1) -> float:
    """Seconds for ``calls`` matrix-free products of ``columns`` columns each (closed form): per
    column the weights' work ``L·P`` plus each head's attention maps ``4 H L² (d_k + d_v)``."""
    L, H = cfg.seq_len, cfg.n_heads
    work = L * cfg.num_params + 4 * H * L * L * (cfg.d_k + cfg.value_width)
    return calls * (MV_CALL_S + columns * (MV_COL_S + MV_S * work))


def matvec_bytes(cfg: BlockConfig, columns: int = 1) -> int:
    """Working memory of one product: the tape (activations, ``H`` attention maps) and the
    columns in and out, O(P + L²·H + L·d_ff) per column."""
    L, d, H = cfg.seq_len, cfg.d_model, cfg.n_heads
    tape = 8 * (L * (4 * d + cfg.d_ff + 3 * H * max(cfg.d_k, cfg.value_width)) + 3 * H * L * L)
    return 4 * tape + columns * (3 * 8 * cfg.num_params + 2 * tape)


def lanczos_products(k: int) -> int:
    """Products scipy's ``eigsh`` usually needs for ``k`` extreme eigenvalues (``ncv = max(2k+1, 20)``;
    a few restarts): ``4 · ncv``, an over-estimate on the blocks measured."""
    return 4 * max(2 * k + 1, 20)


def slq_group(cfg: BlockConfig, probes: int, steps: int, group_bytes: int) -> int:
    """Probes run side by side so that their Lanczos bases (``steps × P`` each) fit ``group_bytes``."""
    basis = 8 * min(steps, cfg.num_params) * cfg.num_params
    return max(1, min(probes, group_bytes // max(1, basis)))


def block_list(cfg: BlockConfig, by_head: bool = True) -> list[tuple[str, int]]:
    """``(name, size)`` of each diagonal block of the heterogeneity table: every weight, or every
    head of a weight with heads (as :func:`hessviz.matfree.block_names`)."""
    out = []
    for name in cfg.param_names:
        if by_head and cfg.n_heads > 1 and cfg.is_headed(name):
            out += [(s, cfg.param_size(s)) for s in cfg.head_names(name)]
        else:
            out.append((name, cfg.param_size(name)))
    return out


@dataclass(frozen=True)
class Cost:
    """Estimated work of a view: core-seconds and peak bytes held."""

    seconds: float
    bytes: int
    what: str
    """In words, e.g. ``"the spectrum (three dense terms of P = 6,144)"``."""

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.seconds + other.seconds, self.bytes + other.bytes, self.what)


def term_cost(cfg: BlockConfig) -> Cost:
    """One dense closed-form term, ``(P, P)`` float64, plus its working memory.

    A real layer costs more per entry than the paper block of the same ``P``: each head pair
    has its own cross-head terms (``× (1 + (H − 1)/5)``, measured 2.5× for 8 heads at equal
    ``P``), and every block pair its own fixed work (``PAIR_S · pairs · L d / 256``: biases
    and γ/β add many small blocks; measured 2.3× at ``P`` = 1,688 with 16 weights).
    """
    P, L, d, H = cfg.num_params, cfg.seq_len, cfg.d_model, cfg.n_heads
    working = 8 * L * (L + d) * (d + cfg.d_ff + H * cfg.d_k) + 8 * H * L * L * (L + d)
    n = len(cfg.param_names)
    seconds = TERM_S * P * P * (1 + L * d / 512) * (1 + (H - 1) / 5) + PAIR_S * n * (n + 1) / 2 * L * d / 256
    return Cost(seconds, 8 * P * P + working, f"a dense term of P = {P:,}")


def block_norms_cost(cfg: BlockConfig) -> float:
    """Seconds for the spectral norm of every block pair of one term."""
    sizes = [cfg.param_size(n) for n in cfg.param_names]
    return sum(NORM_S * min(m, n) ** 2 * (m + n) for i, m in enumerate(sizes) for n in sizes[i:])


def dense_eig_cost(n: int) -> float:
    return EIG_S * n ** 3


def eig_cost(n: int, dense_limit: int, k: int, rank: int | None = None) -> float:
    """Seconds for :func:`hessviz.spectra.eigenvalues` with these arguments (same branches)."""
    if rank is not None and n > dense_limit and 2 * (rank + 10) <= n:
        return RANGE_S * n * n * (rank + 10)
    if n <= dense_limit or 2 * k >= n - 1:
        return dense_eig_cost(n)
    return EIGSH_S * n * n * 2 * k


def autograd_cost(cfg: BlockConfig) -> float:
    L, d = cfg.seq_len, cfg.d_model
    return AUTOGRAD_S * cfg.num_params * L * (d * d + d * cfg.d_ff + L * d + L * cfg.d_k)


def cost(kind: str, cfg: BlockConfig, **extra: float) -> Cost:
    """Estimated cost of one view of ``kind`` for the block ``cfg``.

    ``extra``: ``seeds``, ``points`` (sweeps, σ grid), ``cases`` (random studies),
    ``steps`` (training), ``whole`` (LayerNorm collapse: whole-matrix norms, 0 or 1),
    ``dense_limit`` and ``k`` (spectrum: as passed to :func:`hessviz.spectra.eigenvalues`),
    ``block`` (sweep: the largest swept block's weight count), ``repeats`` (verify: timed runs).
    """
    P = cfg.num_params
    t = term_cost(cfg)
    if kind == "map":          # one term held, its block norms, the heatmap's tiles
        return Cost(t.seconds + block_norms_cost(cfg), t.bytes + 8 * P * P // 4,
                    f"the Hessian map (a dense term of P = {P:,})")
    if kind == "learn":        # three terms' block norms
        return Cost(3 * (t.seconds + block_norms_cost(cfg)), 3 * t.bytes,
                    f"the decomposition (three dense terms of P = {P:,})")
    if kind == "spectrum":     # three terms held; eigvalsh needs a symmetric copy and its workspace
        limit, k = int(extra.get("dense_limit", 4096)), int(extra.get("k", 64))
        eig = 2 * eig_cost(P, limit, k) + eig_cost(P, limit, k, rank=cfg.seq_len * cfg.d_model)
        return Cost(3 * (t.seconds + block_norms_cost(cfg)) + eig, 3 * t.bytes + 2 * 8 * P * P,
                    f"the spectrum (three dense terms of P = {P:,} and their eigenvalues)")
    if kind == "verify":       # both methods, three terms each, ``repeats`` times (best of them)
        ag, repeats = autograd_cost(cfg), extra.get("repeats", 2)
        from hessviz.api import hessian_bytes
        need = hessian_bytes(cfg, cfg.param_names, 8, "autograd") + (3 + 3 * repeats) * 8 * P * P
        return Cost(repeats * 3 * (t.seconds + ag), need,
                    f"the comparison with autograd (P = {P:,}, {P:,} Hessian-vector products)")
    if kind == "sweep":        # one block pair per point; extra: points (grid × seeds × sweeps), block
        block = int(extra.get("block", 1))
        per = POINT_S + TERM_S * block * block * (1 + cfg.seq_len * cfg.d_model / 512) * 3 \
            + NORM_S * 3 * block ** 3 * 2
        if cfg.is_stack:       # the curvature crosses every block: (L d)-sized maps per layer
            per += cfg.n_layers * matvec_cost(cfg.block, columns=2 * cfg.seq_len * cfg.d_model)
        return Cost(per * extra.get("points", 1), 8 * 4 * block * block,
                    f"the sweep ({int(extra.get('points', 1))} points, blocks of {block:,} weights)")
    if kind == "bounds":       # the attention-only block here, plus the random study
        att = BlockConfig(seq_len=cfg.seq_len, d_model=cfg.d_model, d_k=cfg.d_k, norm="attention")
        ta = term_cost(att)
        Pa = att.num_params     # the whole term's norm goes through its Gram matrix: 3 n³
        return Cost(2 * ta.seconds + 3 * dense_eig_cost(Pa) + 2 * block_norms_cost(att)
                    + CASE_S * extra.get("cases", 0), 3 * ta.bytes,
                    f"the bounds (the attention block of P = {Pa:,})")
    if kind == "ln_collapse":  # σ points × seeds of a Post-LN block (whole norms: three eigvalsh)
        post = BlockConfig(seq_len=cfg.seq_len, d_model=cfg.d_model, d_k=cfg.d_k, d_ff=cfg.d_ff,
                           norm="post", ln_eps=cfg.ln_eps)
        pts = extra.get("points", 1)
        q = post.param_size("W_Q")
        per = POINT_S + TERM_S * q * q * 3 + NORM_S * 2 * q ** 3
        held = 8 * q * q * 3
        if extra.get("whole", 0):
            tp = term_cost(post)
            per += 3 * (tp.seconds + dense_eig_cost(post.num_params))
            held = 3 * tp.bytes + 2 * 8 * post.num_params ** 2
        return Cost(per * pts, held, f"the σ sweep ({int(pts)} Post-LN blocks of P = {post.num_params:,})")
    if kind == "optimization":  # both placements' heterogeneity, or training steps
        steps = extra.get("steps", 0)
        if steps:
            s = STEP_S * P * cfg.seq_len * cfg.d_model * steps * extra.get("seeds", 1) * 2 * 3
            return Cost(s, 16 * P * 8, f"the training runs ({int(steps)} steps of P = {P:,})")
        sizes = [cfg.param_size(n) for n in cfg.param_names]     # diagonal blocks only
        per = sum(TERM_S * n * n * (1 + cfg.seq_len * cfg.d_model / 512) * 3 + 2 * NORM_S * n ** 3
                  for n in sizes)
        return Cost(2 * per, 2 * 8 * 3 * max(sizes) ** 2,
                    f"the heterogeneity (diagonal Hessian blocks of up to {max(sizes):,} weights)")
    if kind == "spectrum_matfree":   # per term: top-k and bottom-k by Lanczos, an SLQ density
        k, probes, steps = int(extra.get("k", 5)), int(extra.get("probes", 4)), int(extra.get("steps", 30))
        terms = int(extra.get("terms", 3))
        group = slq_group(cfg, probes, steps, int(extra.get("group_bytes", 64 << 20)))
        per = (matvec_cost(cfg, 1, 2 * lanczos_products(k))
               + matvec_cost(cfg, group, probes * steps / group) + REORTH_S * steps * steps * P * probes)
        held = matvec_bytes(cfg, group) + 8 * P * (group * min(steps, P) + max(2 * k + 1, 20) + 2)
        return Cost(terms * per, held,
                    f"the matrix-free spectrum ({terms} term{'s' if terms > 1 else ''} of P = {P:,}: "
                    f"{2 * k} Lanczos eigenvalues and {probes} × {steps} SLQ products each)")
    if kind == "heterogeneity":      # per block: dense if small (|b| products), else Lanczos + Hutch++
        samples = int(extra.get("samples", 30))
        blocks = block_list(cfg, bool(extra.get("by_head", 1)))
        seconds, held = 0.0, matvec_bytes(cfg, 1)
        for _, n in blocks:
            if n <= EXACT_BLOCK:
                seconds += matvec_cost(cfg, n) + dense_eig_cost(n)
                held = max(held, matvec_bytes(cfg, n) + 16 * n * n)
            else:
                seconds += matvec_cost(cfg, 1, lanczos_products(1)) + matvec_cost(cfg, samples // 3, 3)
                held = max(held, matvec_bytes(cfg, samples) + 8 * n * (samples + 22))
        return Cost(seconds, held, f"the heterogeneity table ({len(blocks)} blocks of P = {P:,}, "
                                   "top eigenvalue and trace each)")
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")


WORK_FACTOR = 3.0
"""A view's computations stop once they have used this many times the seconds a view may cost
(:attr:`Limits.max_seconds`) of CPU: the estimate decides before anything runs, this bound holds
whatever the estimate missed (a sweep estimated under 4 s that ran for 47 s)."""


class OverBudget(HessvizError):
    """A view's computations used more CPU than :data:`WORK_FACTOR` times the per-view limit."""


def over_budget(what: str, used: float, lim_seconds: float, profile: str) -> OverBudget:
    """The one-line refusal of a view stopped by the work bound (``used``: CPU seconds spent)."""
    return OverBudget(f"{what[0].upper() + what[1:]} was stopped after {used:,.1f} s of computation: this "
                      f"server allows about {lim_seconds:g} s per view ({profile} profile). What was "
                      "computed is kept; lower d, d_ff or L, choose a smaller block, or use fewer seeds.")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    cost: Cost
    reason: str
    """Empty when ``ok``; else what is over which limit."""
    advice: str
    """Which controls to lower."""

    @property
    def message(self) -> str:
        return f"{self.reason} {self.advice}".strip()


def size_advice(cfg: BlockConfig) -> str:
    """Which controls to lower, naming the biggest weights."""
    shapes = cfg.param_shapes
    sizes = sorted(((math.prod(shape), n, shape) for n, shape in shapes.items()), reverse=True)
    parts = ", ".join(f"{n} {'×'.join(map(str, shape))}" for _, n, shape in sizes[:3])
    ffn = "" if all(n in ATTENTION_PARAMS for n in shapes) \
        else " or d_ff, or choose norm = attention (no FFN)"
    return (f"P = {cfg.num_params:,} (largest weights: {parts}). Lower d (P grows like d² + d·d_ff){ffn}; "
            f"L and d_k also add work.")


def check(c: Cost, lim: Limits, cfg: BlockConfig | None = None, advice: str | None = None) -> Verdict:
    """Is the view of cost ``c`` affordable under ``lim``? If not, say why and what to change."""
    reasons = []
    if c.seconds > lim.max_seconds:
        reasons.append(f"{c.what[0].upper() + c.what[1:]} would take about {c.seconds:,.0f} s of "
                       f"computation; this server allows {lim.max_seconds:g} s per view "
                       f"({lim.profile} profile).")
    if c.bytes > lim.results_bytes:
        reasons.append(f"It needs about {format_bytes(c.bytes)} of memory; this server keeps at most "
                       f"{format_bytes(lim.results_bytes)} of results for all visitors together.")
    if not reasons:
        return Verdict(True, c, "", "")
    tip = advice if advice is not None else (size_advice(cfg) if cfg is not None else "")
    return Verdict(False, c, " ".join(reasons), tip)


# ----------------------------------------------------------------------------- gates

Waiting = Callable[[int], None]
"""Called about every 0.25 s while waiting with the place in line (1 = next); may raise to give up."""


class Gate:
    """At most ``slots`` heavy computations at once, first come first served.

    Re-entrant per thread: a computation that needs another (a spectrum needs the term)
    does not queue behind itself.
    """

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self._cv = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()
        self._running = 0
        self._local = threading.local()

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @contextmanager
    def slot(self, waiting: Waiting | None = None, poll: float = 0.25) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth:
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth = depth
            return
        ticket = object()
        with self._cv:
            self._queue.append(ticket)
        try:
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
        except BaseException:
            with self._cv:
                if ticket in self._queue:
                    self._queue.remove(ticket)
                self._cv.notify_all()
            raise
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

    def _must_wait(self, nbytes: int) -> bool:
        """Over the accounted capacity, or over the measured ceiling while others' computations
        (which will free memory) are in flight: the cache is evicted for the ceiling only once
        nothing else is computing, since what is in flight is part of what was measured (evicting
        then emptied the cache and every visitor's next view was computed again)."""
        return self._over(nbytes) > 0 or (self.process_over(nbytes) > 0 and self._in_flight > 0)

    @contextmanager
    def reserve(self, nbytes: int, what: str, waiting: Waiting | None = None,
                poll: float = 0.25) -> Iterator[None]:
        """Hold ``nbytes`` while computing; evict cached results first, then wait for others.

        Cached results are evicted only when that makes room: while the computations in flight
        leave less than ``nbytes`` even with an empty cache, this waits for them and keeps the
        cache (emptying it then freed nothing that helped, and every visitor's next view was
        computed again). A thread that already holds a reservation (a spectrum computing its
        term) does not wait: two visitors each waiting for the other's memory would wait forever.
        """
        nbytes = int(nbytes)
        if nbytes > self.capacity:
            raise SizeError(f"{what} needs about {format_bytes(nbytes)}; this server keeps at most "
                            f"{format_bytes(self.capacity)} of results for all visitors",
                            needed_bytes=nbytes, limit_bytes=self.capacity)
        nested = getattr(self._local, "depth", 0) > 0
        while True:
            over = self._over(nbytes)
            if over > 0 and (nested or self._in_flight + nbytes <= self.capacity):
                self.evict(over)
            if self._cached > 0 and (nested or self._in_flight == 0) and self.process_over(nbytes) > 0:
                self.evict(self.process_over(nbytes))       # others' work in flight: wait for it first
            with self._lock:
                if nested or not self._must_wait(nbytes):
                    self._in_flight += nbytes
                    break
                self._lock.wait(poll)
            if waiting is not None:
                waiting(0)
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1
            with self._lock:
                self._in_flight -= nbytes
                self._lock.notify_all()
