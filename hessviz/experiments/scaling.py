r"""Claims 1–3: how Hessian blocks scale with the input norm, the placement and the length.

* ``xnorm6``: for attention alone, ``‖H_QQ^outer‖₂ ∝ ‖X‖₂⁶``, ``‖H_QQ^functional‖₂ ∝ ‖X‖₂⁵``,
  ``‖H_VV^outer‖₂ ∝ ‖X‖₂²`` (Petrov et al., Theorem on the self-attention Hessian norm; the
  exponents come from ``‖Z_1‖ ≤ ‖X‖³/L`` and ``‖Z_2‖ ≤ 6‖X‖⁵``).
* ``placement``: the same slopes for Post-LN, Pre-LN and no LN.
* ``seqlen``: at fixed ``‖X‖₂`` the ``W_Q`` terms decay like ``1/L³`` (from ``‖∂A/∂T‖ ≤ 1/L``
  squared and the ``1/L`` of the loss).

A sweep is a :class:`Sweep`: the swept values ``x`` and, per curve, an array
``(seeds, len(x))`` of spectral norms. Nothing here plots.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

import hessviz as hv
from hessviz.experiments.common import SHORT, SOURCES, ClaimResult, block_norm, problem
from hessviz.experiments.fitting import PowerLawFit, bend_point, local_slopes, slope_over_seeds

Curve = tuple[str, str, str]
"""``(a, b, term)``: the block ``H[a, b]`` of ``term``."""

DEFAULT_CURVES: tuple[Curve, ...] = (
    ("W_Q", "W_Q", "outer"),
    ("W_Q", "W_Q", "functional"),
    ("W_V", "W_V", "outer"),
)


def curve_key(c: Curve) -> str:
    """``("W_Q", "W_Q", "outer") -> "QQ_outer"``."""
    a, b, term = c
    return f"{SHORT[a]}{SHORT[b]}_{term}"


@dataclass
class Sweep:
    """Spectral norms of Hessian blocks over a swept variable, one row per seed."""

    variable: str
    x: np.ndarray
    seeds: tuple[int, ...]
    values: dict[str, np.ndarray] = field(default_factory=dict)
    """curve key -> (seeds, len(x))."""
    label: str = ""

    def mean(self, key: str) -> np.ndarray:
        return np.exp(np.log(self.values[key]).mean(axis=0))

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        out = {f"{prefix}{self.variable}": self.x, f"{prefix}seeds": np.asarray(self.seeds)}
        out.update({f"{prefix}{k}": v for k, v in self.values.items()})
        return out


def _norms(cfg, params, X, Y, curves) -> dict[str, float]:
    names = tuple(n for n in cfg.param_names if any(n in c[:2] for c in curves))
    res = hv.hessian(cfg, params, X, Y, wrt=names)
    return {curve_key(c): block_norm(res, *c) for c in curves}


def norm_sweep(cfg: hv.BlockConfig, norms, seeds=(0, 1, 2), curves=DEFAULT_CURVES) -> Sweep:
    """Block norms for each ``‖X‖₂`` in ``norms`` and each seed (weights and ``X`` seeded alike)."""
    norms = np.asarray(norms, dtype=float)
    sw = Sweep("input_norm", norms, tuple(seeds), label=cfg.describe())
    vals = {curve_key(c): np.zeros((len(seeds), norms.size)) for c in curves}
    for i, s in enumerate(seeds):
        for j, r in enumerate(norms):
            params, X, Y = problem(cfg, s, float(r))
            for k, v in _norms(cfg, params, X, Y, curves).items():
                vals[k][i, j] = v
    sw.values = vals
    return sw


def length_sweep(
    cfg: hv.BlockConfig, lengths, input_norm: float = 1.0, seeds=(0, 1, 2), curves=DEFAULT_CURVES
) -> Sweep:
    """Block norms for each sequence length at fixed ``‖X‖₂ = input_norm``."""
    lengths = np.asarray(lengths, dtype=int)
    sw = Sweep("seq_len", lengths.astype(float), tuple(seeds), label=cfg.describe(input_norm))
    vals = {curve_key(c): np.zeros((len(seeds), lengths.size)) for c in curves}
    for j, L in enumerate(lengths):
        c_L = replace(cfg, seq_len=int(L))
        for i, s in enumerate(seeds):
            params, X, Y = problem(c_L, s, input_norm)
            for k, v in _norms(c_L, params, X, Y, curves).items():
                vals[k][i, j] = v
    sw.values = vals
    return sw


def fit_range(sw: Sweep, key: str, lo: float, hi: float) -> PowerLawFit:
    """Slope over seeds of curve ``key`` restricted to ``lo <= x <= hi``."""
    m = (sw.x >= lo) & (sw.x <= hi)
    return slope_over_seeds(sw.x[m], sw.values[key][:, m])


# ----------------------------------------------------------------------------------------------
# The claims

XNORM_EXPECTED = {"QQ_outer": 6.0, "QQ_functional": 5.0, "VV_outer": 2.0}
SMALL_NORM_RANGE = (0.01, 0.1)


def _grid(quick: bool) -> np.ndarray:
    return np.logspace(-2, 2, 13 if quick else 33)


def claim_xnorm6(quick: bool = False) -> ClaimResult:
    from hessviz.experiments import figures

    cfg = hv.BlockConfig(seq_len=8, d_model=16, d_k=8, norm="attention")
    seeds = (0, 1) if quick else (0, 1, 2, 3, 4)
    sw = norm_sweep(cfg, _grid(quick), seeds)
    measured: dict = {}
    fits = {}
    ok = True
    bends = {}
    for key, expected in XNORM_EXPECTED.items():
        f = fit_range(sw, key, *SMALL_NORM_RANGE)
        fits[key] = (f, SMALL_NORM_RANGE)
        measured[f"slope_attention_{key}"] = f.slope
        measured[f"ci_attention_{key}"] = list(f.ci)
        ok &= abs(f.slope - expected) < 0.15
        b = bend_point(sw.x, sw.mean(key), expected, tol=0.5)
        bends[key] = b
        if np.isfinite(b):
            measured[f"bend_norm_{key}"] = b
    hi_fit = fit_range(sw, "QQ_outer", 10.0, 100.0)
    measured["slope_attention_QQ_outer_large_norm"] = hi_fit.slope
    measured["fit_range_small_norm"] = list(SMALL_NORM_RANGE)
    mid, s = local_slopes(sw.x, sw.mean("QQ_outer"))
    measured["max_local_slope_QQ_outer"] = float(s.max())
    note = (
        f"{cfg.describe()}, {len(seeds)} seeds, {sw.x.size} norms in "
        f"[1e-2, 1e2]; slopes fitted per seed on ‖X‖₂ ∈ [{SMALL_NORM_RANGE[0]}, {SMALL_NORM_RANGE[1]}], "
        "95% t-interval over seeds. "
        f"QQ outer {measured['slope_attention_QQ_outer']:.3f}, QQ functional "
        f"{measured['slope_attention_QQ_functional']:.3f}, VV outer "
        f"{measured['slope_attention_VV_outer']:.3f}. "
        "The exponents are asymptotic: the local slope of QQ outer leaves 6 ± 0.5 at ‖X‖₂ ≈ "
        f"{bends['QQ_outer']:.3g} (softmax no longer uniform) and is "
        f"{hi_fit.slope:.2f} over [10, 100], where the attention saturates."
    )
    figs = {
        "xnorm6": figures.loglog_sweep(
            sw, fits, title="Attention Hessian blocks vs ‖X‖₂", reference=XNORM_EXPECTED
        )
    }
    return ClaimResult(
        "xnorm6",
        "For self-attention the W_Q–W_Q outer block grows like ‖X‖₂⁶, the functional "
        "block like ‖X‖₂⁵, and W_V–W_V outer like ‖X‖₂².",
        SOURCES["petrov"],
        measured,
        True if ok else "partly",
        note,
        figs,
        sw.to_arrays(),
    )


PLACEMENTS = ("attention", "none", "post", "pre")


def claim_placement(quick: bool = False) -> ClaimResult:
    from hessviz.experiments import figures

    seeds = (0, 1) if quick else (0, 1, 2, 3, 4)
    grid = _grid(quick)
    measured: dict = {}
    sweeps = {}
    for norm in PLACEMENTS:
        cfg = hv.BlockConfig(seq_len=8, d_model=16, d_k=8, d_ff=32, norm=norm)
        sw = norm_sweep(cfg, grid, seeds, curves=(("W_Q", "W_Q", "outer"), ("W_Q", "W_Q", "full")))
        sweeps[norm] = sw
        small = fit_range(sw, "QQ_outer", *SMALL_NORM_RANGE)
        mid = fit_range(sw, "QQ_outer", 0.3, 3.0)
        measured[f"slope_{norm}_QQ_outer_small"] = small.slope
        measured[f"ci_{norm}_QQ_outer_small"] = list(small.ci)
        measured[f"slope_{norm}_QQ_outer_mid"] = mid.slope
        measured[f"range_log10_{norm}_QQ_outer"] = float(
            np.log10(sw.mean("QQ_outer").max() / sw.mean("QQ_outer").min())
        )
    s = {n: measured[f"slope_{n}_QQ_outer_small"] for n in PLACEMENTS}
    flat_pre = abs(s["pre"]) < 0.1
    between = s["pre"] < s["post"] < s["attention"]
    holds = True if (flat_pre and between) else "partly"
    note = (
        f"W_Q–W_Q outer block, L = 8, d = 16, d_k = 8, d_ff = 32, ReLU, MSE, {len(seeds)} seeds; slopes on "
        f"‖X‖₂ ∈ [0.01, 0.1] (and [0.3, 3]). Attention alone {s['attention']:.2f}, no LN {s['none']:.2f}, "
        f"Post-LN {s['post']:.2f}, Pre-LN {s['pre']:.3f}. Pre-LN is flat over the whole range "
        f"(the attention sees LN(X), which does not depend on ‖X‖); Post-LN lies between: the first "
        "LayerNorm divides by the row scale of X + SA(X) ∝ ‖X‖, removing two powers from the outer term."
    )
    figs = {"placement": figures.placement_sweep(sweeps, "QQ_outer")}
    data = {}
    for n, sw in sweeps.items():
        data.update(sw.to_arrays(prefix=f"{n}_"))
    return ClaimResult(
        "placement",
        "Pre-LN normalises the attention input, so the ‖X‖ growth of the W_Q "
        "curvature disappears; Post-LN sits in between.",
        SOURCES["petrov"] + "; " + SOURCES["ormaniec"],
        measured,
        holds,
        note,
        figs,
        data,
    )


def isotropic_inputs(cfg: hv.BlockConfig, seed: int, input_norm: float):
    """``X = r · U Vᵀ`` with orthonormal ``U (L, d)``, ``V (d, d)``: every singular value equals ``r``.

    Needs ``L >= d``. Holding the whole spectrum of ``X`` fixed (not only ``‖X‖₂``) isolates the
    ``L``-dependence that the bounds attribute to the softmax. The target is as in
    :func:`hessviz.sample_inputs`.
    """
    import torch

    if cfg.seq_len < cfg.d_model:
        raise ValueError(f"isotropic inputs need seq_len >= d_model, got {cfg.seq_len} < {cfg.d_model}")
    gen = torch.Generator().manual_seed(10_000 + seed)
    U, _ = torch.linalg.qr(torch.randn(cfg.seq_len, cfg.d_model, generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(cfg.d_model, cfg.d_model, generator=gen, dtype=torch.float64))
    _, Y = hv.sample_inputs(cfg, seed=seed, input_norm=input_norm)
    return input_norm * U @ V.T, Y


def isotropic_length_sweep(
    cfg: hv.BlockConfig, lengths, input_norm: float = 1.0, seeds=(0, 1, 2), curves=DEFAULT_CURVES
) -> Sweep:
    """As :func:`length_sweep` with :func:`isotropic_inputs` (all singular values of X fixed)."""
    lengths = np.asarray(lengths, dtype=int)
    sw = Sweep(
        "seq_len", lengths.astype(float), tuple(seeds), label=cfg.describe(input_norm) + ", isotropic X"
    )
    vals = {curve_key(c): np.zeros((len(seeds), lengths.size)) for c in curves}
    for j, L in enumerate(lengths):
        c_L = replace(cfg, seq_len=int(L))
        for i, s in enumerate(seeds):
            params = hv.init_params(c_L, seed=s)
            X, Y = isotropic_inputs(c_L, s, input_norm)
            for k, v in _norms(c_L, params, X, Y, curves).items():
                vals[k][i, j] = v
    sw.values = vals
    return sw


SEQLEN_CURVES: tuple[Curve, ...] = (
    ("W_Q", "W_Q", "outer"),
    ("W_Q", "W_Q", "functional"),
    ("W_Q", "W_Q", "full"),
)


def claim_seqlen(quick: bool = False) -> ClaimResult:
    from hessviz.experiments import figures

    cfg = hv.BlockConfig(seq_len=8, d_model=8, d_k=4, norm="attention")
    lengths = (8, 16, 32, 64) if quick else (8, 12, 16, 24, 32, 48, 64)
    seeds = (0, 1) if quick else (0, 1, 2, 3, 4)
    measured: dict = {}
    sweeps = {}
    for r in (1.0, 10.0):
        for design, fn in (("gaussian", length_sweep), ("isotropic", isotropic_length_sweep)):
            sw = fn(cfg, lengths, r, seeds, curves=SEQLEN_CURVES)
            sweeps[f"{design} X, ‖X‖₂ = {r:g}"] = sw
            for key in ("QQ_outer", "QQ_functional", "QQ_full"):
                f = slope_over_seeds(sw.x, sw.values[key])
                measured[f"exponent_{key}_{design}_xnorm{r:g}"] = f.slope
                measured[f"ci_{key}_{design}_xnorm{r:g}"] = list(f.ci)
    e_iso = measured["exponent_QQ_outer_isotropic_xnorm1"]
    e_gau = measured["exponent_QQ_outer_gaussian_xnorm1"]
    if abs(e_iso + 3) < 0.2 and abs(e_gau + 3) < 0.2:
        holds: bool | str = True
    elif e_iso < -2 or e_gau < -2:
        holds = "partly"
    else:
        holds = False
    m = measured
    note = (
        f"Self-attention, d = 8, d_k = 4, L ∈ {list(lengths)}, {len(seeds)} seeds, ‖X‖₂ fixed; exponent = "
        "log–log slope over L, 95% t-interval over seeds. Two input designs with the same ‖X‖₂: Gaussian X "
        "rescaled (its other singular values change with L) and isotropic X (all singular values equal). "
        f"At ‖X‖₂ = 1: outer L^{e_iso:.2f} (isotropic) / L^{e_gau:.2f} (Gaussian); functional "
        f"L^{m['exponent_QQ_functional_isotropic_xnorm1']:.2f} / "
        f"L^{m['exponent_QQ_functional_gaussian_xnorm1']:.2f}; "
        f"full L^{m['exponent_QQ_full_isotropic_xnorm1']:.2f} / "
        f"L^{m['exponent_QQ_full_gaussian_xnorm1']:.2f}. "
        f"At ‖X‖₂ = 10 the outer exponent is {m['exponent_QQ_outer_isotropic_xnorm10']:.2f} / "
        f"{m['exponent_QQ_outer_gaussian_xnorm10']:.2f}. The 1/L³ rests on ‖∂A/∂T‖ ≈ 1/L (uniform attention) "
        "and holds cleanly when the spectrum of X is held fixed; with only ‖X‖₂ fixed the rest of the "
        "spectrum of X grows with L and the decay is slower."
    )
    figs = {"seqlen": figures.length_sweep_figure(sweeps, "QQ_outer")}
    data = {}
    for i, sw in enumerate(sweeps.values()):
        data.update(sw.to_arrays(prefix=f"design{i}_"))
    return ClaimResult(
        "seqlen",
        "At fixed ‖X‖₂ the W_Q curvature of attention decays like 1/L³ in the sequence length.",
        SOURCES["petrov"],
        measured,
        holds,
        note,
        figs,
        data,
    )
