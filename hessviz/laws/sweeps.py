r"""Sweeps: a measurement repeated over a grid of one variable and several seeds.

One engine, :func:`sweep`, serves the app's Scaling page and the claims of
:mod:`hessviz.experiments`. At every grid value ``x`` and seed ``s`` it calls a
:data:`Measure` ``(config at x, input norm, s) -> {key: value}`` and stores the values
in one :class:`Sweep`, whose layout is fixed:

* ``values[key]`` is ``(n_seeds, n_grid)``: one row per seed, one column per grid value.

The grid is the input norm ``‖X‖₂`` (``axis="xnorm"``), the sequence length (``"L"``),
the model width (``"d"``) or the depth of a stack (``"layers"``: ``n_layers``; the block
measured is then the first layer's, :func:`in_layer`). A measure that only depends on the
point is the usual case:
:func:`block_norms_measure` gives the spectral norms of Hessian blocks ``H[a, b]`` of each
term, computing only those blocks.

Statistics over seeds are named, never implied (:data:`hessviz.laws.fitting.STATISTICS`):

* ``"median"``: the median over seeds (robust to one odd seed), with the ``band``
  ``min..max`` over seeds; the app draws these;
* ``"geomean"``: the geometric mean ``exp(mean log v)`` (the centre of a log–log plot),
  with the same band; the claims use it.

Power-law slopes on log–log axes,

.. math::
    \log_{10} \|H_{ab}\| \approx s \log_{10} x + c ,

are compared with the exponents the theory gives (:data:`THEORY`): for self-attention
alone the outer W_Q–W_Q block grows like ``‖X‖₂⁶`` (Ormaniec, Dangel & Singh,
arXiv 2410.10986) and, at fixed ``‖X‖₂``, decays like ``1/L³``.

>>> import hessviz as hv
>>> cfg = hv.BlockConfig(seq_len=4, d_model=4, d_k=2, d_ff=4, norm="attention")
>>> measure = block_norms_measure(TERM_CURVES, key=term_key)
>>> res = sweep(cfg, "xnorm", [0.05, 0.1, 0.2], seeds=[0, 1], measure=measure)
>>> res.values["outer"].shape        # (seeds, grid)
(2, 3)
>>> round(res.fit_center("outer", stat="median").slope)
6
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

import hessviz as hv
from hessviz.block.config import layer_name
from hessviz.block.terms import PARTS_FIRST
from hessviz.laws.fitting import PowerLawFit, RangeFit, center, power_law_fit, slope_over_seeds
from hessviz.matfree.spectra import matrix_norm
from hessviz.runtime.tasks import run_tasks

TERMS = PARTS_FIRST
"""The terms, parts first (:data:`hessviz.block.terms.PARTS_FIRST`)."""
AXES = {
    "xnorm": "input size ‖X‖₂",
    "L": "sequence length L",
    "d": "model width d",
    "layers": "stack depth N (blocks)",
}
ARRAY_NAMES = {"xnorm": "input_norm", "L": "seq_len", "d": "d_model", "layers": "n_layers"}
"""Axis -> the name of the swept quantity in saved arrays (the argument or config field it sets)."""
DEFAULT_GRIDS: dict[str, tuple[float, ...]] = {
    "xnorm": tuple(float(v) for v in np.round(np.logspace(-1.5, 1, 11), 4)),
    "L": (2, 4, 8, 16, 32, 64),
    "d": (4, 8, 16, 24, 32, 48),
    "layers": (1, 2, 3, 4),
}
THEORY: dict[tuple[str, str, tuple[str, str], str], float] = {
    ("attention", "outer", ("W_Q", "W_Q"), "xnorm"): 6.0,
    ("attention", "outer", ("W_Q", "W_Q"), "L"): -3.0,
}
"""(norm, term, block pair, axis) -> exponent the theory gives (small ‖X‖₂ / large L regime)."""

Curve = tuple[str, str, str]
"""``(a, b, term)``: the block ``H[a, b]`` of ``term``."""
SHORT = {"W_Q": "Q", "W_K": "K", "W_V": "V", "W_1": "1", "W_2": "2"}

Measure = Callable[[hv.BlockConfig, float, int], Mapping[str, float]]
"""``(config at the grid point, input norm ‖X‖₂, seed) -> {key: value}``."""
Inputs = Callable[[hv.BlockConfig, int, float], tuple[dict, torch.Tensor, torch.Tensor]]
"""``(config, seed, input norm) -> (params, X, Y)``."""
Progress = Callable[[int, int], None]
"""``progress(done, total)``, called after each point; an exception it raises stops the sweep."""


def theory_exponent(norm: str, term: str, pair: tuple[str, str], axis: str) -> float | None:
    """The exponent of :data:`THEORY`, or ``None`` where the theory gives none."""
    return THEORY.get((norm, term, tuple(pair), axis))


def check_axis(axis: str) -> None:
    if axis not in AXES:
        raise hv.ConfigError(f"axis must be one of {', '.join(AXES)}, got {axis!r}")


def config_at(cfg: hv.BlockConfig, axis: str, value: float) -> tuple[hv.BlockConfig, float | None]:
    """``cfg`` with the swept field set; the second item is the input norm when ``axis == "xnorm"``."""
    check_axis(axis)
    if axis == "xnorm":
        return cfg, float(value)
    if axis == "L":
        return dataclasses.replace(cfg, seq_len=int(value)), None
    if axis == "layers":
        return dataclasses.replace(cfg, n_layers=int(value)), None
    return dataclasses.replace(cfg, d_model=int(value)), None


def in_layer(cfg: hv.BlockConfig, name: str, layer: int = 0) -> str:
    """``name`` (one block's, e.g. ``"W_Q[1]"``) as the weight of layer ``layer`` of ``cfg``:
    unchanged for one block, ``"l{layer}.W_Q[1]"`` in a stack. ``layer = -1`` is the last layer.

    >>> in_layer(hv.BlockConfig(n_layers=3), "W_Q", -1), in_layer(hv.BlockConfig(), "W_Q")
    ('l2.W_Q', 'W_Q')
    """
    if not cfg.is_stack:
        return name
    return layer_name(layer % cfg.n_layers, name)


def largest_weight(cfg: hv.BlockConfig, axis: str, grid: Sequence[float], pair: tuple[str, str]) -> int:
    """The largest weight count of ``pair`` over the grid (the swept Hessian block is its square)."""
    sizes = []
    for g in grid:
        c = config_at(cfg, axis, g)[0]
        sizes += [c.param_size(in_layer(c, n)) for n in pair]
    return max(sizes)


def costliest_config(cfg: hv.BlockConfig, axis: str, grid: Sequence[float]) -> hv.BlockConfig:
    """The configuration at the grid's largest ``L``, ``d`` or depth (``cfg`` itself for ``‖X‖₂``):
    a point's cost grows with each of them, so pricing every point there bounds the sweep's cost
    from above. Pricing it at the sidebar's block instead missed the grid's larger points: a sweep
    over ``L`` from a sidebar at ``L = 2`` was priced as thirty-two times shorter sequences than
    its last points.

    >>> costliest_config(hv.BlockConfig(seq_len=2), "L", DEFAULT_GRIDS["L"]).seq_len
    64
    """
    return config_at(cfg, axis, max(grid))[0]


# ----------------------------------------------------------------------------- measures


def curve_key(c: Curve) -> str:
    """``("W_Q", "W_Q", "outer") -> "QQ_outer"``."""
    a, b, term = c
    return f"{SHORT[a]}{SHORT[b]}_{term}"


def term_curves(pair: tuple[str, str]) -> tuple[Curve, ...]:
    """The three terms (:data:`TERMS`) of one block pair."""
    return tuple((pair[0], pair[1], t) for t in TERMS)


TERM_CURVES = term_curves(("W_Q", "W_Q"))


def seeded_inputs(
    cfg: hv.BlockConfig, seed: int, input_norm: float
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Seeded ``(params, X, Y)``: weights ``N(0, 1/fan_in)``, ``‖X‖₂ = input_norm`` (one seed for all)."""
    params = hv.init_params(cfg, seed=seed)
    X, Y = hv.sample_inputs(cfg, seed=seed, input_norm=input_norm)
    return params, X, Y


def block_norms(
    cfg: hv.BlockConfig,
    params: dict,
    X: torch.Tensor,
    Y: torch.Tensor,
    curves: Sequence[Curve],
    kind: str = "spectral",
    layer: int = 0,
) -> dict[Curve, float]:
    """``curve -> ‖H[a, b]‖`` of ``term``, computing only the weights the curves name; in a
    stack the curves' one-block names are read in layer ``layer`` (:func:`in_layer`)."""
    named = {c: (in_layer(cfg, c[0], layer), in_layer(cfg, c[1], layer)) for c in curves}
    for a, b in named.values():
        cfg.check_name(a)
        cfg.check_name(b)
    names = cfg.sort_names(sorted({n for ab in named.values() for n in ab}))  # weights or head slices
    res = hv.hessian(cfg, params, X, Y, wrt=names)
    return {c: matrix_norm(res.block(*named[c], c[2]), kind) for c in curves}


def term_key(c: Curve) -> str:
    """``("W_Q", "W_Q", "outer") -> "outer"``: the key when one block pair is swept."""
    return c[2]


@dataclass(frozen=True)
class BlockNorms:
    """A :data:`Measure`: ``key(curve) -> ‖H[a, b]‖`` of each curve's term on ``inputs(cfg, seed,
    ‖X‖₂)`` (in a stack, of layer ``layer``). A picklable value (module-level ``key`` and ``inputs``),
    so that a sweep's points can go to a process pool or a cluster."""

    curves: tuple
    key: Callable[[Curve], str] = curve_key
    kind: str = "spectral"
    inputs: Inputs = seeded_inputs
    layer: int = 0

    def __call__(self, cfg: hv.BlockConfig, input_norm: float, seed: int) -> dict[str, float]:
        got = block_norms(cfg, *self.inputs(cfg, seed, input_norm), self.curves, self.kind, self.layer)
        return {self.key(c): v for c, v in got.items()}


def block_norms_measure(
    curves: Sequence[Curve],
    *,
    key: Callable[[Curve], str] = curve_key,
    kind: str = "spectral",
    inputs: Inputs = seeded_inputs,
    layer: int = 0,
) -> Measure:
    """A :data:`Measure`: ``key(curve) -> ‖H[a, b]‖`` of each curve's term on ``inputs(cfg, seed, ‖X‖₂)``
    (in a stack, of layer ``layer``); a :class:`BlockNorms`."""
    return BlockNorms(tuple(tuple(c) for c in curves), key, kind, inputs, layer)


def point(
    cfg: hv.BlockConfig,
    input_norm: float,
    seed: int,
    pair: tuple[str, str],
    kind: str = "spectral",
    layer: int = 0,
) -> dict[str, float]:
    """``term -> ‖H_ab‖`` for one block pair (of layer ``layer`` in a stack) on seeded inputs:
    one point of the Scaling page."""
    return block_norms_measure(term_curves(tuple(pair)), key=term_key, kind=kind, layer=layer)(
        cfg, input_norm, seed
    )


# ----------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class Sweep:
    """Values over a grid and seeds. ``values[key]`` is ``(n_seeds, n_grid)``."""

    axis: str
    """``"xnorm"``, ``"L"`` or ``"d"`` (:data:`AXES`)."""
    grid: np.ndarray
    """``(n_grid,)`` swept values."""
    seeds: tuple[int, ...]
    values: dict[str, np.ndarray] = field(default_factory=dict)
    """``key -> (n_seeds, n_grid)``."""
    label: str = ""

    def center(self, key: str, stat: str) -> np.ndarray:
        """``(n_grid,)``: the statistic ``stat`` (:data:`STATISTICS`) over seeds."""
        return center(self.values[key], stat)

    def band(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(min, max)`` over seeds, each ``(n_grid,)``."""
        v = self.values[key]
        return v.min(axis=0), v.max(axis=0)

    def fit_center(self, key: str, stat: str, mask: Sequence[bool] | None = None) -> PowerLawFit:
        """Least-squares log–log fit of the centre curve over ``mask`` (all points by default).

        Raises ``ValueError`` with fewer than two usable (positive) points.
        """
        m = np.ones(self.grid.size, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        return power_law_fit(self.grid[m], self.center(key, stat)[m], n_boot=0)

    def fit_per_seed(self, key: str, lo: float = -np.inf, hi: float = np.inf) -> PowerLawFit:
        """One slope per seed over ``lo <= x <= hi``, their mean with a 95 % t-interval over seeds."""
        m = (self.grid >= lo) & (self.grid <= hi)
        return slope_over_seeds(self.grid[m], self.values[key][:, m])

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Flat arrays for an NPZ: the grid (named as in :data:`ARRAY_NAMES`), the seeds and each key."""
        out = {f"{prefix}{ARRAY_NAMES[self.axis]}": self.grid, f"{prefix}seeds": np.asarray(self.seeds)}
        out.update({f"{prefix}{k}": v for k, v in self.values.items()})
        return out

    def table(self) -> dict[str, list]:
        """Long format columns: axis value, seed, key (``term``), value (``norm``)."""
        cols: dict[str, list] = {self.axis: [], "seed": [], "term": [], "norm": []}
        for t, v in self.values.items():
            for i, x in enumerate(self.grid):
                for j, s in enumerate(self.seeds):
                    cols[self.axis].append(float(x))
                    cols["seed"].append(s)
                    cols["term"].append(t)
                    cols["norm"].append(float(v[j, i]))
        return cols


def long_table(named: Mapping[str, Sweep], label: str = "placement") -> dict[str, list]:
    """The long tables (:meth:`Sweep.table`) of several sweeps one under the other, with a
    ``label`` column naming the sweep of each row (e.g. ``placement -> Sweep``).

    >>> one = Sweep("L", np.array([2.0, 4.0]), (0,), {"outer": np.array([[1.0, 0.5]])})
    >>> t = long_table({"post": one, "pre": one})
    >>> t["placement"], t["L"], t["norm"]
    (['post', 'post', 'pre', 'pre'], [2.0, 4.0, 2.0, 4.0], [1.0, 0.5, 1.0, 0.5])
    """
    cols: dict[str, list] = {label: []}
    for name, result in named.items():
        t = result.table()
        cols[label] += [name] * len(t["norm"])
        for k, v in t.items():
            cols.setdefault(k, []).extend(v)
    return cols


def sweep(
    cfg: hv.BlockConfig,
    axis: str,
    grid: Sequence[float],
    seeds: Sequence[int],
    measure: Measure,
    *,
    input_norm: float = 1.0,
    progress: Progress | None = None,
    label: str = "",
    executor: cf.Executor | None = None,
) -> Sweep:
    """``measure`` at every grid value (outer loop) and seed (inner loop).

    At ``axis == "xnorm"`` the grid value is the input norm; otherwise ``input_norm`` is.
    ``progress(done, total)`` is called after each point: an app shows progress with it,
    and cancels by raising from it, as any exception from ``progress`` (or ``measure``)
    stops the sweep and propagates to the caller; nothing partial is returned.

    ``executor``: any :class:`concurrent.futures.Executor` (a process pool, a Dask client's
    ``get_executor()``), one task per point by :func:`hessviz.runtime.tasks.run_tasks`, under this
    process's torch thread count, so the values are the in-process ones to the bit; ``measure``
    must then pickle (:class:`BlockNorms` does; Dask also takes closures), and ``progress`` is
    called as each point's result arrives, in order.
    """
    check_axis(axis)
    grid_a = np.asarray(grid, dtype=np.float64)
    seeds = tuple(int(s) for s in seeds)
    points = [(i, j, *config_at(cfg, axis, x), s) for i, x in enumerate(grid_a) for j, s in enumerate(seeds)]
    calls = [(c, input_norm if xn is None else xn, s) for _, _, c, xn, s in points]
    values: dict[str, np.ndarray] = {}

    def store(n: int, got: Mapping[str, float]) -> None:
        i, j = points[n][:2]
        for k, v in got.items():
            values.setdefault(k, np.full((len(seeds), grid_a.size), np.nan))[j, i] = v
        if progress is not None:
            progress(n + 1, len(points))

    if executor is None:
        for n, args in enumerate(calls):
            store(n, measure(*args))
    else:
        run_tasks(executor, measure, calls, arrived=store)
    return Sweep(axis, grid_a, seeds, values, label)


# ----------------------------------------------------------------------------- fits for the app


def fit_mask(axis: str, grid: Sequence[float]) -> np.ndarray:
    """Which points a slope fit uses: the regime the theory describes.

    ``xnorm``: ``‖X‖₂ ≤ 1`` (softmax still close to uniform); ``L``: ``L ≥ 4``; ``d``, ``layers``: all.

    >>> fit_mask("L", [2, 4, 8]).tolist()
    [False, True, True]
    """
    g = np.asarray(grid, dtype=np.float64)
    if axis == "xnorm":
        m = g <= 1.0
    elif axis == "L":
        m = g >= 4
    else:
        m = np.ones_like(g, dtype=bool)
    return m if m.sum() >= 2 else np.ones_like(g, dtype=bool)


def fits(
    result: Sweep, norm: str, pair: tuple[str, str], terms: Sequence[str] = TERMS, stat: str = "median"
) -> dict[str, RangeFit]:
    """``term -> RangeFit`` of the ``stat`` curve over :func:`fit_mask`, expecting :func:`theory_exponent`."""
    mask = fit_mask(result.axis, result.grid)
    xs = result.grid[mask]
    out = {}
    for t in terms:
        try:
            f = result.fit_center(t, stat, mask)
        except ValueError:
            f = None
        theory = theory_exponent(norm, t, tuple(pair), result.axis)
        out[t] = RangeFit(f, float(xs.min()), float(xs.max()), theory)
    return out
