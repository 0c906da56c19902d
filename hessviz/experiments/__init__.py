"""The papers' claims, measured (issue 4): sweeps, fits, bounds, heterogeneity and training.

``reproduce(out_dir, quick)`` runs every claim and writes ``claims.json`` and ``report.md``.
"""
