r"""Spectra and traces from products alone: Lanczos eigenpairs, SLQ densities, Hutch++ traces.

Every tool takes a :class:`~hessviz.products.hessian_operator.HessianOperator` (``res.operator(term)``;
``names`` then in its own spelling), or a result (``hv.hessian``'s, ``hv.model_hessian``'s: anything
with ``products``) and a ``term`` (default ``"full"``); a ``seed`` (same seed, same numbers) and a
``progress`` callback ``progress(done, total, message)`` called after each batch of products (``total`` is
``None`` where it is not known in advance). An exception raised by the callback cancels the
computation and propagates.

* :func:`eigenpairs`: the ``k`` largest (``which="top"``), smallest (``"bottom"``) or
  largest-magnitude (``"magnitude"``) eigenpairs by thick-restart Lanczos in torch
  (:func:`hessviz.matfree.lanczos.extremes`; scipy ``eigsh`` for small operators).
* :func:`density`: the spectral density by stochastic Lanczos quadrature (Ubaru, Chen and
  Saad 2017; PyHessian): for each of ``probes`` Rademacher vectors ``v/‖v‖``, ``steps``
  Lanczos steps with full reorthogonalisation give ``T = Y diag(θ) Yᵀ`` (the probes run
  side by side, one ``k``-column product per step, as many as a quarter of the memory
  limit holds: each probe keeps its ``steps × P`` basis); the density is
  ``φ(λ) ≈ (1/probes) Σ_probe Σ_j τ_j δ(λ − θ_j)`` with ``τ_j = (Y_{1j})²``.
* :func:`trace`: Hutchinson (``tr H ≈ (1/m) Σ vᵀHv``, Rademacher ``v``) or Hutch++
  (Meyer et al. 2021: exact on a sketched top subspace, Hutchinson on the rest), with a
  standard error from the sample spread.
* :func:`block_table`: per block (every weight, or every head of a headed weight) the top
  eigenvalue and the trace of the diagonal block ``H[b, b]``; exact (dense ``eigvalsh``
  of ``H[b, b]`` built from ``|b|`` products) for blocks up to ``exact_limit`` entries.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator, eigsh
from torch import Tensor

from hessviz.block.terms import check_term
from hessviz.errors import ConfigError
from hessviz.matfree.lanczos import REORTH, check_bound, extremes, start_vector, tridiagonal
from hessviz.matfree.probes import rademacher
from hessviz.matfree.sketch import hutchpp
from hessviz.products.hessian_operator import HessianOperator, ProductsOperator, head_blocks, scipy_view
from hessviz.products.operator import BATCH
from hessviz.runtime.memory import memory_limit
from hessviz.runtime.tasks import built, run_tasks

Progress = Callable[[int, int | None, str], None]


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _operator(
    res, term: str | None, rows: Sequence[str] | None, cols: Sequence[str] | None
) -> HessianOperator:
    """The operator the tools run on: ``res`` itself when it is a :class:`HessianOperator` (its
    block ``rows × cols`` when given, in its own spelling; ``term`` must be ``None`` or its own), else
    ``term`` (default ``"full"``) of a result's products (names as its ``cfg`` spells them)."""
    if isinstance(res, HessianOperator):
        if term is not None and term != res.term:
            raise ConfigError(
                f"term={term!r} with an operator of term {res.term!r}: an operator carries its "
                "term; take res.operator(term) for another"
            )
        return res if rows is None else res.block(rows, cols)
    term = "full" if term is None else term
    check_term(term)
    mf = getattr(res, "products", None)
    if mf is None:
        raise ConfigError("this result has no matrix-free products; compute it with hv.hessian")
    return mf.engine(
        mf,
        term,
        mf.names if rows is None else tuple(rows),
        mf.names if cols is None else tuple(cols),
        source=res,
    )


