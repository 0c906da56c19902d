"""The papers' claims, measured (issue 4): sweeps, fits, bounds, heterogeneity and training.

``reproduce(out_dir, quick)`` runs every claim and writes ``claims.json`` and ``report.md``.
One module per claim family: :mod:`~hessviz.experiments.scaling` (``xnorm6``, ``placement``,
``seqlen``), :mod:`~hessviz.experiments.nonconvex`, :mod:`~hessviz.experiments.ln_collapse`,
:mod:`~hessviz.experiments.bounds`, :mod:`~hessviz.experiments.heterogeneity` (``gini``),
:mod:`~hessviz.experiments.optimizers`; :mod:`~hessviz.experiments.fitting` holds the slope
fits and the Gini coefficient, :mod:`~hessviz.experiments.figures` the plotly figures.
"""

from hessviz.experiments.common import CLAIM_IDS, ClaimResult
from hessviz.experiments.fitting import gini, power_law_fit, slope_over_seeds
from hessviz.experiments.report import PAGE_LINKS, reproduce, run_claims

__all__ = [
    "CLAIM_IDS",
    "PAGE_LINKS",
    "ClaimResult",
    "gini",
    "power_law_fit",
    "reproduce",
    "run_claims",
    "slope_over_seeds",
]
