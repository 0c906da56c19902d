"""The Streamlit layer of hessviz: the only package that imports ``streamlit``.

A page is a short script in ``hessviz/app/pages/`` that reads widgets, calls hessviz and draws
figures from :mod:`hessviz.plots`. The shared pieces live here::

    import streamlit as st
    from hessviz import app as hva
    from hessviz import plots

    view = hva.page(                         # shared controls (bound to the URL), the title + the
        "My page",                           # block in words ("Post-LN block, L = 8, …"), then what
        "What is drawn, for a student.",     # is drawn, for a student, and its formulas; a View
        r"H = H_o + H_f",
    )
    hva.afford(view, "map")                  # ask the budget; over it: what to change, and stop
    term = hva.choice("Term", NAMES, key="term", default="full")   # from hessviz.block.terms import NAMES
    with hva.guard("the Hessian"):           # errors -> message; queue place, progress, cancellation
        H = hva.cache.term(view.key, term)   # cached, read-only numpy (P, P)
    fig = plots.hessian_heatmap(H, hva.cache.offsets(view.key))
    hva.chart(fig, "hessian_map", npz=lambda: {"H": H})   # plot + HTML/CSV/NPZ download buttons

``View`` (see :mod:`hessviz.app.state`) carries ``cfg`` (a :class:`hessviz.BlockConfig`),
``input_norm``, ``seed``, ``inputs`` (``params, X, Y`` on the app's device), ``key``
(the hashable cache key), ``describe()`` and ``with_values(norm="pre", …)``.

:func:`page` is :func:`sidebar`, :func:`header` and :func:`explain` in turn; a page whose caption
is written later (Heterogeneity) calls them itself. A page that does not use the block's shared
controls (the Real model page) calls :func:`link_only` instead of :func:`sidebar`; :func:`text` is a
URL-bound text box.

Shared URL keys: :data:`hessviz.app.state.SHARED_KEYS`, the ``url`` of every setting of
:data:`hessviz.app.settings.SETTINGS` (the block's fields the app offers, ``xnorm`` and ``seed``; not
listed here, so the list cannot go stale); they carry over from page to page. Page controls made with
:func:`choice`, :func:`multichoice`, :func:`select`, :func:`slider` and :func:`text` live in the
URL under their own ``key`` too and appear in the sidebar's "link to this view"; pick page keys
that do not clash with the shared ones (prefix them, e.g. ``opt_lr``).
Lesson links add ``hide=`` (keys, or ``sidebar``) and ``present=1``. The rules are
:mod:`hessviz.app.address`; :func:`hessviz.app.main.main` starts each run with :func:`begin_run`
and :func:`open_page`.

Every cache is in :mod:`hessviz.app.cache` (``term``, ``block_norms``, ``spectrum``,
``verify``, the matrix-free ``matfree_spectrum`` and ``block_table``, the sweeps, the claim
pages' studies; and in :mod:`hessviz.app.real_cache` the Real model page's ``real_stack``,
``real_states``, ``real_tokens``, ``real_config``, ``real_attention``, ``real_window``,
``real_gradients`` and ``real_block_table``, which read the precomputed default views first,
:mod:`hessviz.app.real_model`, and the Whole model page's ``whole_table``, which reads the
precomputed default tables first, :mod:`hessviz.app.whole_model`): one server-wide store
bounded by bytes under the limits of :mod:`hessviz.app.profiles`, held by the gates of
:mod:`hessviz.app.gates`; pages define none. :func:`verdict` asks the budget
(:mod:`hessviz.app.budget`) without drawing (to choose between a dense and a matrix-free method);
:func:`afford` asks and refuses. The app's policy (profiles, budget, gates) lives here only: the
library gives neutral costs per computation (:mod:`hessviz.checks.cost`) and never names a page.
The page list (titles, icons, URL paths) is :mod:`hessviz.app.registry`.

Importing this package imports nothing heavy: the modules without Streamlit (the lesson pages'
builder :mod:`hessviz.app.lesson_page`, the caches, the budget) work in an install without the
``app`` extra, and the names above load on first use. :func:`preload` imports everything the pages
need (:data:`PRELOAD`) once, under a lock, before any page runs (:func:`hessviz.app.main.main`).
"""

import gc
import importlib
import threading

PRELOAD = (
    "numpy",
    "scipy.sparse.linalg",
    "scipy.stats",
    "pandas",
    "pyarrow",
    "plotly.graph_objects",
    "plotly.subplots",
    "plotly.io",
    "hessviz.plots",
    "hessviz.experiments.report",
    "hessviz.app.controls",
    "hessviz.app.page_controls",
    "hessviz.app.ui",
)
"""Modules imported once at startup: concurrent first imports of pandas from several script
threads raised ``partially initialized module 'pandas' has no attribute 'Series'``."""
_PRELOADED = threading.Lock()
_preloaded = False


def preload() -> None:
    """Import :data:`PRELOAD` once per process, then freeze what is loaded out of the collector's sight.

    A full garbage collection walks every object the process holds: with torch, scipy, pandas and
    plotly loaded that is ~300,000 objects (its time: benchmarks/APP.md), with the GIL held.
    Streamlit ran one after every script run (``runner.postScriptGC``, off in the app's
    ``config.toml``: with thirty sessions connected even the rest cost 10-25 ms per run), and
    Python's own collections of the oldest generation still do. What is loaded now lives as long as
    the process: collect once and move it out of the collector's sight (``gc.freeze``); later
    collections walk only what the sessions create, and still free their cycles."""
    global _preloaded
    with _PRELOADED:
        if _preloaded:
            return
        for name in PRELOAD:
            importlib.import_module(name)
        gc.collect()
        gc.freeze()
        _preloaded = True


_LAZY = {
    **dict.fromkeys(
        ("begin_run", "lesson", "link_only", "open_page", "sidebar"),
        "hessviz.app.controls",
    ),
    **dict.fromkeys(("choice", "multichoice", "select", "slider", "text"), "hessviz.app.page_controls"),
    **dict.fromkeys(
        ("DEFAULTS", "SHARED_KEYS", "View", "device", "device_label", "plain"), "hessviz.app.state"
    ),
    **dict.fromkeys(
        (
            "afford",
            "block_columns",
            "chart",
            "csv_bytes",
            "downloads",
            "explain",
            "figure_html",
            "guard",
            "header",
            "long_note",
            "npz_bytes",
            "page",
            "size_advice",
            "table",
            "verdict",
        ),
        "hessviz.app.ui",
    ),
}
"""The names pages use as ``hva.<name>``, and the module each lives in (loaded on first use)."""
_SUBMODULES = ("address", "cache", "controls", "progress", "real_cache", "registry", "state")


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"hessviz.app.{name}")
    else:
        raise AttributeError(f"module 'hessviz.app' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["PRELOAD", "preload", *_SUBMODULES, *_LAZY]
