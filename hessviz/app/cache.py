"""Every cache of the app, in one place: one server-wide store bounded by bytes.

Pages call the functions below with hashable arguments (``view.key`` rather than
tensors, so the cache key is the URL state). Results are CPU numpy arrays (or dicts of
them) marked read-only; pages must not modify them.

The store (:data:`STORE`) is shared by every session and bounded by **bytes**, together
with the results being computed, by the server-wide :class:`hessviz.app.gates.Ledger`
(:data:`LEDGER`): a new result first evicts the least recently used ones. At most
:attr:`~hessviz.app.profiles.Limits.heavy` computations run at once (:data:`GATE`); other
visitors see their place in the queue. Two visitors asking for the same result share
one computation. Long computations run in chunks and call
:func:`hessviz.app.progress.current` between them, so they stop when the visitor leaves
or moves a control. :func:`clear` empties everything (the sidebar's button).

Each function here is a key, a call of the library and a store: what is computed (and the
statistics drawn) is the library's; the reserve and the seconds come from :mod:`hessviz.checks.cost`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import math
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import hessviz as hv
from hessviz.app import admission, budget, gates, profiles, runlog, whole_model
from hessviz.app.progress import current
from hessviz.app.state import View, device
from hessviz.checks import cost
from hessviz.checks.verify import compare
from hessviz.experiments import bounds as bounds_exp
from hessviz.experiments import heterogeneity, ln_collapse, optimizers
from hessviz.laws import sweeps
from hessviz.losses import mean_pooled, names
from hessviz.matfree import estimates, spectra
from hessviz.pretrained import explore, precomputed

LIMITS = profiles.limits_from_env(address=profiles.served_address())
"""The limits of this server (``HESSVIZ_PROFILE``, else by the address it serves), read once when the
app starts."""
if LIMITS.profile == "hosted":
    gates.tune_allocator()
LEDGER = gates.Ledger(LIMITS.results_bytes, LIMITS.process_bytes)
GATE = gates.Gate(LIMITS.heavy)
_AUTOGRAD = threading.Lock()
"""torch.func's forward-mode state is per process, not per thread: one autograd reference at a time."""


