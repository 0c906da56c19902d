r"""One term's spectrum from products alone, summarised: Lanczos extremes and a grouped SLQ density.

:func:`term_spectrum` is what a viewer of a large block draws: the ``k`` largest and ``k``
smallest eigenvalues by Lanczos (:func:`hessviz.matfree.eigenpairs`) and the spectral density by
stochastic Lanczos quadrature (:func:`grouped_density`), with the per-probe estimates of
:func:`density_summary` and their standard errors. No dense term is formed.

* **Groups of probes.** Each SLQ probe keeps its ``steps × P`` Lanczos basis; the probes run in
  groups of :func:`slq_group` that fit ``group_bytes`` (one at least), group ``i`` seeded
  ``seed + i``, so the same arguments give the same numbers whatever machine runs them.
* **Round-off is not curvature.** A node counts as negative below ``−ROUND_OFF · max|θ|``
  (:data:`ROUND_OFF`, the rule of :func:`hessviz.matfree.spectra.negative_summary`).
* **Flat blocks.** A block table's block is flat when its top eigenvalue is at most
  ``ROUND_OFF · max_b |λ_max|`` (:func:`flat_blocks`); :func:`block_spread` leaves those out.
* **The outer term's bottom.** ``JᵀAJ ⪰ 0`` has rank at most ``L·d``: when ``L·d + k < P`` its
  ``k`` smallest eigenvalues are 0 and Lanczos stalls on them; ``bottom`` is then None.

``progress(done, total, message)`` (the convention of :mod:`hessviz.matfree.spectral`) counts
products over the whole computation; an exception it raises cancels it.

>>> import hessviz as hv
>>> cfg = hv.BlockConfig(seq_len=4, d_model=6, d_k=2, d_ff=8)
>>> res = hv.hessian(cfg, hv.init_params(cfg, seed=0), *hv.sample_inputs(cfg, seed=0))
>>> s = term_spectrum(res, "full", k=2, probes=3, steps=10)
>>> s["top"]["values"].shape, s["density"]["matvecs"], s["density"]["group"]
((2,), 30, 3)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hessviz.matfree.spectral import Density, Progress, density, eigenpairs

GROUP_BYTES = 64 << 20
"""Lanczos bases held at once by the SLQ density (probes run in groups that fit; one at least)."""
ROUND_OFF = 1e-10
"""A node below ``−ROUND_OFF · max|θ|`` is negative; above it, round-off."""


def block_list(cfg, by_head: bool = True) -> list[tuple[str, int]]:
    """``(name, size)`` of each diagonal block of a block table for the block ``cfg``: every weight,
    or every head of a weight with heads (the blocks of :func:`hessviz.matfree.block_names`)."""
    out = []
    for name in cfg.param_names:
        if by_head and cfg.n_heads > 1 and cfg.is_headed(name):
            out += [(s, cfg.param_size(s)) for s in cfg.head_names(name)]
        else:
            out.append((name, cfg.param_size(name)))
    return out


def flat_blocks(top: np.ndarray) -> np.ndarray:
    """``(n,)`` bool: blocks whose top eigenvalue is at most ``ROUND_OFF · max|λ_top|`` (no positive
    curvature beyond round-off)."""
    top = np.asarray(top, dtype=float)
    return top <= ROUND_OFF * np.abs(top).max() if top.size else np.zeros(0, bool)


@dataclass(frozen=True)
class BlockSpread:
    """How far apart the blocks' top eigenvalues are, the flat blocks left out (:func:`block_spread`)."""

    flat: list[str]
    """Blocks with no positive curvature beyond round-off (:func:`flat_blocks`)."""
    spread: float
    """Largest over smallest top eigenvalue of the other blocks; nan with fewer than two of them."""
    sharpest: str
    flattest: str
    """The curved block with the smallest top eigenvalue ("" without one)."""
    largest: float
    smallest: float
    """Smallest top eigenvalue of a curved block (nan without one)."""


def block_spread(names, top: np.ndarray) -> BlockSpread:
    """The spread ``max_b λ_max(H_bb) / min_b λ_max(H_bb)`` over the blocks ``names`` with curvature,
    which blocks are flat, and the sharpest and flattest of the others.

    >>> s = block_spread(["a", "b", "c"], np.array([4.0, 1e-18, 0.5]))
    >>> s.flat, s.spread, s.sharpest, s.flattest
    (['b'], 8.0, 'a', 'c')
    """
    top = np.asarray(top, dtype=float)
    flat = flat_blocks(top)
    curved = [(float(t), n) for n, t, f in zip(names, top, flat) if not f]
    hi, lo = max(curved, default=(float("nan"), "")), min(curved, default=(float("nan"), ""))
    spread = hi[0] / lo[0] if len(curved) > 1 else float("nan")
    return BlockSpread([n for n, f in zip(names, flat) if f], spread, hi[1], lo[1], hi[0], lo[0])


def lanczos_products(k: int) -> int:
    """Products scipy's ``eigsh`` usually needs for ``k`` extreme eigenvalues (``ncv = max(2k+1, 20)``;
    a few restarts): ``4 · ncv``, an over-estimate on the blocks measured."""
    return 4 * max(2 * k + 1, 20)


