"""Cached computations for the pages: bounded Streamlit caches over hessviz.

Every function takes ``view.key`` (hashable) rather than tensors, so the cache key is
the URL state. Results are CPU numpy arrays marked read-only; pages must not modify
them. Bounds (``max_entries``) keep memory flat however long the app runs: at the
default view (P = 1536) one term is 19 MiB.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import streamlit as st

import hessviz as hv
from hessviz import spectra, sweeps
from hessviz.app.state import View
from hessviz.verify import compare


def _view(key: tuple) -> View:
    return View.from_values(dict(key))


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@st.cache_resource(max_entries=6, show_spinner=False)
def term(key: tuple, term: str, method: str = "closed_form") -> np.ndarray:
    """The dense ``(P, P)`` Hessian term ``full``/``outer``/``functional`` of the view."""
    view = _view(key)
    params, X, Y = view.inputs
    res = hv.hessian(view.cfg, params, X, Y, method=method)
    return _readonly(res.term(term).detach().cpu().numpy())


def offsets(key: tuple) -> dict[str, slice]:
    """``name -> slice`` of each weight in θ."""
    return _view(key).cfg.offsets()


@st.cache_data(max_entries=48, show_spinner=False)
def block_norms(key: tuple, term_name: str, kind: str = "spectral") -> np.ndarray:
    """``(n, n)`` spectral (``"spectral"``) or Frobenius (``"fro"``) norms of every block pair."""
    import torch

    H = torch.from_numpy(np.array(term(key, term_name)))
    return spectra.block_norm_matrix(H, offsets(key), kind)


@st.cache_data(max_entries=24, show_spinner=False)
def spectrum(key: tuple, term_name: str, k: int = 64, dense_limit: int = spectra.DENSE_LIMIT) -> dict:
    """Eigenvalues of one term: ``values`` (ascending), ``partial``, ``size``, ``method``, negatives."""
    import torch

    spec = spectra.eigenvalues(torch.from_numpy(np.array(term(key, term_name))), k=k,
                               dense_limit=dense_limit)
    neg = spectra.negative_summary(spec)
    return {"values": spec.values, "partial": spec.partial, "size": spec.size, "method": spec.method,
            "negative_count": neg.count, "negative_share": neg.share, "negative_mass": neg.mass,
            "min": neg.min_eigenvalue, "max": neg.max_eigenvalue, "tolerance": neg.tolerance}


@st.cache_data(max_entries=8, show_spinner=False)
def verify(key: tuple, nonce: int = 0) -> dict:
    """:func:`hessviz.verify.compare` of the view: per block and term the relative error,
    and the wall time of all three terms per method (best of two). ``nonce`` only forces a
    fresh measurement."""
    view = _view(key)
    params, X, Y = view.inputs
    out = compare(view.cfg, params, X, Y, repeats=2)
    return {"names": out.names, "rel_err": out.block_errors, "times": out.seconds,
            "whole": out.whole_errors}


@st.cache_data(max_entries=4096, show_spinner=False)
def _sweep_point(cfg_fields: tuple, input_norm: float, seed: int, pair: tuple[str, str],
                 kind: str) -> dict[str, float]:
    return sweeps.point(hv.BlockConfig(**dict(cfg_fields)), input_norm, seed, pair, kind)


def sweep_point(cfg: hv.BlockConfig, input_norm: float, seed: int, pair: tuple[str, str],
                kind: str = "spectral") -> dict[str, float]:
    """:func:`hessviz.sweeps.point`, cached per point (a few floats each)."""
    fields = tuple((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init)
    return _sweep_point(fields, float(input_norm), int(seed), tuple(pair), kind)


def clear() -> None:
    """Drop every cached result (the sidebar's "clear caches" button)."""
    term.clear()
    block_norms.clear()
    spectrum.clear()
    verify.clear()
    _sweep_point.clear()