def nbytes(value: object) -> int:
    """Bytes held by a result (arrays counted by their buffers; small objects ~64 bytes)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes) + 112
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size()) + 112
    if isinstance(value, dict):
        return 64 + sum(nbytes(k) + nbytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 64 + sum(nbytes(v) for v in value)
    if isinstance(value, str | bytes):
        return 49 + len(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return 64 + sum(nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    if hasattr(value, "to_plotly_json"):  # a plotly figure: its data and layout as dicts and lists
        return 64 + nbytes(value.to_plotly_json())
    return 64


def _readonly(value):
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, dict):
        for v in value.values():
            _readonly(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _readonly(v)
    return value


class Store:
    """A least-recently-used map bounded by the bytes of the :class:`~hessviz.app.gates.Ledger`.

    ``work_limit``: CPU seconds one script run's computations may use before the next one stops
    it (:meth:`hessviz.app.progress.Status.charge`). Only computations given a cost estimate
    (``seconds`` of :meth:`get`: the budget priced them) are charged, a computation inside another
    (a spectrum's term) once, with the outer one; waiting for another visitor's costs nothing."""

    def __init__(self, ledger: gates.Ledger, work_limit: float = math.inf, profile: str = ""):
        self.ledger = ledger
        self.work_limit, self.profile = work_limit, profile
        self._depth = threading.local()
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[tuple, tuple[object, int]] = collections.OrderedDict()
        self._computing: dict[tuple, threading.Event] = {}
        ledger.evict = self.evict

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: tuple) -> bool:
        return key in self._items

    @property
    def bytes(self) -> int:
        return self.ledger.cached

    def evict(self, need: int) -> int:
        """Free at least ``need`` bytes of cached results, least recently used first; results under
        1 % of ``need`` (a sweep point, a spectrum's summary: cheap to keep, slow to redo) go only
        when dropping the large ones was not enough.

        The garbage collector runs here, before the heap is trimmed: Streamlit's collection after
        every script run is off (``runner.postScriptGC`` in ``.streamlit/config.toml``), so a page
        run's namespace (a reference cycle that may still hold an evicted array) waits for the
        next collection; this is when its memory is wanted."""
        freed = 0
        with self._lock:
            for floor in (need / 100, 0):
                for key in [k for k, (_, size) in self._items.items() if size >= floor]:
                    if freed >= need:
                        break
                    freed += self._items.pop(key)[1]
        self.ledger.add_cached(-freed)
        gc.collect()
        gates.trim_memory()
        return freed

    def peek(self, key: tuple) -> object | None:
        """The cached value of ``key`` (marked as just used), or None; never computes or waits."""
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key][0]

    def items(self) -> list[tuple[tuple, object]]:
        """``(key, value)`` of every cached result, least recently used first."""
        with self._lock:
            return [(k, v) for k, (v, _) in self._items.items()]

    def clear(self) -> None:
        with self._lock:
            freed = sum(size for _, size in self._items.values())
            self._items.clear()
        self.ledger.add_cached(-freed)

    def get(
        self, key: tuple, compute: Callable[[], object], reserve: int, what: str, seconds: float = math.inf
    ) -> object:
        """The cached value of ``key``, or ``compute()`` it holding ``reserve`` bytes and, when its
        estimated work ``seconds`` (core-seconds) is not under :data:`hessviz.app.budget.LIGHT_SECONDS`,
        a heavy slot of :data:`GATE`.

        A slot first, then memory (:mod:`hessviz.app.gates`), and only then is the computation
        registered as this thread's, so that visitors who ask for the same result wait for one that
        is computing, never for one that is itself waiting. A computation nested in this one that
        would have to wait raises :class:`~hessviz.app.gates.Retry`; the outermost one (the one
        that holds no memory before it) gives its slot and memory back and starts again, with a
        slot if one was asked for and with the memory of everything nested in it at once."""
        status = current()
        heavy, total = seconds >= budget.LIGHT_SECONDS, int(reserve)
        while True:
            hit = self._shared(key, status)
            if hit is not _MISSING:
                return hit
            outermost = not self.ledger.holding()
            try:
                value = self._compute(key, compute, reserve, what, seconds, heavy, total, status)
            except gates.Retry as retry:
                if not outermost:
                    raise
                heavy, total = heavy or retry.slot, max(total, retry.nbytes)
                continue
            if value is not _MISSING:
                return value

    def _shared(self, key: tuple, status) -> object:
        """The cached value of ``key``, after waiting for another visitor who computes it; or
        ``_MISSING`` when nobody does."""
        while True:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
                    return self._items[key][0]
                event = self._computing.get(key)
            if event is None:
                return _MISSING
            while not event.wait(0.25):  # another visitor computes it: wait, or give up if we leave
                status.waiting(0)

    def _compute(
        self,
        key: tuple,
        compute: Callable[[], object],
        reserve: int,
        what: str,
        seconds: float,
        heavy: bool,
        total: int,
        status,
    ) -> object:
        """Compute ``key`` under a slot (``heavy``) and a reservation of ``reserve`` bytes (``total``
        with what nests in it), store it and return it; ``_MISSING`` when another visitor started
        it while this one waited for its slot or memory (the caller then waits for theirs)."""
        try:
            slot = status.hold(GATE) if heavy else contextlib.nullcontext()
            with slot, self.ledger.reserve(reserve, what, status.waiting, total=total):
                with self._lock:
                    if key in self._items or key in self._computing:
                        return _MISSING
                    self._computing[key] = threading.Event()
                try:
                    status.checkpoint()
                    start, t0, cpu0 = time.time(), time.perf_counter(), time.thread_time()
                    depth = getattr(self._depth, "n", 0)
                    self._depth.n = depth + 1
                    if depth == 0 and math.isfinite(seconds):
                        status.begin(self.work_limit, self.profile)  # the guard counts from here
                    try:
                        value = _readonly(compute())
                    finally:
                        self._depth.n = depth
                        if depth == 0 and math.isfinite(seconds):
                            status.charge(time.thread_time() - cpu0, self.work_limit, self.profile)
                    runlog.computed(key, start, time.perf_counter() - t0, heavy)
                    size = nbytes(value)
                    with self._lock:
                        self._items[key] = (value, size)
                    self.ledger.add_cached(size)
                finally:
                    with self._lock:
                        self._computing.pop(key).set()
            if self.ledger.cached + self.ledger.in_flight > self.ledger.capacity:
                self.evict(self.ledger.cached + self.ledger.in_flight - self.ledger.capacity)
            if self.ledger.in_flight == 0 and self.ledger.process_over() > 0:  # measured, over the ceiling
                self.evict(self.ledger.process_over())
            return value
        finally:
            gates.trim_memory()  # the computation's temporaries go back to the system


_MISSING = object()
"""Not in the store (:meth:`Store._shared`), or started by another visitor (:meth:`Store._compute`)."""


STORE = Store(LEDGER, budget.WORK_FACTOR * LIMITS.max_seconds, LIMITS.profile)
DOOR = admission.Door(LIMITS.runs, LIMITS.process_bytes, make_room=STORE.evict)
"""Script runs admitted at once, each charged its figures and its session's state against the
process ceiling (:mod:`hessviz.app.admission`; :func:`hessviz.app.main.main` asks it first)."""


def clear() -> None:
    """Drop every cached result (the sidebar's "clear caches" button)."""
    STORE.clear()


def _view(key: tuple) -> View:
    return View.from_values(dict(key))


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A read-only view of a cached array as a tensor, without a copy (the callers only read it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return torch.from_numpy(a)


# ----------------------------------------------------------------------------- Hessian terms


def term(key: tuple, term: str) -> np.ndarray:
    """The dense ``(P, P)`` Hessian term ``full``/``outer``/``functional`` of the view."""
    view = _view(key)

    def compute() -> np.ndarray:
        params, X, Y = view.inputs
        return hv.hessian(view.cfg, params, X, Y).term(term).detach().cpu().numpy()

    c = cost.term_cost(view.cfg)
    return STORE.get(
        ("term", key, term), compute, c.bytes, f"the {term} Hessian (P = {view.num_params:,})", c.seconds
    )


def view(key: tuple, build: Callable[[], object]) -> object:
    """A page's whole result for one view: its curves, fits and figures, ``build()`` from cached
    results, made once for every visitor of the view ``key`` (the page's name first, then
    everything the result depends on). A later visitor gets it from :func:`cached_view`.

    Thirty students on one lesson link run the same page on the same view: laying out a plotly
    figure (validating every trace and property) was most of a cached run's CPU on the Scaling page
    (``benchmarks/APP.md``), and so, once the figures were shared, were looking up its 99 sweep
    points and fitting its slopes again, paid thirty times over under one GIL. The result is
    shared between sessions: callers must not modify it (``hva.chart`` only reads a figure laid
    out in the app's theme, :func:`hessviz.plots.drawn_in`)."""
    return STORE.get(view_key(key), build, 1 << 20, "a view", seconds=0.0)


def view_key(key: tuple) -> tuple:
    """The store's own key of the view ``key`` of :func:`view`."""
    return ("view", *key)


def cached_view(key: tuple) -> object | None:
    """The result :func:`view` stored under ``key``, or None (nothing is computed)."""
    return STORE.peek(view_key(key))


def offsets(key: tuple) -> dict[str, slice]:
    """``name -> slice`` of each weight in θ."""
    return _view(key).cfg.offsets()


def block_norms(key: tuple, term_name: str, kind: str = "spectral") -> np.ndarray:
    """``(n, n)`` spectral (``"spectral"``) or Frobenius (``"fro"``) norms of every block pair."""
    largest = max(s.stop - s.start for s in offsets(key).values())

    def compute() -> np.ndarray:
        return spectra.block_norm_matrix(_tensor(term(key, term_name)), offsets(key), kind)

    return STORE.get(
        ("block_norms", key, term_name, kind),
        compute,
        2 * 8 * largest**2,
        "the block norms",
        cost.block_norms_cost(_view(key).cfg),
    )


def spectrum(key: tuple, term_name: str, k: int = 64, dense_limit: int = spectra.DENSE_LIMIT) -> dict:
    """Eigenvalues of one term: ``values`` (ascending), ``partial``, ``size``, ``method``, negatives.

    The outer term ``JᵀAJ`` has rank at most ``L·d`` (``J`` is ``(L d, P)``), so past the
    dense limit all its eigenvalues come from its range
    (:func:`hessviz.matfree.spectra.low_rank_eigenvalues`).
    """
    cfg = _view(key).cfg
    rank = cfg.seq_len * cfg.d_model if term_name == "outer" else None

    def compute() -> dict:
        H = term(key, term_name)
        spec = spectra.eigenvalues(_tensor(H), k=k, dense_limit=dense_limit, rank=rank)
        neg = spectra.negative_summary(spec)
        return {
            "values": spec.values,
            "partial": spec.partial,
            "size": spec.size,
            "method": spec.method,
            "negative_count": neg.count,
            "negative_share": neg.share,
            "negative_mass": neg.mass,
            "min": neg.min_eigenvalue,
            "max": neg.max_eigenvalue,
            "tolerance": neg.tolerance,
        }

    return STORE.get(
        ("spectrum", key, term_name, k, dense_limit),
        compute,
        2 * 8 * cfg.num_params**2,
        f"the eigenvalues of the {term_name} term",
        cost.eig_cost(cfg.num_params, dense_limit, k, rank),
    )


def verify(key: tuple, nonce: int = 0) -> dict:
    """:func:`hessviz.checks.verify.compare` of the view: per block and term the relative error,
    and the wall time of all three terms per method (best of ``LIMITS.timing_repeats``).
    ``nonce`` only forces a fresh measurement. One comparison at a time in the process
    (torch.func's forward-mode state is per process, not per thread)."""
    view = _view(key)

    def compute() -> dict:
        params, X, Y = view.inputs
        with _AUTOGRAD:
            out = compare(view.cfg, params, X, Y, repeats=LIMITS.timing_repeats)
        return {
            "names": out.names,
            "rel_err": out.block_errors,
            "times": out.seconds,
            "whole": out.whole_errors,
            "worst": out.worst_block,
            "agrees": out.agrees,
            "speedup": out.speedup,
        }

    c = cost.compare_cost(view.cfg, LIMITS.timing_repeats)
    return STORE.get(("verify", key, nonce), compute, c.bytes, "the comparison with autograd", c.seconds)


# ----------------------------------------------------------------------------- sweeps


def _sweep_key(
    cfg: hv.BlockConfig, input_norm: float, seed: int, pair: tuple[str, str], kind: str, layer: int
) -> tuple:
    fields = tuple((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init)
    return ("sweep_point", fields, float(input_norm), int(seed), tuple(pair), kind, int(layer))


def sweep_point(
    cfg: hv.BlockConfig,
    input_norm: float,
    seed: int,
    pair: tuple[str, str],
    kind: str = "spectral",
    layer: int = 0,
) -> dict[str, float]:
    """:func:`hessviz.laws.sweeps.point` (of layer ``layer`` in a stack), cached per point (a few
    floats each)."""
    weight_count = max(cfg.param_size(sweeps.in_layer(cfg, n, layer)) for n in pair)
    return STORE.get(
        _sweep_key(cfg, input_norm, seed, pair, kind, layer),
        lambda: sweeps.point(cfg, float(input_norm), int(seed), tuple(pair), kind, layer),
        8 * 4 * weight_count * weight_count,
        "a sweep point",
        cost.sweep_point_cost(cfg, weight_count),
    )


def prime_sweep_points(calls: list[tuple], executor) -> int:
    """Compute the points ``(cfg, input_norm, seed, pair, kind, layer)`` of ``calls`` that the store
    does not hold yet as tasks on ``executor`` (a process pool: ``hessviz lesson`` on several cores),
    and store them where :func:`sweep_point` finds them. Returns how many were computed."""
    from hessviz.runtime.tasks import run_tasks

    missing = {}
    for c in calls:
        key = _sweep_key(*c)
        if key not in STORE:
            missing.setdefault(key, (c[0], float(c[1]), int(c[2]), tuple(c[3]), c[4], int(c[5])))
    if not missing:
        return 0
    results = run_tasks(executor, sweeps.point, list(missing.values()))
    for key, value in zip(missing, results):
        STORE.get(key, lambda value=value: value, 1 << 10, "a sweep point", seconds=0.0)
    return len(missing)


def layer_norms(key: tuple, term_name: str, kind: str = "spectral") -> np.ndarray:
    """``(N, N)`` norms of the layer-by-layer blocks ``H[θ_i, θ_j]`` of a stack's term (each
    layer's weights are contiguous in θ): how close the stack's Hessian is to block-diagonal."""
    cfg = _view(key).cfg
    offs = cfg.offsets()
    spans = {}
    for i in range(cfg.n_layers):
        names = cfg.layer_names(i)
        spans[f"layer {i}"] = slice(offs[names[0]].start, offs[names[-1]].stop)
    largest = max(s.stop - s.start for s in spans.values())

    def compute() -> np.ndarray:
        return spectra.block_norm_matrix(_tensor(term(key, term_name)), spans, kind)

    return STORE.get(
        ("layer_norms", key, term_name, kind),
        compute,
        2 * 8 * largest**2,
        "the layer-by-layer block norms",
        cfg.n_layers**2 * cost.norm_cost(largest, largest),
    )


# ----------------------------------------------------------------------------- claim pages


def bounds_here(key: tuple) -> dict:
    """:func:`hessviz.experiments.bounds.case_row` for the attention-only block of the view."""
    view = _view(key)

    def compute() -> dict:
        params, X, Y = view.inputs
        return bounds_exp.case_row(view.cfg, params, X, Y, {"L": view.cfg.seq_len})

    c = cost.attention_case_cost(view.cfg)
    return STORE.get(("bounds_here", key), compute, c.bytes, "the attention bounds", c.seconds)


def bounds_study(n: int, seed: int) -> dict:
    """:func:`hessviz.experiments.bounds.attention_bound_study`, progress after each configuration."""
    return STORE.get(
        ("bounds_study", int(n), int(seed)),
        lambda: bounds_exp.attention_bound_study(n, seed, progress=current().step),
        1 << 20,
        "the random study",
        cost.CASE_S * n,
    )


def ln_bounds_study(n: int, seed: int) -> dict:
    """:func:`hessviz.experiments.bounds.ln_bound_study` (tiny matrices: one chunk)."""
    return STORE.get(
        ("ln_bounds_study", int(n), int(seed)),
        lambda: bounds_exp.ln_bound_study(n, seed),
        1 << 20,
        "the LayerNorm study",
    )


def ln_sweep(sig: tuple, eps: float, m: int, n: int, seeds: tuple) -> dict:
    """:func:`hessviz.experiments.ln_collapse.ln_sweep`, progress after each seed."""
    return STORE.get(
        ("ln_sweep", sig, eps, m, n, seeds),
        lambda: ln_collapse.ln_sweep(np.asarray(sig), eps, m=m, n=n, seeds=seeds, progress=current().step),
        1 << 20,
        "the LayerNorm sweep",
    )


def ln_block_sweep(
    sig: tuple, eps: float, seeds: tuple, L: int, d: int, dk: int, dff: int, xnorm: float, whole: bool
) -> dict:
    """:func:`hessviz.experiments.ln_collapse.block_sweep`, cached point by point (one seed, one σ) with
    progress after each: another seed count or another number of decades (σ = 10^(−k/3), so the
    grids nest) computes only the points it adds. Its arrays are ``(len(seeds), len(sig))``."""
    cfg = hv.BlockConfig(seq_len=L, d_model=d, d_k=dk, d_ff=dff, norm="post", ln_eps=eps)
    each = cost.ln_point_cost(cfg, whole)
    status, total = current(), len(seeds) * len(sig)

    def point(x: float, seed: int) -> dict:
        return ln_collapse.block_sweep(
            [x], eps, (seed,), seq_len=L, d_model=d, d_k=dk, d_ff=dff, input_norm=xnorm, whole=whole
        )

    points = []
    for i, seed in enumerate(seeds):
        for j, x in enumerate(sig):
            points.append(
                STORE.get(
                    ("ln_block_point", float(x), eps, seed, L, d, dk, dff, xnorm, whole),
                    lambda x=float(x), seed=seed: point(x, seed),
                    each.bytes,
                    "a σ point of the Post-LN sweep",
                    each.seconds,
                )
            )
            done = i * len(sig) + j + 1
            status.step(done, total, f"Post-LN blocks: {done}/{total}")
    out = {
        k: np.concatenate([p[k] for p in points], axis=1).reshape(len(seeds), len(sig))
        for k in points[0]
        if k != "sigma"
    }
    return {**out, "sigma": np.asarray(sig, dtype=float)}


def heterogeneity_of(key: tuple, part: str) -> dict:
    """:func:`hessviz.experiments.heterogeneity.block_heterogeneity` of the view."""
    view = _view(key)

    def compute() -> dict:
        params, X, Y = view.inputs
        h = heterogeneity.block_heterogeneity(view.cfg, params, X, Y, part)
        return {
            "names": h.names,
            "grad": h.grad_norms,
            "hess": h.hess_norms,
            "sizes": h.sizes,
            "gini": h.gini,
            "lambda_G": h.lambda_G,
            "lambda_P": h.lambda_P,
            "corr": h.correlation,
        }

    return STORE.get(
        ("heterogeneity", key, part),
        compute,
        cost.term_cost(view.cfg).bytes * 2,
        "the gradient heterogeneity",
    )


def training(L: int, d: int, dk: int, dff: int, seeds: tuple, steps: int, lrs: tuple) -> dict:
    """:func:`hessviz.experiments.optimizers.optimizer_study` with one learning rate per optimizer,
    one (placement, seed) per chunk: ``{placement: {"gini": (seeds,), optimizer: (seeds, steps + 1)}}``."""

    def compute() -> dict:
        grids = {o: (lr,) for o, lr in zip(optimizers.OPTIMIZERS, lrs)}
        study = optimizers.optimizer_study(
            seeds,
            steps,
            grids,
            ("post", "pre"),
            seq_len=L,
            d_model=d,
            d_k=dk,
            d_ff=dff,
            progress=current().step,
        )
        return {
            pl: {"gini": r["gini"], **{o: r["curves"][o][grids[o][0]] for o in optimizers.OPTIMIZERS}}
            for pl, r in study.items()
        }

    return STORE.get(("training", L, d, dk, dff, seeds, steps, lrs), compute, 16 << 20, "the training runs")


def claims_file(path: str, mtime: float) -> list[dict]:
    """The committed ``claims.json`` (keyed by its modification time)."""
    import json

    return STORE.get(
        ("claims_file", path, mtime), lambda: json.loads(Path(path).read_text()), 1 << 20, "the claims"
    )


def claims_quick(nonce: int) -> list[dict]:
    """A quick ``hessviz reproduce`` run in a temporary directory."""
    from hessviz.experiments.report import reproduce

    def compute() -> list[dict]:
        with tempfile.TemporaryDirectory() as tmp:
            return reproduce(Path(tmp), quick=True)

    return STORE.get(("claims_quick", nonce), compute, 64 << 20, "the quick reproduction")


# ----------------------------------------------------------------------------- matrix-free views

SLQ_GROUP_BYTES = estimates.GROUP_BYTES
"""Lanczos bases held at once by the SLQ density (probes run in groups that fit; one at least)."""


class _Reporter:
    """A :mod:`hessviz.matfree` progress callback drawing one stage of a page's progress bar.

    ``progress(done, total, message)`` from the library (``total`` None when unknown: then
    ``expected`` products) becomes :meth:`~hessviz.app.progress.Status.step` of the guarded
    computation, at most five times a second; the step raises when the visitor has left or
    moved a control (Streamlit's rerun), which cancels the library's loop.
    """

    def __init__(self, stage: int, stages: int, expected: int, label: str):
        self.stage, self.stages, self.expected, self.label = stage, stages, max(1, expected), label
        self._last = 0.0

    def __call__(self, done: int, total: int | None, message: str) -> None:
        now = time.monotonic()
        status = current()
        if now - self._last < 0.2:
            status.checkpoint()
            return
        self._last = now
        frac = min(1.0, done / (total or self.expected))
        status.step(int(1000 * (self.stage + frac)), 1000 * self.stages, f"{self.label}: {message}")


def _result(view: View):
    """``hv.hessian`` of the view without any dense term (products only)."""
    params, X, Y = view.inputs
    return hv.hessian(view.cfg, params, X, Y)


def matfree_spectrum(key: tuple, term_name: str, k: int, probes: int, steps: int, seed: int = 0) -> dict:
    """:func:`hessviz.matfree.estimates.term_spectrum` of one term of the view: Lanczos extremes and
    the SLQ density (probes in groups that fit :data:`SLQ_GROUP_BYTES`) with its per-probe
    summaries. No dense term is formed."""
    view = _view(key)

    def compute() -> dict:
        return estimates.term_spectrum(
            _result(view),
            term_name,
            k,
            probes,
            steps,
            seed=seed,
            group_bytes=SLQ_GROUP_BYTES,
            progress=_Reporter(0, 1, 1, "Matrix-free spectrum"),
        )

    c = cost.matfree_spectrum_cost(view.cfg, k, probes, steps, SLQ_GROUP_BYTES)
    return STORE.get(
        ("matfree_spectrum", key, term_name, k, probes, steps, seed),
        compute,
        c.bytes,
        f"the matrix-free spectrum of the {term_name} term",
    )


def block_table(key: tuple, term_name: str, by_head: bool = True, samples: int = 30, seed: int = 0) -> dict:
    """:func:`hessviz.matfree.block_table`: per block (every weight, or every head) the top
    eigenvalue and the trace of ``H[b, b]``; exact for blocks up to
    :data:`hessviz.matfree.spectral.EXACT_BLOCK` entries, else Lanczos (the eigenvalue within
    ``1e-6`` relative by its error bound) and Hutch++ (``samples`` products)."""
    from hessviz import matfree

    view = _view(key)
    blocks = estimates.block_list(view.cfg, by_head)

    def compute() -> dict:
        res = _result(view)
        t = matfree.block_table(
            res,
            term_name,
            [b for b, _ in blocks],
            trace_samples=samples,
            exact_limit=matfree.spectral.EXACT_BLOCK,
            seed=seed,
            bound="value",
            progress=_Reporter(0, 1, len(blocks), f"{term_name} blocks"),
        )
        return explore.table_arrays(t)

    c = cost.block_table_cost(view.cfg, samples, by_head)
    return STORE.get(
        ("block_table", key, term_name, by_head, samples, seed),
        compute,
        c.bytes,
        f"the heterogeneity table of the {term_name} term",
    )


# ----------------------------------------------------------------------------- real models
#
# Each result of the Real model page has a key of plain values that names exactly what it
# depends on (:mod:`hessviz.pretrained.precomputed`): the attention does not depend on the
# loss or the target seed, nothing under a model's own loss depends on the seed (its key holds
# ``None``), and the Hutch++ probes of the block table have their own fixed seed, so a change
# of target seed recomputes only what the target enters. A key found in the precomputed file
# (:data:`PRECOMPUTED`) is read from it without loading the model.

PRECOMPUTED: Path | None = precomputed.FILE
"""The precomputed views the Real model page reads first (None: compute everything)."""
TABLE_SEED = 0
"""Seed of the block table's Lanczos start and Hutch++ probes (not the target's)."""


def target_seed(loss: str, seed: int) -> int | None:
    """The seed a result under ``loss`` depends on: the synthetic target's, or None (a model's own loss)."""
    return int(seed) if loss == SYNTHETIC else None


def _precomputed(key: tuple) -> dict | None:
    return None if PRECOMPUTED is None else precomputed.lookup(key, PRECOMPUTED)


def _real(
    key: tuple, compute: Callable[[], dict], reserve: int, what: str, seconds: float = math.inf
) -> dict:
    """The precomputed entry of ``key``, or the cached (or computed) one (``seconds``: its estimate, for
    the gate and the work bound)."""
    hit = _precomputed(key)
    if hit is not None:
        return hit
    return STORE.get(("real",) + key, compute, reserve, what, seconds)


def head_vocab(model: str, loss: str) -> int:
    """The vocabulary of ``model``'s LM head when ``loss`` is its next-token loss (the head's work enters
    every estimate, :func:`hessviz.checks.cost.head_cost`), else 0."""
    from hessviz import pretrained

    return pretrained.model_info(model).vocab_size if names.kind(loss) == names.NEXT_TOKEN else 0


def stack_bytes(model: str) -> int:
    """Bytes of every layer of ``model`` in float64 (what :func:`real_stack` holds)."""
    from hessviz import pretrained

    info = pretrained.model_info(model)
    return info.n_layers * info.block.num_params * 8


def stack_fits(model: str) -> bool:
    """Are all of ``model``'s layers kept in memory (:func:`real_stack`, within half of this server's
    results)? If not (SmolLM2's 810 MiB on the hosted profile), its layers are read one at a time for
    the hidden states and only the layer drawn is kept (:func:`real_layer`)."""
    return stack_bytes(model) <= LEDGER.capacity // 2


def real_setup_seconds(model: str, text: str) -> float:
    """Estimated seconds to read ``model``'s layers and run ``text`` through them (0 once done)."""
    if ("real_states", model, text) in STORE:
        return 0.0
    from hessviz import pretrained

    info = pretrained.model_info(model)
    return cost.real_setup_seconds(info.n_layers * info.block.num_params)


def real_ready(key: tuple) -> bool:
    """Is the result of ``key`` (:func:`window_key`, :func:`table_key`) precomputed or cached, so that
    drawing it costs no work (a server's budget need not be asked)?"""
    return ("real",) + key in STORE or _precomputed(key) is not None


def real_results() -> dict[tuple, dict]:
    """Every Real model result in the store now, by its key (what ``scripts/precompute_real.py`` saves)."""
    return {k[1:]: v for k, v in STORE.items() if k[0] == "real"}


def real_stack(model: str) -> list:
    """Every layer of the checkpoint ``model`` (:func:`hessviz.pretrained.load_model`, float64, on
    the app's device), read once per server and shared by every visitor and text."""
    from hessviz import pretrained

    def compute() -> list:
        return pretrained.load_model(model, device=device())

    return STORE.get(("real_stack", model), compute, stack_bytes(model), f"the weights of {model}")


def real_layer(model: str, layer: int) -> tuple:
    """``(cfg, params)`` of one layer of ``model``: from :func:`real_stack` where it fits this server,
    else read alone (float64) and kept by itself."""
    from hessviz import pretrained

    if stack_fits(model):
        return real_stack(model)[layer]
    info = pretrained.model_info(model)
    return STORE.get(
        ("real_layer", model, int(layer)),
        lambda: pretrained.load_layer(model, layer, device=device()),
        8 * info.block.num_params,
        f"layer {layer} of {model}",
    )


def real_states(model: str, text: str) -> dict:
    """``{"ids", "tokens", "states"}`` of ``text`` in ``model``: its token ids and strings and every
    hidden state ``X_0 … X_n`` (``(n+1, L, d)`` numpy), from the layers in :func:`real_stack`."""
    from hessviz import pretrained

    def compute() -> dict:
        ids = pretrained.token_ids(model, text)
        layers = real_stack(model) if stack_fits(model) else None  # else read one layer at a time
        states = pretrained.hidden_states(model, ids, layers=layers, device=device())
        return {
            "ids": np.array(ids),
            "tokens": pretrained.token_strings(model, ids),
            "states": torch.stack(states).cpu().numpy(),
        }

    info = pretrained.model_info(model)
    size = (info.n_layers + 1) * len(real_tokens(model, text)) * info.d_model * 8
    if not stack_fits(model):  # read one layer at a time: the layer being read and its forward pass
        size += 8 * info.block.num_params + cost.forward_bytes(real_config(model, text))
    return STORE.get(("real_states", model, text), compute, size, f"the hidden states of the text in {model}")


def real_tokens(model: str, text: str) -> list[str]:
    """The tokens of ``text`` in ``model`` as its tokenizer writes them (no weights read)."""
    from hessviz import pretrained

    return _real(
        ("tokens", model, text),
        lambda: {"tokens": pretrained.token_strings(model, text)},
        1 << 12,
        "the tokens",
    )["tokens"]


def real_config(model: str, text: str) -> hv.BlockConfig:
    """A layer of ``model`` as a block whose ``seq_len`` is the length of ``text`` (no weights read)."""
    from hessviz import pretrained

    return dataclasses.replace(pretrained.model_info(model).block, seq_len=len(real_tokens(model, text)))


SYNTHETIC = names.SYNTHETIC
"""The loss key of the app's synthetic target; ``"cosine:<other sentence>"`` and ``"next_token"``
name a model's own objective (:mod:`hessviz.losses.names`, on the last layer)."""


def real_inputs(
    model: str, layer: int, text: str, seed: int, loss: str = SYNTHETIC, blocks: bool = False
) -> tuple:
    """``(cfg, params, X, Y, custom)`` of layer ``layer`` on ``text``: ``cfg.seq_len`` is the text's
    length, ``X`` the hidden state entering the layer. With ``loss = "synthetic"``, ``Y`` is the app's
    synthetic target (seeded :func:`hessviz.sample_inputs` for the layer's loss, ``mse``:
    ``Y ~ N(0, 1)``) and ``custom`` is None; otherwise ``Y`` is None and ``custom`` the model's own
    objective at the layer's output as a :class:`hessviz.CustomLoss` (the last layer only), its
    curvature as token-wise blocks only with ``blocks`` (where the products to come pay for building
    them, :func:`hessviz.checks.cost.head_blocks`; a gradient builds none), else as its product."""
    from hessviz import pretrained

    cfg, params = real_layer(model, layer)
    states = real_states(model, text)
    X = _tensor(states["states"][layer]).to(device())
    cfg = dataclasses.replace(cfg, seq_len=X.shape[0])
    if not names.own(loss):
        _, Y = hv.sample_inputs(cfg, seed=seed, device=device())
        return cfg, params, X, Y, None
    last = pretrained.model_info(model).n_layers - 1
    if layer != last:
        raise hv.ConfigError(
            f"loss {names.kind(loss)!r} is the model's objective on its last hidden states: "
            f"choose layer {last}"
        )
    Z = _tensor(states["states"][layer + 1]).to(device())
    obj = names.objective(
        loss, lambda other: mean_pooled(_tensor(real_states(model, other)["states"][-1]).to(device()))
    )
    at = obj.at_text(Z, states["ids"].tolist(), real_head(model) if obj.reads_head else None)
    return cfg, params, X, None, at.custom_loss(blocks)


def real_head(model: str):
    """GPT-2's output head of ``model`` (``ln_f`` and the tied embedding), read once."""
    from hessviz import pretrained
    from hessviz.pretrained import objectives

    info = pretrained.model_info(model)
    return STORE.get(
        ("real_head", model),
        lambda: objectives.lm_head(model),
        8 * info.vocab_size * info.d_model,
        f"the output head of {model}",
    )


def real_attention(model: str, layer: int, text: str) -> np.ndarray:
    """``(H, L, L)`` attention weights of every head of the layer on the text (no loss, no seed)."""

    def compute() -> dict:
        cfg, params, X, _, _ = real_inputs(model, layer, text, 0)
        return {"A": explore.attention_pattern(cfg, params, X).cpu().numpy()}

    cfg = real_config(model, text)
    return _real(
        ("attention", model, text, int(layer)),
        compute,
        8 * cfg.n_heads * cfg.seq_len**2,
        "the attention pattern",
    )["A"]


def window_key(
    model: str,
    layer: int,
    text: str,
    seed: int,
    name: str,
    start: int,
    size: int,
    term_name: str = "full",
    loss: str = SYNTHETIC,
) -> tuple:
    """The key of :func:`real_window`'s result."""
    return (
        "window",
        model,
        text,
        int(layer),
        loss,
        target_seed(loss, seed),
        name,
        int(start),
        int(size),
        term_name,
    )


def real_window(
    model: str,
    layer: int,
    text: str,
    seed: int,
    name: str,
    start: int,
    size: int,
    term_name: str = "full",
    loss: str = SYNTHETIC,
) -> np.ndarray:
    """``(size, size)``: the exact Hessian block of entries ``start …`` of the head slice ``name``
    (:func:`hessviz.pretrained.explore.window`, closed-form products)."""

    cfg = real_config(model, text)
    vocab = head_vocab(model, loss)
    blocks = cost.head_blocks(cfg, vocab, size, cost.product_calls(size))

    def compute() -> dict:
        cfg, params, X, Y, custom = real_inputs(model, layer, text, seed, loss, blocks)
        return {
            "B": explore.window(
                cfg,
                params,
                X,
                Y,
                custom,
                name,
                start,
                size,
                term_name,
                progress=_Reporter(0, 1, size, f"{name} block"),
            )
        }

    key = window_key(model, layer, text, seed, name, start, size, term_name, loss)
    c = cost.real_window_cost(cfg, name, size, vocab)
    return _real(key, compute, c.bytes, f"the Hessian block of {name}", c.seconds)["B"]


def table_key(
    model: str,
    layer: int,
    text: str,
    seed: int,
    term_name: str,
    blocks: tuple[str, ...],
    samples: int,
    loss: str = SYNTHETIC,
) -> tuple:
    """The key of :func:`real_block_table`'s result."""
    return (
        "table",
        model,
        text,
        int(layer),
        loss,
        target_seed(loss, seed),
        term_name,
        tuple(blocks),
        int(samples),
    )


def real_block_table(
    model: str,
    layer: int,
    text: str,
    seed: int,
    term_name: str,
    blocks: tuple[str, ...],
    samples: int,
    loss: str = SYNTHETIC,
) -> dict:
    """:func:`hessviz.pretrained.explore.curvature_table` of the real layer: top eigenvalue and
    trace of each diagonal block in ``blocks``, matrix-free (probes from :data:`TABLE_SEED`)."""

    cfg = real_config(model, text)
    sized = [(b, cfg.param_size(cfg.sort_names((b,))[0])) for b in blocks]
    vocab = head_vocab(model, loss)
    c = cost.real_table_cost(cfg, sized, samples, vocab)
    head_blocks = cost.head_blocks(cfg, vocab, c.products, cost.table_calls(sized, samples))

    def compute() -> dict:
        cfg, params, X, Y, custom = real_inputs(model, layer, text, seed, loss, head_blocks)
        return explore.curvature_table(
            cfg,
            params,
            X,
            Y,
            custom,
            list(blocks),
            samples,
            term_name,
            seed=TABLE_SEED,
            progress=_Reporter(0, 1, len(blocks), f"{term_name} blocks"),
        )

    key = table_key(model, layer, text, seed, term_name, blocks, samples, loss)
    return _real(key, compute, c.bytes, f"the heterogeneity table of layer {layer}", c.seconds)


def real_gradients(
    model: str, layer: int, text: str, seed: int, by_head: bool, loss: str = SYNTHETIC
) -> dict:
    """``{"names", "norms", "sizes"}``: ``‖g_b‖_F`` of every block of the real layer (closed form)."""

    def compute() -> dict:
        cfg, params, X, Y, custom = real_inputs(model, layer, text, seed, loss)
        names, norms, sizes = explore.gradient_blocks(cfg, params, X, Y, by_head, custom)
        return {"names": names, "norms": norms, "sizes": sizes}

    key = ("gradients", model, text, int(layer), loss, target_seed(loss, seed), bool(by_head))
    c = cost.real_gradient_cost(real_config(model, text), head_vocab(model, loss))
    return _real(key, compute, c.bytes, f"the gradient norms of layer {layer}", c.seconds)


# ----------------------------------------------------------------------------- whole models

WHOLE_PRECOMPUTED: Path | None = whole_model.FILE
"""The precomputed tables the Whole model page reads first (None: compute everything)."""


def whole_key(model: str, text: str, part: str) -> tuple:
    """The store's key of :func:`whole_table`'s result."""
    return ("whole", whole_model.key(model, text, part))


def whole_ready(model: str, text: str, part: str) -> bool:
    """Is the table precomputed or cached (drawing it costs no work)?"""
    return (
        whole_key(model, text, part) in STORE
        or whole_model.lookup(model, text, part, WHOLE_PRECOMPUTED) is not None
    )


def whole_table(model: str, text: str, part: str, seconds: float = math.inf) -> dict:
    """:func:`hessviz.app.whole_model.table`: the per-tensor table of the whole ``model`` on ``text``
    under its own objective, ``part`` every weight or every head of one weight; the precomputed entry
    when there is one, else computed (``seconds``: its estimate, for the gate and the work bound) with a
    progress bar, and stopped when the visitor leaves or moves a control."""
    hit = whole_model.lookup(model, text, part, WHOLE_PRECOMPUTED)
    if hit is not None:
        return hit
    label = "every weight" if part == whole_model.WEIGHTS else f"every head of {part}"
    return STORE.get(
        whole_key(model, text, part),
        lambda: whole_model.table(
            model, text, part, progress=_Reporter(0, 1, 1, f"Whole-model table, {label}")
        ),
        1 << 24,
        f"the whole-model table of {model}",
        seconds,
    )