def slq_group(size: int, probes: int, steps: int, group_bytes: int = GROUP_BYTES) -> int:
    """Probes run side by side so that their Lanczos bases (``steps × size`` float64 each) fit
    ``group_bytes``."""
    basis = 8 * min(steps, size) * size
    return max(1, min(probes, group_bytes // max(1, basis)))


class _Offset:
    """One stage's ``progress(done, total, message)`` as part of the whole computation's count."""

    def __init__(self, progress: Progress | None, offset: int, expected: int, total: int, label: str):
        self.progress, self.offset, self.expected, self.total, self.label = (
            progress,
            offset,
            expected,
            total,
            label,
        )

    def __call__(self, done: int, total: int | None, message: str) -> None:
        if self.progress is not None:
            self.progress(self.offset + min(done, self.expected), self.total, f"{self.label}: {message}")


def grouped_density(
    res,
    term: str,
    probes: int,
    steps: int,
    *,
    seed: int = 0,
    group_bytes: int = GROUP_BYTES,
    progress: Progress | None = None,
    offset: int = 0,
    total: int | None = None,
    label: str = "",
) -> tuple[Density, int]:
    """``(density, group)``: :func:`hessviz.matfree.density` of ``probes`` probes of ``steps`` steps,
    run in groups of ``group`` probes (:func:`slq_group`; group ``i`` seeded ``seed + i``), merged
    into one :class:`~hessviz.matfree.Density` (nodes and weights of every probe, products and
    seconds summed). ``offset``/``total``: where these products sit in a larger count."""
    group = slq_group(res.size, probes, steps, group_bytes)
    total = probes * steps if total is None else total
    label = label or f"{term}: SLQ density"
    nodes, weights, matvecs, seconds, d = [], [], 0, 0.0, None
    for g in range(-(-probes // group)):
        count = min(group, probes - g * group)
        step = _Offset(progress, offset + g * group * steps, count * steps, total, label)
        d = density(res, term, count, steps, seed=seed + g, progress=step)
        nodes += d.nodes
        weights += d.weights
        matvecs, seconds = matvecs + d.matvecs, seconds + d.seconds
    return dataclasses.replace(d, nodes=nodes, weights=weights, matvecs=matvecs, seconds=seconds), group


def density_summary(d: Density) -> dict[str, float]:
    """Per-probe SLQ estimates, their mean and standard error over probes (nan with one probe):
    ``trace`` (``P Σ_j τ_j θ_j``), ``negative_share`` (the weight of nodes below round-off,
    :data:`ROUND_OFF`) and ``negative_mass`` (``Σ_{θ<0} τ|θ| / Σ τ|θ|``), each with ``_se``."""
    P, tol = d.size, ROUND_OFF * float(np.max(np.abs(d.all_nodes)))
    trace = np.array([P * float(np.sum(w * x)) for x, w in zip(d.nodes, d.weights)])
    share = np.array([float(np.sum(w[x < -tol])) for x, w in zip(d.nodes, d.weights)])
    absolute = np.array([float(np.sum(w * np.abs(x))) for x, w in zip(d.nodes, d.weights)])
    negative = np.array([float(np.sum((w * np.abs(x))[x < -tol])) for x, w in zip(d.nodes, d.weights)])
    mass = negative / np.where(absolute > 0, absolute, 1.0)

    def se(a: np.ndarray) -> float:
        return float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else float("nan")

    return {
        "trace": float(trace.mean()),
        "trace_se": se(trace),
        "negative_share": float(share.mean()),
        "negative_share_se": se(share),
        "negative_mass": float(mass.mean()),
        "negative_mass_se": se(mass),
    }


def term_spectrum(
    res,
    term: str,
    k: int = 5,
    probes: int = 4,
    steps: int = 30,
    *,
    seed: int = 0,
    group_bytes: int = GROUP_BYTES,
    progress: Progress | None = None,
) -> dict:
    """One term's matrix-free spectrum as plain values (what a page draws and a cache keeps):

    ``top``/``bottom``: ``{"values", "matvecs", "seconds", "method"}`` of the ``k`` largest and
    smallest eigenvalues by Lanczos, each within ``1e-8`` relative by its error bound (``bound="value"``:
    a page shows values, not vectors) (``bottom`` None for the outer term when its rank bound leaves
    ``k`` zero eigenvalues); ``density``: ``grid``, ``curve`` (smoothed, :meth:`Density.curve`),
    ``nodes``, ``weights``, ``matvecs``, ``seconds``, ``method``, ``group`` and the estimates of
    :func:`density_summary`; and ``k, probes, steps, seed, size, term``."""
    cfg = res.cfg
    rank = cfg.seq_len * cfg.d_model
    out = {"k": k, "probes": probes, "steps": steps, "seed": seed, "size": res.size, "term": term}
    eig = lanczos_products(k)
    total = 2 * eig + probes * steps
    for i, which in enumerate(("top", "bottom")):
        if which == "bottom" and term == "outer" and rank + k < res.size:
            out[which] = None  # JᵀAJ ⪰ 0 with rank ≤ L·d: its k smallest are 0, Lanczos stalls on them
            continue
        e = eigenpairs(
            res,
            term,
            k,
            which,
            seed=seed,
            bound="value",
            progress=_Offset(progress, i * eig, eig, total, f"{term}: {which}-{k} λ"),
        )
        out[which] = {"values": e.values, "matvecs": e.matvecs, "seconds": e.seconds, "method": e.method}
    dens, group = grouped_density(
        res,
        term,
        probes,
        steps,
        seed=seed,
        group_bytes=group_bytes,
        progress=progress,
        offset=2 * eig,
        total=total,
    )
    grid, phi = dens.curve()
    out["density"] = {
        "grid": grid,
        "curve": phi,
        "nodes": dens.all_nodes,
        "weights": dens.all_weights,
        "matvecs": dens.matvecs,
        "seconds": dens.seconds,
        "method": dens.method,
        "group": group,
        **density_summary(dens),
    }
    return out
