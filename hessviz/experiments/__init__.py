"""The papers' claims, measured (issue 4): sweeps, fits, bounds, heterogeneity and training.

``reproduce(out_dir, quick)`` runs every claim and writes ``claims.json`` and ``report.md``.
Each claim is a :class:`~hessviz.experiments.common.Claim` in three steps (measure, judge,
report); one module per claim family: :mod:`~hessviz.experiments.scaling` (``xnorm6``,
``placement``, ``seqlen``), :mod:`~hessviz.experiments.nonconvex`,
:mod:`~hessviz.experiments.ln_collapse`, :mod:`~hessviz.experiments.bounds`,
:mod:`~hessviz.experiments.heterogeneity` (``gini``), :mod:`~hessviz.experiments.optimizers`.
Fits live in :mod:`hessviz.laws.fitting`, sweeps in :mod:`hessviz.laws.sweeps`, figures in
:mod:`hessviz.plots`: the app uses the same ones.
"""

from hessviz.experiments.common import CLAIM_IDS, Claim, ClaimResult
from hessviz.experiments.report import claims, reproduce, run_claims

__all__ = ["CLAIM_IDS", "Claim", "ClaimResult", "claims", "reproduce", "run_claims"]
