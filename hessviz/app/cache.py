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

Each function here is a call of the library, stored by :func:`stored`: the decorator writes its
key (the function's name and arguments), reservation, estimate and label once for all of them;
what is computed (and the statistics drawn) is the library's, the reserve and the seconds come
from :mod:`hessviz.checks.cost`. The Real model and Whole model pages' results, stored the same
way, are :mod:`hessviz.app.real_cache`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import inspect
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
from hessviz.app import admission, budget, gates, profiles, progress, runlog
from hessviz.app.progress import current
from hessviz.app.sizes import nbytes, readonly
from hessviz.app.state import View
from hessviz.checks import cost
from hessviz.checks.verify import compare
from hessviz.experiments import bounds as bounds_exp
from hessviz.experiments import heterogeneity, ln_collapse, optimizers
from hessviz.laws import sweeps
from hessviz.matfree import estimates, spectra
from hessviz.pretrained import explore

LIMITS = profiles.limits_from_env(address=profiles.served_address())
"""The limits of this server (``HESSVIZ_PROFILE``, else by the address it serves), read once when the
app starts."""
if LIMITS.profile == "hosted":
    gates.tune_allocator()
LEDGER = gates.Ledger(LIMITS.results_bytes, LIMITS.process_bytes)
GATE = gates.Gate(LIMITS.heavy)
_AUTOGRAD = threading.Lock()
"""torch.func's forward-mode state is per process, not per thread: one autograd reference at a time."""


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
                        value = readonly(compute())
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


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A read-only view of a cached array as a tensor, without a copy (the callers only read it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return torch.from_numpy(a)


# ----------------------------------------------------------------------------- the store wrapper, once

_COERCE = {"int": int, "float": float, "bool": bool}
"""Arguments so annotated enter a key as that type: ``3`` and ``np.int64(3)`` name one result."""


def stored(
    price: int | Callable[..., object],
    what: str | Callable[..., str],
    *,
    kind: str | None = None,
    key: Callable[..., tuple] | None = None,
    first: Callable[..., object] | None = None,
    prefix: tuple = (),
    field: str | None = None,
) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """A function of the app whose result lives in :data:`STORE`: the decorated function is the
    computation, and this decorator writes, once for all of them, its key, reservation, estimate and
    label, and the :meth:`Store.get` that computes or finds it.

    The call's arguments ``a`` (bound to the signature, defaults filled in, ``int``/``float``/``bool``
    annotations applied) give:

    * the key: ``prefix + (kind, *a.values())`` (``kind`` defaults to the function's name), or
      ``prefix + key(**a)``;
    * the reservation and the estimate: ``price(**a)`` (or ``price`` itself) is a number of bytes
      (no estimate: ``seconds = inf``) or a :class:`hessviz.checks.cost.Cost` (``bytes``, ``seconds``);
    * the label: ``what.format(**a)``, or ``what(**a)``;
    * a value found before the store: ``first(key_without_prefix, **a)`` (a precomputed file), unless None;
    * ``field``: the call returns ``value[field]`` of the stored dict (as the precomputed files hold).

    ``wrapper.key_of(*args, **kwargs)`` is a call's key without ``prefix`` (for ``real_ready``)."""

    def wrap(fn: Callable[..., object]) -> Callable[..., object]:
        signature = inspect.signature(fn)
        words = {
            n: p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
            for n, p in signature.parameters.items()
        }
        coerce = {n: _COERCE[w] for n, w in words.items() if w in _COERCE}
        name = kind or fn.__name__

        def arguments(args: tuple, kwargs: dict) -> dict[str, object]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return {n: coerce[n](v) if n in coerce else v for n, v in bound.arguments.items()}

        def key_from(a: dict[str, object]) -> tuple:
            return key(**a) if key else (name, *a.values())

        def key_of(*args: object, **kwargs: object) -> tuple:
            return key_from(arguments(args, kwargs))

        @functools.wraps(fn)
        def wrapper(*args: object, **kwargs: object) -> object:
            a = arguments(args, kwargs)
            k = key_from(a)
            value = first(k, **a) if first else None
            if value is None:
                p = price(**a) if callable(price) else price
                reserve, seconds = (p, math.inf) if isinstance(p, int) else (p.bytes, p.seconds)
                label = what(**a) if callable(what) else what.format(**a)
                value = STORE.get(prefix + k, functools.partial(fn, **a), reserve, label, seconds)
            return value if field is None else value[field]

        wrapper.key_of = key_of
        return wrapper

    return wrap


# ----------------------------------------------------------------------------- Hessian terms


@stored(
    lambda key, term: cost.term_cost(_view(key).cfg),
    lambda key, term: f"the {term} Hessian (P = {_view(key).num_params:,})",
)
def term(key: tuple, term: str) -> np.ndarray:
    """The dense ``(P, P)`` Hessian term ``full``/``outer``/``functional`` of the view."""
    view = _view(key)
    params, X, Y = view.inputs
    return hv.hessian(view.cfg, params, X, Y).term(term).detach().cpu().numpy()


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


def _largest_block(spans: dict[str, slice]) -> int:
    return max(s.stop - s.start for s in spans.values())


@stored(
    lambda key, term_name, kind: cost.Cost(
        cost.block_norms_cost(_view(key).cfg), 2 * 8 * _largest_block(offsets(key)) ** 2, "block norms"
    ),
    "the block norms",
)
def block_norms(key: tuple, term_name: str, kind: str = "spectral") -> np.ndarray:
    """``(n, n)`` spectral (``"spectral"``) or Frobenius (``"fro"``) norms of every block pair."""
    return spectra.block_norm_matrix(as_tensor(term(key, term_name)), offsets(key), kind)


def _outer_rank(cfg: hv.BlockConfig, term_name: str) -> int | None:
    return cfg.seq_len * cfg.d_model if term_name == "outer" else None


def _spectrum_price(key: tuple, term_name: str, k: int, dense_limit: int) -> cost.Cost:
    cfg = _view(key).cfg
    seconds = cost.eig_cost(cfg.num_params, dense_limit, k, _outer_rank(cfg, term_name))
    return cost.Cost(seconds, 2 * 8 * cfg.num_params**2, "eigenvalues")


@stored(_spectrum_price, "the eigenvalues of the {term_name} term")
def spectrum(key: tuple, term_name: str, k: int = 64, dense_limit: int = spectra.DENSE_LIMIT) -> dict:
    """Eigenvalues of one term: ``values`` (ascending), ``partial``, ``size``, ``method``, negatives.

    The outer term ``JᵀAJ`` has rank at most ``L·d`` (``J`` is ``(L d, P)``), so past the
    dense limit all its eigenvalues come from its range
    (:func:`hessviz.matfree.spectra.low_rank_eigenvalues`).
    """
    rank = _outer_rank(_view(key).cfg, term_name)
    spec = spectra.eigenvalues(as_tensor(term(key, term_name)), k=k, dense_limit=dense_limit, rank=rank)
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


@stored(
    lambda key, nonce: cost.compare_cost(_view(key).cfg, LIMITS.timing_repeats),
    "the comparison with autograd",
)
def verify(key: tuple, nonce: int = 0) -> dict:
    """:func:`hessviz.checks.verify.compare` of the view: per block and term the relative error,
    and the wall time of all three terms per method (best of ``LIMITS.timing_repeats``).
    ``nonce`` only forces a fresh measurement. One comparison at a time in the process
    (torch.func's forward-mode state is per process, not per thread)."""
    view = _view(key)
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


# ----------------------------------------------------------------------------- sweeps


def _sweep_key(
    cfg: hv.BlockConfig, input_norm: float, seed: int, pair: tuple[str, str], kind: str, layer: int
) -> tuple:
    fields = tuple((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init)
    return ("sweep_point", fields, float(input_norm), int(seed), tuple(pair), kind, int(layer))


def _sweep_weights(cfg: hv.BlockConfig, pair: tuple[str, str], layer: int) -> int:
    return max(cfg.param_size(sweeps.in_layer(cfg, n, layer)) for n in pair)


def _sweep_price(cfg: hv.BlockConfig, input_norm: float, seed: int, pair: tuple, kind: str, layer: int):
    weight_count = _sweep_weights(cfg, pair, layer)
    return cost.Cost(cost.sweep_point_cost(cfg, weight_count), 8 * 4 * weight_count**2, "a sweep point")


sweep_point = stored(_sweep_price, "a sweep point", key=_sweep_key)(sweeps.point)
""":func:`hessviz.laws.sweeps.point` ``(cfg, input_norm, seed, pair, kind="spectral", layer=0)`` (of layer
``layer`` in a stack), cached per point (a few floats each)."""


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


def _layer_spans(key: tuple) -> dict[str, slice]:
    """``"layer i" -> slice`` of a stack's layer ``i`` in θ (each layer's weights are contiguous)."""
    cfg = _view(key).cfg
    offs = cfg.offsets()
    spans = {}
    for i in range(cfg.n_layers):
        names = cfg.layer_names(i)
        spans[f"layer {i}"] = slice(offs[names[0]].start, offs[names[-1]].stop)
    return spans


def _layer_norms_price(key: tuple, term_name: str, kind: str) -> cost.Cost:
    largest = _largest_block(_layer_spans(key))
    seconds = _view(key).cfg.n_layers ** 2 * cost.norm_cost(largest, largest)
    return cost.Cost(seconds, 2 * 8 * largest**2, "layer norms")


@stored(_layer_norms_price, "the layer-by-layer block norms")
def layer_norms(key: tuple, term_name: str, kind: str = "spectral") -> np.ndarray:
    """``(N, N)`` norms of the layer-by-layer blocks ``H[θ_i, θ_j]`` of a stack's term (each
    layer's weights are contiguous in θ): how close the stack's Hessian is to block-diagonal."""
    return spectra.block_norm_matrix(as_tensor(term(key, term_name)), _layer_spans(key), kind)


# ----------------------------------------------------------------------------- claim pages


@stored(lambda key: cost.attention_case_cost(_view(key).cfg), "the attention bounds")
def bounds_here(key: tuple) -> dict:
    """:func:`hessviz.experiments.bounds.case_row` for the attention-only block of the view."""
    view = _view(key)
    params, X, Y = view.inputs
    return bounds_exp.case_row(view.cfg, params, X, Y, {"L": view.cfg.seq_len})


@stored(lambda n, seed: cost.Cost(cost.CASE_S * n, 1 << 20, "the random study"), "the random study")
def bounds_study(n: int, seed: int) -> dict:
    """:func:`hessviz.experiments.bounds.attention_bound_study`, progress after each configuration."""
    return bounds_exp.attention_bound_study(n, seed, progress=current().step)


@stored(1 << 20, "the LayerNorm study")
def ln_bounds_study(n: int, seed: int) -> dict:
    """:func:`hessviz.experiments.bounds.ln_bound_study` (tiny matrices: one chunk)."""
    return bounds_exp.ln_bound_study(n, seed)


@stored(1 << 20, "the LayerNorm sweep")
def ln_sweep(sig: tuple, eps: float, m: int, n: int, seeds: tuple) -> dict:
    """:func:`hessviz.experiments.ln_collapse.ln_sweep`, progress after each seed."""
    return ln_collapse.ln_sweep(np.asarray(sig), eps, m=m, n=n, seeds=seeds, progress=current().step)


def _ln_point_cfg(L: int, d: int, dk: int, dff: int, eps: float) -> hv.BlockConfig:
    return hv.BlockConfig(seq_len=L, d_model=d, d_k=dk, d_ff=dff, norm="post", ln_eps=eps)


@stored(
    lambda x, eps, seed, L, d, dk, dff, xnorm, whole: cost.ln_point_cost(
        _ln_point_cfg(L, d, dk, dff, eps), whole
    ),
    "a σ point of the Post-LN sweep",
)
def ln_block_point(
    x: float, eps: float, seed: int, L: int, d: int, dk: int, dff: int, xnorm: float, whole: bool
) -> dict:
    """One point (one σ, one seed) of :func:`hessviz.experiments.ln_collapse.block_sweep`."""
    return ln_collapse.block_sweep(
        [x], eps, (seed,), seq_len=L, d_model=d, d_k=dk, d_ff=dff, input_norm=xnorm, whole=whole
    )


def ln_block_sweep(
    sig: tuple, eps: float, seeds: tuple, L: int, d: int, dk: int, dff: int, xnorm: float, whole: bool
) -> dict:
    """:func:`hessviz.experiments.ln_collapse.block_sweep`, cached point by point (one seed, one σ,
    :func:`ln_block_point`) with progress after each: another seed count or another number of
    decades (σ = 10^(−k/3), so the grids nest) computes only the points it adds. Its arrays are
    ``(len(seeds), len(sig))``."""
    status, total = current(), len(seeds) * len(sig)
    points = []
    for i, seed in enumerate(seeds):
        for j, x in enumerate(sig):
            points.append(ln_block_point(float(x), eps, seed, L, d, dk, dff, xnorm, whole))
            done = i * len(sig) + j + 1
            status.step(done, total, f"Post-LN blocks: {done}/{total}")
    out = {
        k: np.concatenate([p[k] for p in points], axis=1).reshape(len(seeds), len(sig))
        for k in points[0]
        if k != "sigma"
    }
    return {**out, "sigma": np.asarray(sig, dtype=float)}


@stored(
    lambda key, part: cost.term_cost(_view(key).cfg).bytes * 2,
    "the gradient heterogeneity",
    kind="heterogeneity",
)
def heterogeneity_of(key: tuple, part: str) -> dict:
    """:func:`hessviz.experiments.heterogeneity.block_heterogeneity` of the view."""
    view = _view(key)
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


@stored(16 << 20, "the training runs")
def training(L: int, d: int, dk: int, dff: int, seeds: tuple, steps: int, lrs: tuple) -> dict:
    """:func:`hessviz.experiments.optimizers.optimizer_study` with one learning rate per optimizer,
    one (placement, seed) per chunk: ``{placement: {"gini": (seeds,), optimizer: (seeds, steps + 1)}}``."""
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


@stored(1 << 20, "the claims")
def claims_file(path: str, mtime: float) -> list[dict]:
    """The committed ``claims.json`` (keyed by its modification time)."""
    import json

    return json.loads(Path(path).read_text())


@stored(64 << 20, "the quick reproduction")
def claims_quick(nonce: int) -> list[dict]:
    """A quick ``hessviz reproduce`` run in a temporary directory."""
    from hessviz.experiments.report import reproduce

    with tempfile.TemporaryDirectory() as tmp:
        return reproduce(Path(tmp), quick=True)


# ----------------------------------------------------------------------------- matrix-free views

SLQ_GROUP_BYTES = estimates.GROUP_BYTES
"""Lanczos bases held at once by the SLQ density (probes run in groups that fit; one at least)."""


def _result(view: View):
    """``hv.hessian`` of the view without any dense term (products only)."""
    params, X, Y = view.inputs
    return hv.hessian(view.cfg, params, X, Y)


@stored(
    lambda key, term_name, k, probes, steps, seed: (
        cost.matfree_spectrum_cost(_view(key).cfg, k, probes, steps, SLQ_GROUP_BYTES).bytes
    ),
    "the matrix-free spectrum of the {term_name} term",
)
def matfree_spectrum(key: tuple, term_name: str, k: int, probes: int, steps: int, seed: int = 0) -> dict:
    """:func:`hessviz.matfree.estimates.term_spectrum` of one term of the view: Lanczos extremes and
    the SLQ density (probes in groups that fit :data:`SLQ_GROUP_BYTES`) with its per-probe
    summaries. No dense term is formed."""
    return estimates.term_spectrum(
        _result(_view(key)),
        term_name,
        k,
        probes,
        steps,
        seed=seed,
        group_bytes=SLQ_GROUP_BYTES,
        progress=progress.Reporter(0, 1, 1, "Matrix-free spectrum"),
    )


@stored(
    lambda key, term_name, by_head, samples, seed: (
        cost.block_table_cost(_view(key).cfg, samples, by_head).bytes
    ),
    "the heterogeneity table of the {term_name} term",
)
def block_table(key: tuple, term_name: str, by_head: bool = True, samples: int = 30, seed: int = 0) -> dict:
    """:func:`hessviz.matfree.block_table`: per block (every weight, or every head) the top
    eigenvalue and the trace of ``H[b, b]``; exact for blocks up to
    :data:`hessviz.matfree.spectral.EXACT_BLOCK` entries, else Lanczos (the eigenvalue within
    ``1e-6`` relative by its error bound) and Hutch++ (``samples`` products)."""
    from hessviz import matfree

    view = _view(key)
    blocks = estimates.block_list(view.cfg, by_head)
    t = matfree.block_table(
        _result(view),
        term_name,
        [b for b, _ in blocks],
        trace_samples=samples,
        exact_limit=matfree.spectral.EXACT_BLOCK,
        seed=seed,
        bound="value",
        progress=progress.Reporter(0, 1, len(blocks), f"{term_name} blocks"),
    )
    return explore.table_arrays(t)
