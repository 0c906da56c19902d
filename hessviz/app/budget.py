r"""What one view of a page costs, and whether this server can afford it (numeric only, no Streamlit).

**Cost of a view.** :func:`cost` composes, for one kind of view (:data:`KINDS`, the pages'
views), the library's neutral estimates of the computations the view runs
(:mod:`hessviz.checks.cost`: core-seconds, peak bytes, products) from the block's sizes alone,
before anything is allocated. :func:`check` compares a cost with the server's limits
(:class:`hessviz.app.profiles.Limits`) and, when it is over, says which control to lower
(:class:`Verdict`). An estimate can miss: the app also stops a view's computations once they
have used :data:`WORK_FACTOR` times the per-view seconds of CPU (:class:`OverBudget`).

>>> from hessviz.app.profiles import Limits
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

import math
from dataclasses import dataclass

from hessviz.app.profiles import Limits
from hessviz.block.config import ATTENTION_PARAMS, BlockConfig
from hessviz.checks import cost as costs
from hessviz.checks.cost import Cost
from hessviz.errors import HessvizError
from hessviz.runtime.memory import format_bytes

KINDS = (
    "map",
    "spectrum",
    "verify",
    "learn",
    "sweep",
    "bounds",
    "ln_collapse",
    "optimization",
    "spectrum_matfree",
    "heterogeneity",
    "depth",
)
HEATMAP_S = 5e-9
"""Seconds per entry of the dense term to draw the Hessian map's heatmap (its largest entry, the
tiles' extremes); calibration: ``benchmarks/COST.md``."""
LIGHT_SECONDS = 0.25
"""A computation estimated under this many core-seconds (a term, an eigendecomposition or a sweep
point of the default block) runs at once, without a heavy slot of the gate
(:class:`hessviz.app.gates.Gate`): queued behind a multi-second one it waited seconds for a tenth of
a second of work."""