class _Products:
    """``(k, n) -> (k, m)`` products of one operator (:func:`_operator`), counted and reported."""

    def __init__(
        self,
        res,
        term: str | None,
        rows: Sequence[str] | None,
        cols: Sequence[str] | None,
        progress: Progress | None,
        total: int | None,
        what: str,
    ):
        self.op = _operator(res, term, rows, cols)
        self.term, self.size, self.like = self.op.term, self.op.shape[0], self.op.like
        self.progress, self.total, self.what = progress, total, what
        self.done = 0

    takes_out = True
    """:func:`~hessviz.matfree.lanczos.apply_into` may hand ``out=`` (a basis row) for the result."""

    def __call__(self, V: Tensor, out: Tensor | None = None) -> Tensor:
        out = self.op.apply(V, out=out)
        self.done += V.shape[0]
        if self.progress is not None:
            self.progress(self.done, self.total, f"{self.what}: {self.done} products")
        return out

    def scipy(self) -> LinearOperator:
        """These counted products as a scipy ``LinearOperator`` (for ``eigsh``)."""
        return scipy_view(self.op.shape, self, self.like)


# ----------------------------------------------------------------------------- eigenpairs


SCIPY_BELOW = 2048
"""``solver="auto"`` hands operators smaller than this to scipy ``eigsh``: on short vectors
ARPACK's own work is negligible and it is the better-tested tool; from here on the torch core
(:func:`hessviz.matfree.lanczos.extremes`) keeps the basis on the products' device."""

SCIPY_WHICH = {"top": "LA", "bottom": "SA", "magnitude": "LM"}


@dataclass(frozen=True)
class Eigenpairs:
    values: np.ndarray
    """``(k,)`` ascending."""
    vectors: np.ndarray | None
    """``(P', k)`` unit eigenvectors (columns), or ``None`` when not asked for."""
    which: str
    term: str
    matvecs: int
    seconds: float
    method: str = "thick-restart Lanczos (torch)"
    residuals: np.ndarray | None = None
    """``(k,)`` true residuals ``‖H u − λ u‖`` in the order of ``values`` (torch core), or ``None``
    (scipy, which reports none)."""
    converged: bool = True


def _check_tol(tol: object) -> float:
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0 or not math.isfinite(tol):
        raise ConfigError(f"tol must be a finite number > 0, got {tol!r}")
    return float(tol)


