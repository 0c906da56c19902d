"""What every claim module shares: the three steps of a claim, the tolerances its verdict
uses, the result record and block norms.

A claim runs in three steps (:class:`Claim`):

1. **measure** ``(quick) -> Measurement``: the numbers (``claims.json``'s ``measured``),
   the raw arrays (``data/<id>.npz``) and whatever else the report draws;
2. **judge** ``(numbers) -> Verdict``: ``holds`` computed from the numbers against the
   stated thresholds below, and the rule in words;
3. **report** ``(Measurement, Verdict) -> (note, figures)``: prose and figures.

One tolerance per kind of comparison, used by the claims and the app's pages alike:
:data:`SLOPE_TOL` (a fitted exponent against the theory's), :data:`BOUND_RTOL` (an exact
norm against its bound, :func:`violations`) and :data:`NEGATIVE_RTOL` (an eigenvalue
counted as negative).

The long studies take ``progress=`` (:data:`Progress`), the convention of :mod:`hessviz.matfree`:
``progress(done, total, message)`` after each unit of work (a configuration, a seed, a point,
a training run); an exception it raises cancels the study and propagates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

import hessviz as hv
from hessviz.matfree.spectra import matrix_norm
from hessviz.matfree.spectral import Progress

__all__ = ["Progress"]  # re-exported: the studies' progress callbacks (hessviz.matfree's convention)

CLAIM_IDS = (
    "xnorm6",
    "placement",
    "seqlen",
    "nonconvex",
    "ln_collapse",
    "bounds",
    "gini",
    "optimizers",
    "depth",
    "modern",
    "growth_protocol",
    "gini_protocol",
    "optimizers_protocol",
)

SOURCES = {
    "petrov": "Petrov, Kiselev, Meshkov, Grabovoy, 'Closing the Curvature Gap: Full Transformer Hessians "
    "and Their Implications for Scaling Laws', arXiv:2510.16927",
    "ormaniec": "Ormaniec, Dangel, Singh, 'What Does It Mean to Be a Transformer? Insights from a "
    "Theoretical Hessian Analysis', arXiv:2410.10986 (ICLR 2025)",
    "tomihari": "Tomihari, Sato, 'Gradient Heterogeneity Complements Hessian Heterogeneity in Transformer "
    "Optimization' (earlier version arXiv:2502.00213)",
}

SLOPE_TOL = 0.15
"""A fitted exponent agrees with the theory's when ``|fitted − theory| < SLOPE_TOL``."""
BOUND_RTOL = 1e-9
"""An exact norm violates its bound when ``exact > bound · (1 + BOUND_RTOL)``: round-off is no violation."""
NEGATIVE_RTOL = 1e-10
"""An eigenvalue is negative when ``λ < −NEGATIVE_RTOL · max|λ|`` (round-off is not curvature)."""

Holds = bool | str
"""``True``, ``False`` or ``"partly"``."""


def violated(exact, bound) -> np.ndarray:
    """Where ``exact > bound · (1 + BOUND_RTOL)`` (elementwise).

    >>> violated(np.array([1.0, 1.0 + 1e-12, 1.1]), np.ones(3)).tolist()
    [False, False, True]
    """
    return np.asarray(exact, dtype=float) > np.asarray(bound, dtype=float) * (1 + BOUND_RTOL)


def violations(exact, bound) -> int:
    """How many ``exact`` exceed their ``bound`` (:func:`violated`)."""
    return int(violated(exact, bound).sum())


@dataclass
class Measurement:
    """What a claim's measure step returns."""

    numbers: dict
    """key -> number or list of numbers: ``claims.json``'s ``measured``."""
    data: dict = field(default_factory=dict)
    """name -> numpy array, written to ``data/<id>.npz``."""
    detail: dict = field(default_factory=dict)
    """Anything else the report step draws or cites (sweeps, fits, settings)."""


@dataclass(frozen=True)
class Verdict:
    holds: Holds
    rule: str
    """The thresholds, in words, with the numbers they were applied to."""


def grade(all_of: bool, some_of: bool, rule: str) -> Verdict:
    """``True`` when ``all_of``, else ``"partly"`` when ``some_of``, else ``False``."""
    return Verdict(True if all_of else ("partly" if some_of else False), rule)


@dataclass(frozen=True)
class Claim:
    """One statement from a paper and the three steps that check it."""

    id: str
    statement: str
    source: str
    measure: Callable[[bool], Measurement]
    judge: Callable[[dict], Verdict]
    report: Callable[[Measurement, Verdict], tuple[str, dict]]
    """``-> (note, {name: plotly Figure})``."""

    def run(self, quick: bool = False) -> ClaimResult:
        m = self.measure(quick)
        v = self.judge(m.numbers)
        note, figures = self.report(m, v)
        return ClaimResult(
            self.id, self.statement, self.source, m.numbers, v.holds, note, figures, m.data, rule=v.rule
        )


@dataclass
class ClaimResult:
    """One claim, measured: the record of ``claims.json`` plus figures and raw data."""

    id: str
    claim: str
    source: str
    measured: dict
    holds: Holds
    note: str
    figures: dict = field(default_factory=dict)
    """name -> plotly Figure."""
    data: dict = field(default_factory=dict)
    """name -> numpy array (written to an NPZ next to the report)."""
    seconds: float = 0.0
    rule: str = ""
    """How ``holds`` was decided (:attr:`Verdict.rule`)."""

    def entry(self) -> dict:
        """This result's entry in ``claims.json``."""
        return {
            "id": self.id,
            "claim": self.claim,
            "source": self.source,
            "measured": clean_measured(self.measured),
            "holds": self.holds,
            "note": self.note,
        }


def _to_number(v):
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_to_number(u) for u in np.asarray(v, dtype=float).ravel().tolist()]
    if isinstance(v, (bool, np.bool_)):
        return float(v)
    return float(v)


def clean_measured(measured: dict) -> dict:
    """Plain floats (or lists of floats); raises on anything non-finite."""
    out = {}
    for k, v in measured.items():
        num = _to_number(v)
        flat = num if isinstance(num, list) else [num]
        if not all(math.isfinite(u) for u in flat):
            raise ValueError(f"measured[{k!r}] is not finite: {v!r}")
        out[k] = num
    return out


def block_norm(res, a: str, b: str, term: str) -> float:
    """Spectral norm of one block of a :class:`~hessviz.HessianResult`."""
    return matrix_norm(res.block(a, b, term=term))


def unit_entry_norm(cfg: hv.BlockConfig) -> float:
    """``√L + √d``: the spectral norm a Gaussian ``X`` with unit-variance entries has, roughly."""
    return math.sqrt(cfg.seq_len) + math.sqrt(cfg.d_model)


def softmax_jacobian_norm(cfg: hv.BlockConfig, params: dict, X: torch.Tensor) -> float:
    """``max_t ‖diag(a_t) − a_t a_tᵀ‖₂`` of the attention rows (``1/L`` when uniform, ``≤ 1/2``)."""
    from hessviz.dense.record import record
    from hessviz.ops import softmax

    A = record(cfg, params, X).attention.A
    return float(torch.linalg.matrix_norm(softmax.jacobian(A), ord=2).max())