def cost(kind: str, cfg: BlockConfig, **extra: float) -> Cost:
    """Estimated cost of one view of ``kind`` for the block ``cfg``.

    ``extra``: ``seeds``, ``points`` (sweeps, σ grid), ``cases`` (random studies),
    ``steps`` (training), ``whole`` (LayerNorm collapse: whole-matrix norms, 0 or 1),
    ``dense_limit`` and ``k`` (spectrum: as passed to :func:`hessviz.matfree.spectra.eigenvalues`),
    ``weight_count`` (sweep: the entries of the largest swept weight), ``repeats`` (verify: timed runs),
    ``k``, ``probes``, ``steps``, ``terms``, ``group_bytes`` (matrix-free spectrum),
    ``samples``, ``by_head`` (heterogeneity table), ``depth``, ``seeds``, ``weight_count`` (the Depth
    page: each point priced at its own stack depth, :func:`depth_points`).
    """
    P = cfg.num_params
    t = costs.term_cost(cfg)
    if kind == "map":  # one term held, its block norms, the heatmap's tiles
        return Cost(
            t.seconds + costs.block_norms_cost(cfg) + HEATMAP_S * P * P,
            t.bytes + 8 * P * P // 4,
            f"the Hessian map (a dense term of P = {P:,})",
        )
    if kind == "learn":  # three terms' block norms
        return Cost(
            3 * (t.seconds + costs.block_norms_cost(cfg)),
            3 * t.bytes,
            f"the decomposition (three dense terms of P = {P:,})",
        )
    if kind == "spectrum":  # three terms held; eigvalsh needs a symmetric copy and its workspace
        from hessviz.matfree.spectra import DENSE_LIMIT

        limit, k = int(extra.get("dense_limit", DENSE_LIMIT)), int(extra.get("k", 64))
        eig = 2 * costs.eig_cost(P, limit, k) + costs.eig_cost(P, limit, k, rank=cfg.seq_len * cfg.d_model)
        return Cost(
            3 * (t.seconds + costs.block_norms_cost(cfg)) + eig,
            3 * t.bytes + 2 * 8 * P * P,
            f"the spectrum (three dense terms of P = {P:,} and their eigenvalues)",
        )
    if kind == "verify":  # both methods, three terms each, ``repeats`` times (best of them)
        return costs.compare_cost(cfg, int(extra.get("repeats", 2)))
    if kind == "sweep":  # one block pair per point; extra: points (grid × seeds × sweeps), weight_count
        weight_count = int(extra.get("weight_count", 1))
        return Cost(
            costs.sweep_point_cost(cfg, weight_count) * extra.get("points", 1),
            8 * 4 * weight_count * weight_count,
            f"the sweep ({int(extra.get('points', 1))} points, weights of {weight_count:,} entries)",
        )
    if kind == "bounds":  # the attention-only block here, plus the random study
        a = costs.attention_case_cost(cfg)
        return Cost(a.seconds + costs.CASE_S * extra.get("cases", 0), a.bytes, f"the bounds ({a.what})")
    if kind == "ln_collapse":  # σ points × seeds of a Post-LN block (whole norms: three eigvalsh)
        pts = extra.get("points", 1)
        p = costs.ln_point_cost(cfg, bool(extra.get("whole", 0)))
        return Cost(p.seconds * pts, p.bytes, f"the σ sweep ({int(pts)} points, each {p.what})")
    if kind == "optimization":  # both placements' heterogeneity, or training steps
        steps = extra.get("steps", 0)
        if steps:
            tr = costs.training_cost(cfg, steps, extra.get("seeds", 1) * 2)
            return Cost(tr.seconds, tr.bytes, f"the training runs ({int(steps)} steps of P = {P:,})")
        d, n = costs.diagonal_blocks_cost(cfg), len(HETEROGENEITY_SIDES)
        return Cost(n * d.seconds, n * d.bytes, f"the heterogeneity ({d.what})")
    if kind == "spectrum_matfree":  # per term: top-k and bottom-k by Lanczos, an SLQ density
        k, probes, steps = int(extra.get("k", 5)), int(extra.get("probes", 4)), int(extra.get("steps", 30))
        terms = int(extra.get("terms", 3))
        m = costs.matfree_spectrum_cost(cfg, k, probes, steps, int(extra.get("group_bytes", 64 << 20)))
        return Cost(
            terms * m.seconds,
            m.bytes,
            f"the matrix-free spectrum ({terms} term{'s' if terms > 1 else ''} of P = {P:,}: "
            f"{2 * k} Lanczos eigenvalues and {probes} × {steps} SLQ products each)",
            terms * m.products,
        )
    if kind == "heterogeneity":  # per block: dense if small (|b| products), else Lanczos + Hutch++
        b = costs.block_table_cost(cfg, int(extra.get("samples", 30)), bool(extra.get("by_head", 1)))
        return Cost(b.seconds, b.bytes, f"the heterogeneity table ({b.what})", b.products)
    if kind == "depth":
        weight_count, points = (
            int(extra.get("weight_count", 1)),
            depth_points(cfg, int(extra.get("depth", 2)), int(extra.get("seeds", 1))),
        )
        return Cost(
            sum(costs.sweep_point_cost(c, weight_count) for c in points),
            8 * 4 * weight_count * weight_count,
            f"the depth views ({len(points)} points, weights of {weight_count:,} entries)",
        )
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")


DEPTH_SIDES = ("post", "pre", "peri")
"""The placements the Depth page sets side by side."""
HETEROGENEITY_SIDES = ("post", "pre", "peri")
"""The placements the Optimization page's gradient view sets side by side."""


def depth_points(cfg: BlockConfig, depth: int, seeds: int) -> list[BlockConfig]:
    """The stacks the Depth page computes a point of, one per point: for each of :data:`DEPTH_SIDES` and each
    seed, every layer of a ``depth``-block stack, then the first layer of stacks of
    ``hessviz.laws.sweeps.DEFAULT_GRIDS["layers"]`` blocks."""
    import dataclasses

    from hessviz.laws.sweeps import DEFAULT_GRIDS

    out = []
    for norm in DEPTH_SIDES:
        placed = dataclasses.replace(cfg.block, norm=norm)
        stacks = [depth] * depth + [int(n) for n in DEFAULT_GRIDS["layers"]]
        out += [dataclasses.replace(placed, n_layers=n) for n in stacks for _ in range(seeds)]
    return out


LONG_SECONDS = 10.0
"""A view estimated over this many core-seconds says so before it runs (:func:`long_words`)."""