def eigenpairs(
    res,
    term: str | None = None,
    k: int = 5,
    which: str = "top",
    *,
    names: Sequence[str] | None = None,
    seed: int = 0,
    tol: float = 1e-8,
    vectors: bool = False,
    ncv: int | None = None,
    solver: str = "auto",
    progress: Progress | None = None,
    bound: str = "residual",
    start: Tensor | None = None,
    check: bool = True,
    reorth: str = "auto",
) -> Eigenpairs:
    """The ``k`` largest (``top``), smallest (``bottom``) or largest-magnitude (``magnitude``)
    eigenpairs of ``term`` (of the diagonal block ``names`` when given).

    ``solver="torch"``: thick-restart Lanczos on the products' device and dtype, stopped when
    every wanted ``‖H u − θ u‖ ≤ tol · |θ|`` (:mod:`hessviz.matfree.lanczos`; its docstring says
    how the peers' tolerances differ) or, with ``bound="value"``, when every wanted eigenvalue's
    error bound ``min(‖r‖, ‖r‖² / gap) ≤ tol · |θ|`` (:func:`~hessviz.matfree.lanczos.value_error`:
    the eigenvalues to ``tol`` for fewer products, the vectors less sharp); ``"scipy"``: ARPACK
    ``eigsh`` with the same ``tol`` on the residual, which is the stricter test (float64 vectors on
    the CPU); ``"auto"``: scipy below :data:`SCIPY_BELOW` entries with the residual test, else torch
    (the value bound is the torch core's: ARPACK tests only once its basis is full). ``start (n,)``: a
    guess at the wanted direction to start from (the block's gradient, say), the seeded random
    vector mixed in (:func:`~hessviz.matfree.lanczos.start_vector`). ``check`` (torch): one more
    product for the true residuals (else the recurrence's estimates ``β |y_m|``, which full
    reorthogonalisation keeps equal to them up to round-off; the values are the same either way).
    ``reorth`` (torch): the core's first pass ``"partial"`` (semi-orthogonal, the basis read only
    when Simon's estimates ask, :class:`~hessviz.matfree.lanczos.Orthogonality`), ``"full"`` (every
    step), or ``"auto"``: partial with ``bound="value"`` in float64, else full.
    """
    if which not in SCIPY_WHICH:
        raise ConfigError(f"which must be 'top', 'bottom' or 'magnitude', got {which!r}")
    if solver not in ("auto", "torch", "scipy"):
        raise ConfigError(f"solver must be 'auto', 'torch' or 'scipy', got {solver!r}")
    check_bound(bound)
    tol = _check_tol(tol)
    ops = _Products(res, term, names, names, progress, None, f"{which}-{k} eigenvalues")
    n = ops.size
    _check_count("k", k, 1)
    if k >= n:
        raise ConfigError(f"k must be < the operator size {n} for Lanczos, got {k}; use the dense term")
    began = time.perf_counter()
    if solver == "scipy" or (solver == "auto" and n < SCIPY_BELOW and bound == "residual"):
        v0 = start_vector(start, torch.from_numpy(np.random.default_rng(seed).standard_normal(n))).numpy()
        ncv = min(n, max(2 * k + 1, 20)) if ncv is None else ncv
        out = eigsh(
            ops.scipy(), k=k, which=SCIPY_WHICH[which], v0=v0, tol=tol, ncv=ncv, return_eigenvectors=vectors
        )
        vals, vecs = out if vectors else (out, None)
        order = np.argsort(vals)
        return Eigenpairs(
            np.asarray(vals)[order],
            None if vecs is None else vecs[:, order],
            which,
            ops.term,
            ops.done,
            time.perf_counter() - began,
            "implicitly restarted Lanczos (scipy eigsh)",
        )
    r = extremes(
        ops,
        n,
        k,
        which,
        tol=tol,
        seed=seed,
        like=ops.like,
        ncv=ncv,
        vectors=vectors,
        bound=bound,
        start=start,
        check=check,
        reorth=reorth,
    )
    if not r.converged:
        warnings.warn(
            f"Lanczos stopped after {r.restarts} restarts with residuals up to "
            f"{float(r.residuals.max()):.2g} (tol {tol:g} relative)",
            RuntimeWarning,
            stacklevel=2,
        )
    values = r.values.numpy()
    order = np.argsort(values)
    vecs = None if r.vectors is None else r.vectors.T.to(torch.float64).cpu().numpy()[:, order]
    return Eigenpairs(
        values[order],
        vecs,
        which,
        ops.term,
        ops.done,
        time.perf_counter() - began,
        residuals=r.residuals.numpy()[order],
        converged=r.converged,
    )


def top_eigenvalues(res, term: str | None = None, k: int = 5, **kw) -> np.ndarray:
    """The ``k`` largest eigenvalues, descending (see :func:`eigenpairs`)."""
    return eigenpairs(res, term, k, "top", **kw).values[::-1].copy()


# ----------------------------------------------------------------------------- SLQ


