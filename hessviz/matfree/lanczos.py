r"""One Lanczos core in torch, on the device and dtype of the products.

``apply(V (b, n)) -> (b, n)`` is the symmetric operator ``H`` applied to ``b`` rows at once (a
:class:`~hessviz.matfree.spectral._Products`, or ``lambda V: V @ A`` in the tests); it returns
a new tensor, or, marked ``takes_out``, writes into the basis row it is given (:func:`apply_into`),
which the core then works on in place. Two entry points share the step below:

* :func:`extremes`: the ``k`` extreme eigenpairs by **thick-restart Lanczos** (Wu and Simon
  2000). A basis ``Q (m + 1, n)`` of orthonormal rows is grown one product at a time; each new
  ``w = H q_j`` is orthogonalised against *all* of ``Q`` (classical Gram–Schmidt, a second pass
  only when the DGKS test asks for one), and the coefficients ``h = Q w`` are the ``j``-th column
  of the projected ``T = Q H Qᵀ`` — so ``T`` is exact after a restart too, with no arrowhead
  bookkeeping. After ``m`` steps the Ritz pairs ``(θ_i, u_i = Qᵀ y_i)`` of ``T`` have residuals

  .. math::
      \|H u_i - θ_i u_i\| = β_m |y_{m,i}| \qquad (H Q_mᵀ = Q_mᵀ T_m + β_m q_{m+1} e_mᵀ),

  and the run **stops when** ``β_m |y_{m,i}| ≤ tol · |θ_i|`` for every wanted pair (``|θ_i|``
  floored at ``ε^{2/3} · max|θ|`` as ARPACK floors it at ``ε^{2/3}``, so a zero eigenvalue can
  converge). The test runs after **every** step ``j > k`` on the leading ``j × j`` of ``T`` (an
  eigendecomposition of at most ``m × m``, microseconds), not only when the basis is full as
  ARPACK does: a run stops at the first product after which its pairs pass, rather than at the
  next multiple of the basis size (``k = 1`` at ``tol = 1e-3`` on MiniLM's 22-tensor table: 13.9
  products a block on average, where the full first pass alone is ``m = 20``). Otherwise, once
  the basis is full, it restarts on the ``ℓ = k + (m − k) // 2`` best Ritz vectors and
  ``q_{m+1}``: ``Q[:ℓ] ← Yᵀ Q`` (:func:`combine_`), ``T[:ℓ, :ℓ] = diag(θ)``. ``which`` is
  ``"top"`` (largest algebraic, ARPACK's ``LA``),
  ``"bottom"`` (``SA``) or ``"magnitude"`` (``LM``): ``full`` is indefinite, so both ends matter,
  and ``"magnitude"`` waits until the Ritz values at both ends pass (:func:`passed`).
  With ``bound="value"`` the test is on each eigenvalue's error bound instead,
  ``min(r, r² / δ) ≤ tol · |θ|`` (:func:`value_error`, ``δ`` the Ritz gap): when only the
  eigenvalues are wanted, to ``tol``, this stops far sooner (MiniLM's 22-tensor table at
  ``tol = 1e-3``: 5.9 products a tensor against 14.9). A ``start`` vector (a block's gradient)
  replaces the random one, the seeded random vector mixed in at :data:`START_MIX`.
  With ``check=True`` the returned vectors are multiplied by ``H`` once more (``k`` columns in
  one product): the values returned are their Rayleigh quotients ``uᵀHu`` and the residuals the
  **true** ``‖Hu − θu‖``; the estimate is never the only word. Each step subtracts the
  three-term part ``α q_j + β q_{j−1}`` first and then reorthogonalises against the whole basis,
  so the Gram–Schmidt pass cancels little and the DGKS second pass is rare (two reads of the
  basis per step, not four). That is ``reorth="full"``, the default for the residual test. With
  ``bound="value"`` (in float64) the first pass is ``"partial"`` instead: the plain three-term step,
  the basis read only when Simon's estimates of its drift ask (:class:`Orthogonality`), and a longer
  pass for it (:func:`default_ncv`), since a step no longer reads the whole basis. MiniLM's layer 3,
  top-5 to ``1e-8``: 54 products (49 without the check product) and 12 basis passes, against 63
  products and two passes a step with restarts. A pass (:func:`partial_pass_`) reads the basis once
  to measure ``h = Q w`` and subtracts only the coefficients above the round-off level, by runs of
  adjacent rows. The Ritz values stay exact to ``O(ε ‖H‖)``; the Ritz vectors' true residuals stop
  near ``√ε ‖H‖`` (:func:`_reorth`), which is why the residual test keeps full reorthogonalisation.

  **Breakdown is an answer.** When ``β_j ≤ ε₁ ‖T‖`` (``ε₁ = ε √n``, Simon's round-off term; ``‖T‖``
  from the running column sums, so the test is the same at any scale of ``H``: ``β = 0`` on a
  multiple of the identity, after ``r + 1`` steps on a rank-``r`` block, at once from a start in an
  eigenspace), or when every Ritz pair of the active space passes the stopping test, that space is
  invariant (to round-off, or to ``tol``) and its eigenpairs are answers: they are **locked**
  (:func:`_lock_`: the rows turned into the eigenvectors, ``T``'s block ``diag(θ)``). The run stops
  when the locked values hold the ``k`` wanted and the space locked last offers nothing better than
  the ``k``-th (:func:`_answered`: a random start's Krylov space holds every distinct eigenvalue of its
  complement once, so only copies can remain) or when the locked rows fill the space; otherwise it
  goes on from a fresh vector orthogonal to them (:func:`_fresh_`), in full reorthogonalisation, where
  the copies of repeated eigenvalues lie (``I/32``, ``k = 3``: three products; Parlett, *The Symmetric
  Eigenvalue Problem*, §13.2; ARPACK's ``getv0``). After a lock, the per-step test also waits for the
  active space's best Ritz value (:func:`_ritz`). Nothing of this runs before the first breakdown:
  runs without one take the same products to the bit. A single Krylov space cannot see a repeated
  eigenvalue that it never closes on (``3`` forty times among sixty distinct values): there, as before,
  the copies come only from round-off.
* :func:`tridiagonal`: plain Lanczos from several start vectors side by side (the SLQ probes),
  one ``k``-column product per step written straight into the next basis row, each probe's basis
  kept semi-orthogonal by Simon's estimates in float64 (``reorth="partial"``; semi-orthogonal is
  enough for quadrature nodes and weights), or measured every step (``"selective"``), or fully
  reorthogonalised, or, with ``reorth="none"``, not at all and without a basis; returns each
  ``T``'s ``α, β`` (each kind timed on MiniLM's layer 3: ``benchmarks/MATFREE_NOTES.md``). How the
  peers run SLQ (read from their sources): PyHessian's
  ``density`` and Ghorbani et al.'s ``lanczos_alg`` (google/spectral-density) reorthogonalise fully against
  every stored vector, one probe at a time; curvlinops' ``fast_lanczos`` (Papyan 2020,
  algorithm 2) does not reorthogonalise and keeps three vectors.

**Tolerances, against the peers** (read from their sources):

* scipy ``eigsh`` (ARPACK, and so curvlinops, whose operators are scipy ``LinearOperator``s and
  which leaves the eigensolver to scipy): the same test on the *estimated* residual,
  ``‖r_i‖ ≤ tol · |θ_i|``, ``tol = 0`` meaning machine precision; ``maxiter = 10 n`` restarts.
  Ours is the same test, plus the true residual after convergence.
* hessian-eigenthings ``lanczos`` (1.0.0a5, the bench's): its own torch Lanczos, **no restart**:
  ``max_iter = min(2k, n − 1)`` steps by default, full reorthogonalisation (vector by vector)
  only when ``max_iter ≤ 50``, ``which="LM"`` (largest *magnitude*) by default, and
  ``converged`` flags ``|β_m s_{m,i}| < tol · |λ_i|`` with ``tol = 1e-4`` without acting on it;
  its 0.x releases handed the operator to scipy ``eigsh`` with ``tol = 1e-6``, ``maxiter = 20``,
  ``ncv = max(2k + 1, 20)``.
* PyHessian ``eigenvalues``: power iteration with deflation, stopped when the Rayleigh quotient
  moves by less than ``tol = 1e-3`` relative (``|λ_i − λ_{i−1}| / (|λ_{i−1}| + 1e-6)``), at most
  100 products per eigenvalue; no residual test, largest magnitude, unsorted.

Here the default is ``tol = 1e-8`` on the residual (a bound ``|θ − λ| ≤ ‖r‖`` on each
eigenvalue and ``≤ ‖r‖² / gap`` once separated), so the values agree with a tight reference to
far better than the peers' defaults ask for.

Memory: ``(m + 1) n`` entries for the basis (``m = ncv``, default ``max(2k + 1, 20)``, or up to
``16 k`` within :data:`BASIS_BYTES` for a partial pass; only the rows a run reaches are touched), in the
dtype of the products; the small ``T`` and its eigendecomposition are float64 on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from hessviz.errors import ConfigError
from hessviz.matfree.basis import (  # noqa: F401  (lanczos.norm, lanczos.Orthogonality … as before)
    COLUMNS,
    NORM_PIECE,
    REPEAT_BELOW,
    RUN_GAP,
    START_MIX,
    Apply,
    Orthogonality,
    apply_into,
    combine_,
    norm,
    orthogonalise_,
    partial_pass_,
    start_vector,
    symmetric,
    three_term_,
)
from hessviz.matfree.probes import rademacher
from hessviz.runtime import pages

WHICH = ("top", "bottom", "magnitude")


REORTHS = ("auto", "partial", "full")


def _reorth(reorth: str, like: Tensor, bound: str) -> str:
    """``reorth`` resolved: ``"auto"`` is ``"partial"`` for the eigenvalue bound in float64, else
    ``"full"``. A semi-orthogonal basis keeps the Ritz *values* to ``O(ε ‖H‖)``, but its Ritz
    *vectors* carry the ``√ε``-sized coefficients the occasional pass removes: on MiniLM's layer 3
    their true residuals stop near ``6e-8 |θ|`` while the estimates pass ``1e-8``. float32's ``√ε``
    (``3e-4``) is too coarse a level to keep."""
    if reorth not in REORTHS:
        raise ConfigError(f"reorth must be one of {REORTHS}, got {reorth!r}")
    if reorth == "auto":
        return "partial" if like.dtype == torch.float64 and bound == "value" else "full"
    return reorth


BASIS_BYTES = 1 << 30
"""The memory a partially reorthogonalised basis may grow to by default (:func:`default_ncv`)."""


def default_ncv(n: int, k: int, like: Tensor, reorth: str = "full") -> int:
    """The basis size ``m`` when ``ncv`` is not given. ``"full"``: ARPACK's ``max(2k + 1, 20)``,
    since each step reads the whole basis twice. ``"partial"``: a step reads only its last two rows,
    so a longer first pass costs little and saves the restarts (each a read and write of the basis):
    ``16 k`` rows, within :data:`BASIS_BYTES` (MiniLM's layer, 1.77 M float64 entries a row: 75), and
    never fewer than the full default. At most ``n``."""
    low = max(2 * k + 1, 20)
    if reorth == "partial":
        low = max(low, min(16 * k, BASIS_BYTES // (n * like.element_size())))
    return min(n, low)


def _check(
    n: int, k: int, which: str, tol: float, ncv: int | None, bound: str, like: Tensor, reorth: str
) -> tuple[int, str]:
    """The arguments of :func:`extremes` checked: the basis size ``m`` and ``reorth`` resolved."""
    if which not in WHICH:
        raise ConfigError(f"which must be one of {WHICH}, got {which!r}")
    check_bound(bound)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k must be an integer >= 1, got {k!r}")
    if k >= n:
        raise ConfigError(f"k must be < the operator size {n} for Lanczos, got {k}; use the dense term")
    if not (isinstance(tol, (int, float)) and tol > 0):
        raise ConfigError(f"tol must be a number > 0, got {tol!r}")
    reorth = _reorth(reorth, like, bound)
    m = default_ncv(n, k, like, reorth) if ncv is None else ncv
    if isinstance(m, bool) or not isinstance(m, int) or not k < m <= n:
        raise ConfigError(f"ncv must be an integer with k < ncv <= {n}, got {ncv!r}")
    return m, reorth


class _Pairs(NamedTuple):
    """The Ritz pairs of :func:`_ritz`, best first."""

    theta: Tensor
    """``(j,)`` every Ritz value: the locked rows' eigenvalues and the active space's Ritz values."""
    Y: Tensor
    """``(j, j)`` their vectors' coordinates on the basis rows ``Q[:j]``."""
    est: Tensor
    """``(j,)`` the estimated residuals ``β |y_{j,i}|`` (0 for a locked row)."""
    done: bool
    """Whether the wanted pass the test (:func:`passed`)."""
    active: Tensor
    """``(j − locked,)`` the active space's Ritz values, best first (what a restart keeps)."""
    active_Y: Tensor
    """Their coordinates on the active rows ``Q[locked:j]``."""
    settled: bool
    """Whether *every* active Ritz pair passes: the active space is invariant to ``tol``."""


class StopTest(NamedTuple):
    """The stopping test of :func:`passed`: the tolerance ``tol``, the dtype's ``eps``, the ``bound``
    (``"residual"`` or ``"value"``) and the wanted end ``which``."""

    tol: float
    eps: float
    bound: str = "residual"
    which: str = "top"


def _ritz(T: Tensor, j: int, beta: float, k: int, test: StopTest, locked: int = 0) -> _Pairs:
    """The Ritz pairs of the leading ``j × j`` of ``T`` (upper triangle filled), best first, and
    whether the first ``k`` pass the test of :func:`passed`.

    The first ``locked`` rows of the basis are exact eigenvectors (an invariant space locked by
    :func:`_lock_`; ``T``'s diagonal holds their values, ``est = 0``), the rest the active Krylov
    space, whose Ritz pairs come from ``T[locked:j, locked:j]``. With rows locked, the wanted among the
    active Ritz values pass the test, and so does the best of them when none is wanted: the locked
    values pass at once, and only once the active space's extreme has converged is it known that the
    complement holds nothing better (a fresh block's first Ritz value is an interior Rayleigh quotient)."""
    theta, Y = torch.linalg.eigh(symmetric(T, locked, j))
    order = _wanted(theta, j - locked, test.which)
    theta, Y = theta[order], Y[:, order]
    est = beta * Y[-1].abs() if len(theta) else theta
    values = torch.diagonal(T)[:locked]
    scale = float(values.abs().max()) if locked else 0.0

    def every_pair() -> bool:  # implies ``done``: asked only then (or in the first k steps)
        return passed(theta, est, len(theta), test, scale)

    if not locked:
        done = j > k and passed(theta, est, k, test)
        return _Pairs(theta, Y, est, done, theta, Y, (done or j <= k) and every_pair())
    every = torch.cat([values, theta])
    coords = torch.zeros(j, j, dtype=T.dtype)
    coords[range(locked), range(locked)] = 1.0
    coords[locked:, locked:] = Y
    order = _wanted(every, j, test.which)
    wanted = int((order[:k] >= locked).sum())
    active = min(max(1, wanted), len(theta))
    done = not len(theta) or passed(theta, est, active, test, scale)
    return _Pairs(
        every[order],
        coords[:, order],
        torch.cat([torch.zeros_like(values), est])[order],
        done,
        theta,
        Y,
        not len(theta) or (done and every_pair()),
    )


def value_error(theta: Tensor, residuals: Tensor, k: int | Tensor) -> Tensor:
    r"""The bound on ``|λ − θ_i|`` for the first ``k`` of the Ritz values ``theta`` (or those at the
    indices ``k``), from their residuals ``r_i``: ``min(r_i, r_i² / δ_i)``, ``δ_i`` the distance from
    ``θ_i`` to the nearest other Ritz value (Krylov–Bogoliubov ``|λ − θ| ≤ r``, and the gap theorem
    ``|λ − θ| ≤ r² / δ`` once the rest of the spectrum is ``δ`` away; Parlett, *The Symmetric
    Eigenvalue Problem*, §11.7). ``δ_i`` is the Ritz estimate of the gap, as eigensolvers take it:
    interior Ritz values lie inside the spectrum, so it can overstate the true gap early in a run.
    A repeated value (``δ_i = 0``, an invariant space's copies) has the bound ``r_i`` alone.

    >>> value_error(torch.tensor([3.0, 1.0, 0.0]), torch.tensor([0.1, 0.5, 0.5]), 1)
    tensor([0.0050])
    """
    idx = torch.arange(k) if isinstance(k, int) else k
    out = residuals[idx].clone()
    if theta.numel() > 1:
        gaps = (theta[idx, None] - theta[None, :]).abs()
        gaps[range(len(idx)), idx] = math.inf
        gap = gaps.min(1).values
        out = torch.where(gap > 0, torch.minimum(out, out**2 / gap), out)  # a repeated value: r alone
    return out


BOUNDS = ("residual", "value")


def check_bound(bound: str) -> str:
    """``bound`` if it names a stopping test of :func:`passed`, else :class:`ConfigError`."""
    if bound not in BOUNDS:
        raise ConfigError(f"bound must be one of {BOUNDS}, got {bound!r}")
    return bound


def passed(theta: Tensor, est: Tensor, k: int, test: StopTest, scale: float = 0.0) -> bool:
    """Whether the first ``k`` Ritz pairs pass the stopping test: ``bound="residual"``,
    ``‖H u_i − θ_i u_i‖ ≤ tol · |θ_i|``; ``"value"``, the eigenvalue's error bound
    :func:`value_error` ``≤ tol · |θ_i|``. ``|θ_i|`` is floored at ``ε^{2/3} · max|θ|`` as ARPACK
    floors it at ``ε^{2/3}``, so that a zero eigenvalue can converge.

    For ``which="magnitude"`` the largest magnitude is known only once both ends of the spectrum
    are: the Ritz value at the far end (the largest or the smallest, when it is not wanted) must
    pass as well, or be out of the race, its magnitude plus its error below the ``k``-th wanted
    magnitude minus that one's (else an end still moving outward could overtake the other). The far
    end is held to its residual under either bound: the gap theorem's ``r² / δ`` takes ``δ`` from
    the Ritz values, which early in a run overstate the gap at the edge of a dense cluster (a
    Rademacher start stopped at the isolated end after 7 products, ``tests/test_lanczos.py``).
    ``scale``: a magnitude the floor is taken from as well (the locked eigenvalues, :func:`_ritz`)."""
    tol, eps, bound, which = test
    floor = eps ** (2 / 3) * max(float(theta.abs().max()), scale)
    idx = torch.arange(k)
    if which == "magnitude" and theta.numel() > k:
        ends = torch.stack([theta.argmax(), theta.argmin()])
        idx = torch.cat([idx, ends[ends >= k]])
    err = est[idx] if bound == "residual" else torch.cat([value_error(theta, est, idx[:k]), est[idx[k:]]])
    ok = err <= tol * torch.clamp(theta[idx].abs(), min=floor)
    if len(idx) > k:
        ok[k:] |= theta[idx[k:]].abs() + err[k:] < theta[k - 1].abs() - err[k - 1]
    return bool(ok.all())


def _wanted(theta: Tensor, k: int, which: str) -> Tensor:
    """Indices of the ``k`` wanted Ritz values, best first (all of them ranked when ``k`` is
    ``len(theta)``)."""
    key = {"top": -theta, "bottom": theta, "magnitude": -theta.abs()}[which]
    return torch.argsort(key)[:k]


@dataclass(frozen=True)
class Ritz:
    values: Tensor
    """``(k,)`` float64, best first (largest for ``top`` and ``magnitude``, smallest for ``bottom``)."""
    vectors: Tensor | None
    """``(k, n)`` unit rows in the products' dtype, or ``None``."""
    residuals: Tensor
    """``(k,)`` ``‖H u − θ u‖``: true (one more product) with ``check``, else the estimate."""
    errors: Tensor
    """``(k,)`` the bound :func:`value_error` on ``|λ − θ|`` from ``residuals`` and the Ritz gaps."""
    matvecs: int
    restarts: int
    converged: bool


def extremes(
    apply: Apply,
    n: int,
    k: int,
    which: str = "top",
    *,
    tol: float = 1e-8,
    seed: int = 0,
    like: Tensor,
    ncv: int | None = None,
    max_restarts: int = 300,
    vectors: bool = False,
    check: bool = True,
    reorth: str = "auto",
    bound: str = "residual",
    start: Tensor | None = None,
) -> Ritz:
    """The ``k`` extreme eigenpairs of the symmetric ``apply`` of size ``n`` (see the module).

    ``like`` gives the dtype and device of the basis; the start vector is a Rademacher vector
    (``±1``) drawn from ``torch.Generator().manual_seed(seed)`` on the host, so the same numbers on
    every device (:func:`hessviz.matfree.probes.rademacher`: eight signs a random byte, cheaper to draw
    than a normal vector; timings: ``benchmarks/MATFREE_NOTES.md``), or, given ``start (n,)`` (a guess
    at the wanted direction, such as the gradient), ``start`` with that vector mixed in
    (:func:`start_vector`).
    Like a normal vector, a Rademacher vector has a component of variance 1 along every unit
    eigenvector. ``bound``: the stopping test of
    :func:`passed`, on the residual (default) or on the eigenvalue's error bound, which asks far
    fewer products when only the eigenvalues are wanted to ``tol``. ``reorth``: ``"partial"``
    (the first pass semi-orthogonal, :class:`Orthogonality`; after a restart, full), ``"full"``, or
    ``"auto"`` (:func:`_reorth`: partial for ``bound="value"`` in float64); ``ncv`` defaults by it
    (:func:`default_ncv`). A Krylov space that closes (``β = 0``) is an answer, not an error: its
    eigenpairs are locked and the run stops or goes on from a fresh vector (the module's "Breakdown
    is an answer"); when the locked rows leave no room they are cut to the ``k`` wanted, which counts
    as a restart."""
    return drive(
        steps(
            n,
            k,
            which,
            tol=tol,
            seed=seed,
            like=like,
            ncv=ncv,
            max_restarts=max_restarts,
            vectors=vectors,
            check=check,
            reorth=reorth,
            bound=bound,
            start=start,
        ),
        apply,
    )


Request = tuple[Tensor, Tensor | None]
"""A product a :func:`steps` run asks for: ``(V (b, n), out)``, ``H V`` to be written into ``out``
(basis rows) when it is given, else returned as a new tensor."""


def drive(run: Generator[Request, Tensor, Ritz], apply: Apply) -> Ritz:
    """Run :func:`steps` to its end, each product it asks for by ``apply`` (:func:`apply_into`)."""
    try:
        V, out = next(run)
        while True:
            V, out = run.send(apply(V) if out is None else apply_into(apply, V, out))
    except StopIteration as stop:
        return stop.value


def steps(
    n: int,
    k: int,
    which: str = "top",
    *,
    tol: float,
    seed: int,
    like: Tensor,
    ncv: int | None,
    max_restarts: int,
    vectors: bool,
    check: bool,
    reorth: str,
    bound: str,
    start: Tensor | None,
) -> Generator[Request, Tensor, Ritz]:
    """:func:`extremes`' run, its products asked for rather than made: it yields each
    :data:`Request` and is sent back ``H V``; its return value is the :class:`Ritz`. So several runs
    can share their products, each step's columns in one call (:mod:`hessviz.whole.lockstep`)."""
    m, reorth = _check(n, k, which, tol, ncv, bound, like, reorth)
    Q = pages.empty((m + 1, n), like)
    T = torch.zeros(m, m, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    q = start_vector(start, rademacher(n, 1, gen, like)[0])
    Q[0] = q / norm(q)
    eps = torch.finfo(like.dtype).eps
    test = StopTest(tol, eps, bound, which)
    closed = eps * math.sqrt(n)  # β ≤ ε₁ ‖T‖: the Krylov space is invariant (Simon's round-off term)
    omega = Orthogonality(m, n, eps) if reorth == "partial" else None
    j, begin, locked, matvecs, restarts, beta, size = 0, 0, 0, 0, 0, 0.0, 0.0
    while True:
        w = (yield Q[j : j + 1], Q[j + 1 : j + 2])[0]  # the next row, worked on in place
        matvecs += 1
        if j > begin or omega is not None:  # the three-term part first, so Gram–Schmidt cancels little
            alpha = float(torch.dot(Q[j], w))
            three_term_(w, Q, j, alpha, beta)
        if omega is not None:  # the first pass, semi-orthogonal
            T[j, j] = alpha
            if j:
                T[j - 1, j] = beta
            beta = float(norm(w))
            size = max(size, float(T[: j + 1, j].abs().sum()) + beta)
            if beta > closed * size and omega.advance(T, j, beta):
                left = partial_pass_(w, Q[: j + 1], omega.eps1)
                beta = float(norm(w))
                omega.orthogonalised(j, left)
        else:
            h = orthogonalise_(w, Q[: j + 1]).to(T)
            if j > begin:
                h[j] += alpha
                h[j - 1] += beta
            T[locked : j + 1, j] = h[locked:]  # on the locked rows: round-off, theirs is an invariant space
            beta = float(norm(w))
            size = max(size, float(T[: j + 1, j].abs().sum()) + beta)
        whole = beta <= closed * size  # β at round-off: the Krylov space is invariant
        if not whole:
            w.div_(beta)
            r = _ritz(T, j + 1, beta, k, test, locked)
            whole = r.settled  # or every Ritz pair of it passes: invariant to tol
            done = r.done and j + 1 > k  # the test each step, on the leading j + 1 of T
            if done and not whole:
                break
        if whole:
            # An invariant space (β = 0 or at round-off: a multiple of the identity, a low-rank block, a
            # start in an eigenspace; or each of its Ritz pairs within tol): its eigenpairs are answers.
            # Lock them; stop when they hold the k wanted, else go on in their complement from a fresh
            # vector (Parlett §13.2; ARPACK's getv0), where copies of repeated eigenvalues lie.
            block = _lock_(T, Q, locked, j + 1, which, like)
            locked = j + 1
            if _answered(torch.diagonal(T)[:locked], block, k, which, tol, eps) or locked == n:
                r, done = _ritz(T, locked, 0.0, k, test, locked), True
                break
            omega = None  # full reorthogonalisation from here
            if locked > m - 2:  # no room left: keep the wanted locked rows only
                if restarts >= max_restarts:
                    r, done = _ritz(T, locked, 0.0, k, test, locked), False
                    break
                restarts += 1
                locked = _compact_(T, Q, locked, k, which)
            if not _fresh_(Q, locked, gen, like):  # the locked rows span the space numerically
                r, done = _ritz(T, locked, 0.0, k, test, locked), True
                break
            j = begin = locked
            beta = 0.0
            continue
        if j + 1 < m:
            j += 1
            continue
        if restarts >= max_restarts:
            break
        restarts += 1  # thick restart on the best Ritz vectors
        omega = None  # and full reorthogonalisation from here
        room = m - locked
        keep = min(room - 1, k + (room - k) // 2) if room > k else room - 1
        combine_(r.active_Y[:, :keep].to(like), Q[locked:m], Q[locked : locked + keep])
        Q[locked + keep] = Q[m]
        T[:, locked:] = 0.0
        T[range(locked, locked + keep), range(locked, locked + keep)] = r.active[:keep]
        j = begin = locked + keep
    values, residuals = r.theta[:k].clone(), r.est[:k].clone()
    U = None
    if vectors or check:  # the Ritz vectors over the basis's first rows: no (k, n) beside it
        U = combine_(r.Y[:, :k].to(like), Q[: r.Y.shape[0]], Q[:k])
        U.div_(norm(U, dim=1, keepdim=True))
        if vectors:
            U = U.clone()
    if check:
        HU = yield Q[:k], Q[k : 2 * k] if len(Q) >= 2 * k else None
        values, residuals = _checked(HU, Q[:k])
        matvecs += k
    errors = value_error(torch.cat([values, r.theta[k:]]), residuals, k)
    return Ritz(values, U if vectors else None, residuals, errors, matvecs, restarts, done)


def _checked(HU: Tensor, U: Tensor) -> tuple[Tensor, Tensor]:
    """The Rayleigh quotients ``θ_i = u_iᵀ H u_i`` (error ``~ ‖r‖² / gap``) and true residuals
    ``‖H u_i − θ_i u_i‖`` of the unit rows ``U (k, n)``, float64 on the host, from their product
    ``HU`` (one product of ``k`` columns, written into spare rows of the basis when there are
    any: at a model's size the basis and ``k`` more rows are all the memory this needs), worked on
    in place, row by row."""
    values = torch.empty(len(U), dtype=torch.float64)
    residuals = torch.empty(len(U), dtype=torch.float64)
    for i, (hu, u) in enumerate(zip(HU, U)):
        theta = torch.dot(hu, u)
        values[i] = float(theta)
        residuals[i] = float(norm(hu.sub_(u * theta)))
    return values, residuals


def _lock_(T: Tensor, Q: Tensor, a: int, b: int, which: str, like: Tensor) -> Tensor:
    """Lock the invariant space of rows ``Q[a:b]``: the rows turned into its eigenvectors in place
    (``Q[a:b] ← Yᵀ Q[a:b]`` for ``T[a:b, a:b] = Y diag(θ) Yᵀ``), ``T``'s block made ``diag(θ)`` and its
    couplings to the other rows (round-off) zero. Returns ``θ``, best first."""
    theta, Y = torch.linalg.eigh(symmetric(T, a, b))
    order = _wanted(theta, b - a, which)
    theta, Y = theta[order], Y[:, order]
    combine_(Y.to(like), Q[a:b], Q[a:b])
    T[:, a:] = 0.0
    T[range(a, b), range(a, b)] = theta
    return theta


def _answered(values: Tensor, block: Tensor, k: int, which: str, tol: float, eps: float) -> bool:
    """Whether the locked eigenvalues ``values`` hold the ``k`` wanted, ``block`` (best first) being
    those of the invariant space locked last.

    That space is the Krylov space of a start with a share of every eigenvector of its complement
    (the premise of a random start, :func:`start_vector`): it holds one eigenvector of each distinct
    eigenvalue there, so whatever the complement of all locked rows still holds is a copy of one of
    ``block``. No copy can displace the ``k``-th wanted value when ``block``'s best is no better than
    it (within ``tol``, relative, floored as in :func:`passed`). A multiple of the identity: one
    product a value; a rank-``r`` block: the ``r`` nonzero values and 0 after ``r + 1`` products, and
    one more product (0 again) where more than ``r`` are wanted."""
    if len(values) < k:
        return False
    kth = float(values[_wanted(values, len(values), which)[k - 1]])
    best = float(block[0])
    slack = tol * max(abs(kth), eps ** (2 / 3) * float(values.abs().max()))
    if which == "top":
        return best <= kth + slack
    if which == "bottom":
        return best >= kth - slack
    return abs(best) <= abs(kth) + slack


def _compact_(T: Tensor, Q: Tensor, locked: int, k: int, which: str) -> int:
    """Keep only the ``k`` wanted of the ``locked`` rows (moved to the front, ``T``'s diagonal with
    them): room for a fresh Krylov space. Returns how many are kept."""
    values = torch.diagonal(T)[:locked].clone()
    keep = _wanted(values, locked, which)[:k]
    Q[: len(keep)] = Q[keep.to(Q.device)]
    T.zero_()
    T[range(len(keep)), range(len(keep))] = values[keep]
    return len(keep)


FRESH_TRIES = 5
"""Draws of a fresh vector after an invariant space before the locked rows are taken to span the
whole space (ARPACK's ``getv0`` tries as often)."""


def _fresh_(Q: Tensor, locked: int, gen: torch.Generator, like: Tensor) -> bool:
    """``Q[locked]`` ← a seeded Rademacher vector orthogonalised against ``Q[:locked]`` (twice) and made
    unit; ``False`` when every draw lies in their span to round-off (``‖w‖`` left below ``ε n`` of its
    norm: then no direction is left)."""
    n = Q.shape[1]
    for _ in range(FRESH_TRIES):
        w = rademacher(n, 1, gen, like)[0]
        orthogonalise_(w, Q[:locked])
        orthogonalise_(w, Q[:locked])
        size = float(norm(w))
        if size > torch.finfo(like.dtype).eps * n * math.sqrt(n):
            Q[locked] = w / size
            return True
    return False


REORTH = ("partial", "selective", "full", "none")


def tridiagonal(
    apply: Apply, v0: Tensor, steps: int, selective: bool = True, reorth: str | None = None
) -> list[tuple[Tensor, Tensor]]:
    """``steps`` Lanczos steps from each row of ``v0 (k, n)`` at once: one ``k``-column product
    per step. Returns per start vector the tridiagonal ``T``'s diagonal ``α (m,)`` and
    off-diagonal ``β (m − 1,)``; ``m < steps`` when that vector's Krylov space is invariant
    (``β ≤ ε √n ‖T‖``, round-off; ``‖T‖`` from the running ``max |α_j| + β_j + β_{j−1}``, so the test
    is the same at any scale of ``H``), after which its rows stay zero: the measure ``vᵀ δ(H − λ) v``
    then has ``m`` points, and the ``m`` nodes and weights are it, exactly (a multiple of the identity:
    one node; a rank-``r`` operator: at most ``r + 1``; the zero operator: one node at 0). A zero row
    of ``v0`` is refused (:class:`ConfigError`).

    ``reorth`` (default ``"partial"``, or ``"full"`` when ``selective=False``); each kind but
    ``"none"`` keeps the basis, ``steps · n`` entries per start vector:

    * ``"partial"``: the plain step, each probe's basis read only when Simon's estimates of its
      drift ask (:class:`Orthogonality`): semi-orthogonal, as ``"selective"`` is, without reading
      the basis every step (in float32, whose ``√ε`` is too coarse a level, ``"full"``);
    * ``"selective"``: each new vector's coefficients on its whole basis measured and those above
      ``√ε β`` subtracted (semi-orthogonal; :func:`orthogonalise_`): one read of the basis a step;
    * ``"full"``: all of them subtracted (classical Gram–Schmidt with the DGKS test);
    * ``"none"``: the plain three-term recurrence, three vectors per start vector and no basis
      (Papyan 2020's algorithm 2, as curvlinops' ``fast_lanczos``). Orthogonality is lost once
      Ritz values converge, and converged eigenvalues come back as near-copies ("ghosts"); the
      quadrature is still that of the measure ``vᵀ δ(H − λ) v`` up to round-off, the copies
      sharing their weight (Paige 1976; Chen 2023), so the density and the traces it gives stay
      right while the nodes near the edges repeat.
    """
    reorth = reorth or ("partial" if selective else "full")
    if reorth not in REORTH:
        raise ConfigError(f"reorth must be one of {REORTH}, got {reorth!r}")
    if reorth == "partial" and v0.dtype != torch.float64:
        reorth = "full"
    k, n = v0.shape
    steps = min(steps, n)
    keep_basis = reorth != "none"
    chosen = reorth == "selective" and v0.dtype == torch.float64  # √ε of float32 is too coarse
    # Every vector lives in one buffer allocated once, and the products write straight into the
    # next row (apply_into): the basis (each probe's rows contiguous, one spare), or three rows a
    # probe used in turn. The step's vector work is in place: no (k, n) temporary to fault in.
    Q = pages.empty((k, steps + 1, n) if keep_basis else (3, k, n), v0)

    def row(i: int) -> Tensor:
        return Q[:, i] if keep_basis else Q[i % 3]

    eps = torch.finfo(v0.dtype).eps
    closed = eps * math.sqrt(n)  # β ≤ ε₁ ‖T‖: the probe's Krylov space is invariant
    watch = [Orthogonality(steps, n, eps) for _ in range(k)] if reorth == "partial" else []
    T = torch.zeros(k, steps, steps, dtype=torch.float64) if watch else None
    scale = norm(v0, dim=1, keepdim=True)
    if not bool((scale > 0).all()):
        raise ConfigError("v0's rows must be nonzero: a zero start vector has no Krylov space")
    torch.div(v0, scale, out=row(0))
    alphas, betas = v0.new_zeros(steps, k), v0.new_zeros(steps, k)
    size = v0.new_zeros(k)  # per probe, the running max of |α_j| + β_j + β_{j−1} (≥ its ‖T‖ / 3)
    length = torch.full((k,), steps, dtype=torch.long)
    for j in range(steps):
        q = row(j)
        w = apply_into(apply, q, row(j + 1))
        a = torch.bmm(w[:, None, :], q[:, :, None])[:, 0, 0]  # αᵢ = qᵢᵀ wᵢ, row by row
        w.addcmul_(q, a[:, None], value=-1.0)
        before = betas[j - 1] if j else torch.zeros_like(a)
        if j:
            w.addcmul_(row(j - 1), before[:, None], value=-1.0)
        b = None
        if watch:
            b = norm(w, dim=1)
            size = torch.maximum(size, a.abs() + b + before)
            open_ = (b > closed * size).cpu()  # Simon's estimates divide by β
            plain = b.cpu()
            T[:, j, j] = a.to(T)
            if j:
                T[:, j - 1, j] = before.to(T)
            for i, omega in enumerate(watch):
                if length[i] == steps and open_[i] and omega.advance(T[i], j, float(plain[i])):
                    omega.orthogonalised(j, partial_pass_(w[i], Q[i, : j + 1], omega.eps1))
                    b = None  # a row changed: measure again below
        elif keep_basis:
            for i in range(k):  # measured against all
                orthogonalise_(w[i], Q[i, : j + 1], chosen)
        alphas[j] = a
        if b is None:
            b = norm(w, dim=1)
        size = torch.maximum(size, a.abs() + b + before)
        stop = (b <= closed * size) & (length == steps).to(b.device)
        length[stop.cpu()] = j + 1
        betas[j] = torch.where(stop, 0.0, b)
        ended = (length <= j + 1).to(b.device)
        w.div_(torch.where(ended, 1.0, b)[:, None])  # β > ε₁ ‖T‖ ≥ 0 on the others
        w.masked_fill_(ended[:, None], 0.0)  # an invariant probe's rows stay zero
    return [(alphas[:m, i], betas[: m - 1, i]) for i, m in enumerate(length.tolist())]