def about(seconds: float) -> str:
    """``"about 25 s"``, ``"about 2.2 min"``: two significant figures (whole seconds), the unit a
    visitor reads.

    >>> about(24.6), about(130), about(7.25)
    ('about 25 s', 'about 2.2 min', 'about 7 s')
    """
    if seconds >= 100:
        return f"about {seconds / 60:.2g} min"
    return f"about {max(1, round(float(f'{seconds:.2g}'))):d} s"


def long_words(c: Cost) -> str:
    """The note a view of cost ``c`` over :data:`LONG_SECONDS` shows before it runs (else ``""``).

    >>> long_words(Cost(24.6, 0, "the spectrum (three dense terms of P = 5,632)"))[:44]
    '**This view takes about 25 s** to compute: t'
    """
    if c.seconds <= LONG_SECONDS:
        return ""
    return (
        f"**This view takes {about(c.seconds)}** to compute: {c.what}. The bar below shows its "
        "progress; moving a control or leaving the page stops it."
    )


WORK_FACTOR = 3.0
"""A view's computations stop once they have used this many times the seconds a view may cost
(:attr:`hessviz.app.profiles.Limits.max_seconds`) of CPU: the estimate decides before anything
runs, this bound holds whatever the estimate missed (the sweep that ran far past its estimate:
``benchmarks/COST.md``)."""


class OverBudget(HessvizError):
    """A view's computations used more CPU than :data:`WORK_FACTOR` times the per-view limit."""


def over_budget(what: str, used: float, lim_seconds: float, profile: str) -> OverBudget:
    """The one-line refusal of a view stopped by the work bound (``used``: CPU seconds spent). Its
    ``stopped`` attribute is the sentence without the generic advice, for a page that names its own
    controls (:func:`hessviz.app.ui.guard`'s ``advice``)."""
    stopped = (
        f"{what[0].upper() + what[1:]} was stopped after {used:,.1f} s of computation: this "
        f"server allows about {lim_seconds:g} s per view ({profile} profile). What was computed is kept."
    )
    err = OverBudget(f"{stopped[:-1]}; lower d, d_ff or L, choose a smaller block, or use fewer seeds.")
    err.stopped = stopped
    return err


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
    ffn = (
        "" if all(n in ATTENTION_PARAMS for n in shapes) else " or d_ff, or choose norm = attention (no FFN)"
    )
    return (
        f"P = {cfg.num_params:,} (largest weights: {parts}). Lower d (P grows like d² + d·d_ff){ffn}; "
        f"L and d_k also add work."
    )


def block_advice(pair: str, largest: int, where: str = "on this grid") -> str:
    """Which controls to lower when the block pair ``pair`` (``"W_Q,W_Q"``, ``"W_1,W_2"``) of up to
    ``largest`` weights is over the budget: an FFN block can be swapped for an attention one, an
    attention block only shrunk (it is one already).

    >>> block_advice("W_1,W_1", 512).split(": ")[1]
    'pick an attention block (W_Q,W_Q), lower d_ff or d, or use fewer seeds.'
    >>> block_advice("W_Q[0],W_Q[0]", 512).split(": ")[1]
    'lower d, d_k or the heads, or use fewer seeds.'
    """
    names = [n.partition("[")[0] for n in pair.split(",")]
    attention = all(n in (*ATTENTION_PARAMS, "W_O") for n in names)
    todo = "lower d, d_k or the heads" if attention else "pick an attention block (W_Q,W_Q), lower d_ff or d"
    return f"The {pair} block reaches {largest:,} weights {where}: {todo}, or use fewer seeds."


def check(c: Cost, lim: Limits, cfg: BlockConfig | None = None, advice: str | None = None) -> Verdict:
    """Is the view of cost ``c`` affordable under ``lim``? If not, say why and what to change."""
    reasons = []
    if c.seconds > lim.max_seconds:
        reasons.append(
            f"{c.what[0].upper() + c.what[1:]} would take about {c.seconds:,.0f} s of "
            f"computation; this server allows {lim.max_seconds:g} s per view "
            f"({lim.profile} profile)."
        )
    if c.bytes > lim.results_bytes:
        reasons.append(
            f"It needs about {format_bytes(c.bytes)} of memory; this server keeps at most "
            f"{format_bytes(lim.results_bytes)} of results for all visitors together."
        )
    if not reasons:
        return Verdict(True, c, "", "")
    tip = advice if advice is not None else (size_advice(cfg) if cfg is not None else "")
    return Verdict(False, c, " ".join(reasons), tip)