@dataclass(frozen=True)
class Density:
    """SLQ nodes and weights: probe ``i`` puts mass ``weights[i][j]`` at ``nodes[i][j]``."""

    nodes: list[np.ndarray]
    weights: list[np.ndarray]
    size: int
    term: str
    steps: int
    matvecs: int
    seconds: float
    method: str = "stochastic Lanczos quadrature"

    @property
    def all_nodes(self) -> np.ndarray:
        return np.concatenate(self.nodes)

    @property
    def all_weights(self) -> np.ndarray:
        """Weights summing to 1 over all probes."""
        return np.concatenate(self.weights) / len(self.weights)

    @property
    def trace(self) -> float:
        """``P · mean_probe Σ_j τ_j θ_j``: the SLQ trace estimate."""
        return float(self.size * np.sum(self.all_nodes * self.all_weights))

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """Share of eigenvalues ``≤ x``."""
        x = np.asarray(x, dtype=np.float64)
        return (
            (self.all_weights[None, :] * (self.all_nodes[None, :] <= x.reshape(-1, 1)))
            .sum(1)
            .reshape(x.shape)
        )

    def curve(
        self, grid: np.ndarray | None = None, sigma: float | None = None, points: int = 400
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(grid, φ(grid))``: the nodes smoothed by Gaussians of width ``sigma``
        (default 1 % of the spectral range); ``∫ φ = 1``. ``sigma`` given must be > 0."""
        if sigma is not None and not (isinstance(sigma, (int, float)) and sigma > 0 and math.isfinite(sigma)):
            raise ConfigError(f"sigma must be a finite number > 0, got {sigma!r}")
        lo, hi = float(self.all_nodes.min()), float(self.all_nodes.max())
        width = max(hi - lo, 1e-12 * max(abs(lo), abs(hi), 1.0))
        sigma = 0.01 * width if sigma is None else sigma
        if grid is None:
            grid = np.linspace(lo - 5 * sigma, hi + 5 * sigma, points)
        z = (grid[:, None] - self.all_nodes[None, :]) / sigma
        phi = (self.all_weights[None, :] * np.exp(-0.5 * z * z)).sum(1) / (sigma * math.sqrt(2 * math.pi))
        return grid, phi


def density(
    res,
    term: str | None = None,
    probes: int = 10,
    steps: int = 80,
    *,
    names: Sequence[str] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    reorth: str = "partial",
    group: int | None = None,
    executor: cf.Executor | None = None,
) -> Density:
    """The spectral density of ``term`` by SLQ with ``probes`` probes of ``steps`` Lanczos steps.

    The probes run side by side in groups of ``group`` (default: as many as fit in memory, at most
    :data:`BATCH`), one product of as many columns per step.
    ``reorth="partial"`` (default) keeps each probe's basis (``steps · P`` entries) and keeps it
    semi-orthogonal, reading it only when Simon's estimates ask (``"selective"``: the same level,
    the basis read every step), so as many probes go together as memory allows;
    ``"none"`` keeps three vectors per probe (no basis: curvlinops' ``fast_lanczos``, Papyan
    2020), so all probes go in one product of up to :data:`BATCH` columns; ``"full"``
    reorthogonalises against the whole basis (PyHessian's and Ghorbani et al.'s way, one probe
    at a time there). :func:`hessviz.matfree.lanczos.tridiagonal` says what each costs.

    ``executor``: any :class:`concurrent.futures.Executor` (a process pool, a Dask client's
    ``get_executor()``); each group is one task (:func:`hessviz.runtime.tasks.run_tasks`) on the result
    rebuilt from ``res.problem`` (:func:`hessviz.model_hessian`'s results have one; a worker builds
    it once), under this process's torch thread count, so pass a ``group`` that gives every worker
    a share (``group=1``: one probe a task). The probes are this process's draws, so the density is
    the in-process one with the same ``group`` to the bit; another ``group`` changes it in round-off
    only (a GEMM's sums depend on its row count). ``progress`` is called as each group arrives."""
    _check_count("probes", probes, 1)
    _check_count("steps", steps, 1)
    if reorth not in REORTH:
        raise ConfigError(f"reorth must be one of {REORTH}, got {reorth!r}")
    ops = _Products(res, term, names, names, progress, probes * steps, "spectral density (SLQ)")
    source = getattr(ops.op, "source", None)
    if executor is not None and (getattr(source, "problem", None) is None or ops.op.rows != ops.op.cols):
        raise ConfigError(
            "density(executor=...) needs a result a worker can rebuild: hv.model_hessian's "
            f"(it has .problem), or a diagonal block of its operator; got {type(res).__name__}"
        )
    n = ops.size
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    per_step = 1 if reorth == "none" else min(steps, n)  # vectors kept per probe
    probe_bytes = (per_step + 3) * n * ops.like.element_size()
    if group is None:
        group = max(1, min(probes, BATCH, memory_limit(ops.like.device) // (4 * max(1, probe_bytes))))
    _check_count("group", group, 1)
    V = rademacher(n, probes, gen, ops.like)
    if executor is None:
        runs = [
            ab
            for first in range(0, probes, group)
            for ab in tridiagonal(ops, V[first : first + group], steps, reorth=reorth)
        ]
        done = ops.done
    else:
        firsts, length = range(0, probes, group), min(steps, n)

        def arrived(i: int, _: object) -> None:
            if progress is not None:
                progress(
                    min(probes, firsts[i] + group) * length,
                    probes * length,
                    f"spectral density (SLQ): group {i + 1} of {len(firsts)}",
                )

        op = ops.op
        assert isinstance(op, ProductsOperator) and source is not None  # a model's, checked above
        inner = op.resolve(op.rows)  # the names as the worker's products spell them
        calls = [(ops.term, inner, V[f : f + group].cpu(), steps, reorth) for f in firsts]
        runs = [
            ab
            for part in run_tasks(executor, remote_tridiagonal, calls, (source.problem,), arrived)
            for ab in part
        ]
        done = probes * length  # what tridiagonal runs, as ops.done counts
    nodes, weights = [], []
    for alpha, beta in runs:
        T = torch.diag(alpha) + torch.diag(beta, 1) + torch.diag(beta, -1)
        theta, Y = torch.linalg.eigh(T.to(torch.float64).cpu())
        nodes.append(theta.numpy())
        weights.append((Y[0] ** 2).numpy())
    return Density(nodes, weights, n, ops.term, steps, done, time.perf_counter() - start)


def remote_tridiagonal(
    problem, term: str, names: Sequence[str] | None, v0: Tensor, steps: int, reorth: str
) -> list[tuple[Tensor, Tensor]]:
    """:func:`~hessviz.matfree.lanczos.tridiagonal` from the rows of ``v0`` on a worker, on the
    result built from ``problem`` (once per worker and problem); ``α, β`` on the CPU."""
    res = built(problem)
    ops = _Products(res, term, names, names, None, None, "")
    return [(a.cpu(), b.cpu()) for a, b in tridiagonal(ops, v0.to(ops.like), steps, reorth=reorth)]


# ----------------------------------------------------------------------------- traces


@dataclass(frozen=True)
class TraceEstimate:
    value: float
    stderr: float
    """Standard error of the stochastic part (0 when exact)."""
    matvecs: int
    method: str
    term: str


def _quadratic(ops: _Products, V: Tensor) -> Tensor:
    """``vᵢᵀ H vᵢ`` for the rows of ``V (b, n)``: one ``b``-column product, no ``(b, n)`` temporary."""
    return torch.bmm(ops(V)[:, None, :], V[:, :, None]).flatten()


def trace(
    res,
    term: str | None = None,
    samples: int = 30,
    method: str = "hutch++",
    *,
    names: Sequence[str] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> TraceEstimate:
    """``tr`` of ``term`` (or of the diagonal block ``names``) from ``samples`` products.

    ``hutchinson``: ``(1/m) Σ vᵢᵀ H vᵢ``, Rademacher ``vᵢ``, ``stderr = std/√m``.
    ``hutch++``: ``m/3`` products sketch ``Q = orth(H S)``; ``tr(Qᵀ H Q)`` is exact and
    Hutchinson with ``m/3`` probes handles ``(I − QQᵀ) H (I − QQᵀ)``
    (:func:`hessviz.matfree.sketch.hutchpp`: the basis from the sketch's Gram matrix, ``H Q`` and
    the probes' products in one call). When ``samples ≥ P'`` the trace is exact, from ``P'`` unit
    vectors. A rank-deficient sketch (``H`` of rank below ``m/3``, or zero) needs no guard: its
    basis has fewer rows (directions at round-off are left out, and so are their products), with
    ``range(HS) ⊆ range(Q)``, so the sketched part is exact and the rest 0 up to round-off.
    """
    if method not in ("hutchinson", "hutch++"):
        raise ConfigError(f"method must be 'hutchinson' or 'hutch++', got {method!r}")
    _check_count("samples", samples, 3 if method == "hutch++" else 1)
    ops = _Products(res, term, names, names, progress, samples, f"trace ({method})")
    n = ops.size
    if samples >= n:
        eye = torch.eye(n, dtype=ops.like.dtype, device=ops.like.device)
        return TraceEstimate(float(torch.diagonal(ops(eye)).sum()), 0.0, ops.done, "exact", ops.term)
    gen = torch.Generator().manual_seed(seed)
    if method == "hutchinson":  # BATCH probes side by side at a time
        quad = torch.cat(
            [
                _quadratic(ops, rademacher(n, min(BATCH, samples - first), gen, ops.like))
                for first in range(0, samples, BATCH)
            ]
        )
        return TraceEstimate(
            float(quad.mean()),
            float(quad.std() / math.sqrt(samples)) if samples > 1 else float("nan"),
            ops.done,
            method,
            ops.term,
        )
    value, stderr = hutchpp(ops, n, samples, gen, ops.like)
    return TraceEstimate(value, stderr, ops.done, method, ops.term)


# ----------------------------------------------------------------------------- per block


def block_names(res, by_head: bool = True) -> tuple[str, ...]:
    """Every block of ``res`` (a result, or an operator in its own spelling): each weight, or each
    head of a headed weight when ``by_head``."""
    if isinstance(res, HessianOperator):
        return res.block_names(by_head)
    return head_blocks(res.cfg, res.names, by_head)


@dataclass(frozen=True)
class BlockStats:
    name: str
    size: int
    top: float
    """Largest eigenvalue of the diagonal block ``H[b, b]``."""
    trace: float
    trace_stderr: float
    exact: bool
    """True when both numbers come from the dense block (``size ≤ exact_limit``)."""


@dataclass(frozen=True)
class BlockTable:
    rows: list[BlockStats] = field(default_factory=list)
    term: str = "full"
    matvecs: int = 0
    seconds: float = 0.0

    def as_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.rows]


EXACT_BLOCK = 256
"""Blocks up to this many entries get an exact top eigenvalue and trace in :func:`block_table`
(``|b|`` products build the block), larger ones Lanczos and Hutch++."""


def block_table(
    res,
    term: str | None = None,
    blocks: Sequence[str] | None = None,
    *,
    by_head: bool = True,
    trace_samples: int = 30,
    exact_limit: int = EXACT_BLOCK,
    tol: float = 1e-6,
    seed: int = 0,
    progress: Progress | None = None,
    bound: str = "residual",
    starts: Mapping[str, Tensor] | None = None,
    check: bool = True,
) -> BlockTable:
    """Top eigenvalue and trace of every diagonal block ``H[b, b]`` (the heterogeneity table).

    ``blocks`` defaults to :func:`block_names`. Blocks up to ``exact_limit`` entries are
    exact (dense ``eigvalsh``); larger ones use :func:`eigenpairs` (``k = 1``, ``tol`` and
    ``bound`` and ``check`` as there, from ``starts[b]`` where given) and :func:`trace` (Hutch++,
    ``trace_samples`` products).
    """
    whole = _operator(res, term, None, None)
    blocks = block_names(whole, by_head) if blocks is None else tuple(blocks)
    start = time.perf_counter()
    rows: list[BlockStats] = []
    done = 0

    def step(d: int, total: int | None, message: str) -> None:
        if progress is not None:
            progress(len(rows), len(blocks), f"block {len(rows) + 1}/{len(blocks)}: {message}")

    for b in blocks:
        ops = _Products(res, term, (b,), (b,), step, None, b)
        n = ops.size
        if n <= exact_limit:
            eye = torch.eye(n, dtype=ops.like.dtype, device=ops.like.device)
            Hb = ops(eye).to(torch.float64).cpu()
            vals = torch.linalg.eigvalsh(0.5 * (Hb + Hb.T))
            rows.append(BlockStats(b, n, float(vals[-1]), float(vals.sum()), 0.0, True))
            done += ops.done
            continue
        top = eigenpairs(
            res,
            term,
            1,
            "top",
            names=(b,),
            seed=seed,
            tol=tol,
            progress=step,
            bound=bound,
            start=None if starts is None else starts.get(b),
            check=check,
        )
        tr = trace(res, term, trace_samples, "hutch++", names=(b,), seed=seed, progress=step)
        rows.append(BlockStats(b, n, float(top.values[-1]), tr.value, tr.stderr, False))
        done += top.matvecs + tr.matvecs
    if progress is not None:
        progress(len(blocks), len(blocks), "done")
    return BlockTable(rows, whole.term, done, time.perf_counter() - start)
