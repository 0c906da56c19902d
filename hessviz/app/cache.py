"""Cached computations for the pages: bounded Streamlit caches over hessviz.

Every function takes ``view.key`` (hashable) rather than tensors, so the cache key is
the URL state. Results are CPU numpy arrays marked read-only; pages must not modify
them. Bounds (``max_entries``) keep memory flat however long the app runs: at the
default view (P = 1536) one term is 19 MiB.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import streamlit as st

import hessviz as hv
from hessviz import spectra, sweeps
from hessviz.app.state import View


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
    names = _view(key).cfg.param_names
    off = offsets(key)
    out = np.zeros((len(names), len(names)))
    for i, a in enumerate(names):
        for j in range(i, len(names)):
            b = names[j]
            out[i, j] = out[j, i] = _norm(H[off[a], off[b]], kind, symmetric=i == j)
    return out


def _norm(B, kind: str, symmetric: bool) -> float:
    """``‖B‖₂`` from the smaller Gram matrix (or ``max |λ|`` of a symmetric diagonal block),
    about twice as fast as an SVD and as accurate for the largest singular value; ``fro`` as usual."""
    import torch

    if kind != "spectral" or B.numel() == 0:
        return spectra.matrix_norm(B, kind)
    if symmetric:
        return float(torch.linalg.eigvalsh(0.5 * (B + B.T)).abs().max())
    G = B.T @ B if B.shape[1] <= B.shape[0] else B @ B.T
    return float(torch.linalg.eigvalsh(G)[-1].clamp_min(0).sqrt())


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
    """Closed form against autograd: per block and term the relative error, and both timings.

    ``rel_err[term]`` is ``(n, n)``: ``‖H_cf − H_ag‖_F / max(‖H_ag‖_F, tiny)`` per block pair.
    ``times[method]`` is the wall time (s) of all three terms, best of ``repeats``.
    ``nonce`` only forces a fresh measurement.
    """
    view = _view(key)
    params, X, Y = view.inputs
    names = view.cfg.param_names
    off = view.cfg.offsets()
    terms = ("full", "outer", "functional")
    results, times = {}, {}
    for method in ("closed_form", "autograd"):
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            res = hv.hessian(view.cfg, params, X, Y, method=method)
            mats = {t: res.term(t) for t in terms}
            if X.device.type == "cuda":
                import torch

                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        results[method], times[method] = mats, best
    rel = {}
    for t in terms:
        cf, ag = results["closed_form"][t], results["autograd"][t]
        err = np.zeros((len(names), len(names)))
        for i, a in enumerate(names):
            for j, b in enumerate(names):
                diff = float((cf[off[a], off[b]] - ag[off[a], off[b]]).norm())
                ref = float(ag[off[a], off[b]].norm())
                err[i, j] = diff / ref if ref > 0 else diff
        rel[t] = err
    return {"names": names, "rel_err": rel, "times": times}


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
