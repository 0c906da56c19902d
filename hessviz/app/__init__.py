"""The Streamlit layer of hessviz: the only package that imports ``streamlit``.

A page is a short script in ``pages/`` that reads widgets, calls hessviz and draws
figures from :mod:`hessviz.plots`. The shared pieces live here::

    import streamlit as st
    from hessviz import app as hva
    from hessviz import plots

    view = hva.sidebar()                     # shared controls, bound to the URL; returns a View
    hva.header("My page", view)              # title + the block in words ("Post-LN block, L = 8, …")
    hva.explain("What is drawn, for a student.", r"H = H_o + H_f")
    hva.require_size(view, max_params=4096)  # refuse sizes this page cannot draw quickly (stops)
    term = hva.choice("Term", ["full", "outer", "functional"], key="term", default="full")
    with hva.guard("the Hessian"):           # hessviz errors -> message with what to change, stop
        H = hva.cache.term(view.key, term)   # cached, read-only numpy (P, P)
    fig = plots.hessian_heatmap(H, hva.cache.offsets(view.key))
    hva.chart(fig, "hessian_map", npz=lambda: {"H": H})   # plot + HTML/CSV/NPZ download buttons

``View`` (see :mod:`hessviz.app.state`) carries ``cfg`` (a :class:`hessviz.BlockConfig`),
``input_norm``, ``seed``, ``inputs`` (``params, X, Y`` on the app's device), ``key``
(the hashable cache key), ``describe()`` and ``with_values(norm="pre", …)``.

Shared URL keys: ``L d dk dff norm act loss xnorm eps seed``. Page controls made with
:func:`choice`, :func:`select`, :func:`slider`, :func:`toggle` are bound to the URL
under their own ``key`` too and appear in the sidebar's "link to this view"; pick page
keys that do not clash with the shared ones (prefix them, e.g. ``opt_lr``).

Cached computations: :mod:`hessviz.app.cache` (``term``, ``block_norms``, ``spectrum``,
``verify``), all keyed by ``view.key`` and bounded by ``max_entries``.
The page list (titles, icons, URL paths) is :mod:`hessviz.app.registry`.
"""

from hessviz.app import cache, registry, state
from hessviz.app.state import DEFAULTS, SHARED_KEYS, View, device, device_label
from hessviz.app.ui import (
    chart,
    choice,
    csv_bytes,
    downloads,
    explain,
    figure_html,
    guard,
    header,
    link_to_view,
    multichoice,
    npz_bytes,
    require_size,
    select,
    sidebar,
    size_advice,
    slider,
    toggle,
)

__all__ = [
    "DEFAULTS", "SHARED_KEYS", "View", "cache", "chart", "choice", "csv_bytes", "device", "device_label",
    "downloads", "explain", "figure_html", "guard", "header", "link_to_view", "multichoice", "npz_bytes",
    "registry", "require_size", "select", "sidebar", "size_advice", "slider", "state", "toggle",
]
