r"""Claim ``depth``: how the curvature of the first layer's attention changes as blocks are stacked.

Stacks of ``N = 1 … 4`` blocks of one shape (``L = 8``, ``d = 16``, ``d_k = 8``, ``d_ff = 32``,
ReLU, MSE on the last ``Z``), Post-LN and Pre-LN, several seeds; the input has unit-variance
entries, as a hidden state does. For each stack the spectral norms of the first layer's
``W_Q–W_Q`` and ``W_V–W_V`` blocks (outer, functional, full) are computed exactly, the
curvature that reaches layer 0 through every later block included.

A geometric law ``‖H(N)‖ ≈ c · r^N`` is fitted per seed (least squares of ``ln ‖H‖`` on
``N``); ``r`` is the factor one more block multiplies the first layer's curvature by.

What the papers imply. They analyse one block, not stacks; the claim here follows their
argument. Tomihari & Sato trace gradient heterogeneity to the LayerNorm Jacobian: in Post-LN
every path from the loss back to layer 0 passes the Jacobians of both LayerNorms of every
later block, so each added block multiplies what reaches layer 0 (a geometric law, ``r``
far from 1); in Pre-LN the identity path bypasses them, so depth changes the first layer's
curvature far less (``r`` near 1). Ormaniec et al. likewise expect Pre-LN to tame the
data dependence of the attention Hessian.

The verdict compares ``|ln r|`` of the two placements for the ``W_Q–W_Q`` outer and full
blocks. A second view, the profile ``‖H[l_i.W_Q, l_i.W_Q]‖`` over the layers ``i`` of the
deepest stack, shows where in the stack the curvature sits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import hessviz as hv
from hessviz import plots
from hessviz.experiments.common import SOURCES, Claim, Measurement, Verdict, grade, unit_entry_norm
from hessviz.laws.fitting import t_interval
from hessviz.laws.sweeps import Sweep, block_norms_measure, in_layer, seeded_inputs, sweep
from hessviz.matfree.spectra import matrix_norm
from hessviz.ops import layernorm

PLACEMENTS = ("post", "pre", "peri")
CURVES = (
    ("W_Q", "W_Q", "outer"),
    ("W_Q", "W_Q", "functional"),
    ("W_Q", "W_Q", "full"),
    ("W_V", "W_V", "outer"),
    ("W_V", "W_V", "full"),
)
JUDGED = ("QQ_outer", "QQ_full")
STAT = "geomean"


def base_config(norm: str, n_layers: int = 1) -> hv.BlockConfig:
    """The block of the claim (as the ``placement`` claim's), stacked ``n_layers`` deep."""
    return hv.BlockConfig(seq_len=8, d_model=16, d_k=8, d_ff=32, norm=norm, n_layers=n_layers)


def factor_per_layer(depths, Y) -> tuple[float, float, float]:
    """``(r, lo, hi)``: ``exp`` of the mean over seeds of the slope of ``ln ‖H‖`` on ``N``
    (rows of ``Y (seeds, depths)``), with its 95 % t-interval.

    >>> round(factor_per_layer([1, 2, 3], [[1.0, 2.0, 4.0], [3.0, 6.0, 12.0]])[0], 12)
    2.0
    """
    Y = np.atleast_2d(np.asarray(Y, dtype=float))
    slopes = [np.polyfit(np.asarray(depths, dtype=float), np.log(row), 1)[0] for row in Y]
    m, lo, hi = t_interval(slopes)
    return float(np.exp(m)), float(np.exp(lo)), float(np.exp(hi))


def diagonal_share(norms) -> float:
    """``Σ_i ‖H[θ_i, θ_i]‖² / Σ_ij ‖H[θ_i, θ_j]‖²`` of a layer-by-layer matrix of block norms
    ``(N, N)``: 1 when the stack's Hessian is block-diagonal across layers.

    >>> diagonal_share([[3.0, 0.0], [0.0, 4.0]]), round(diagonal_share([[1.0, 1.0], [1.0, 1.0]]), 12)
    (1.0, 0.5)
    """
    norms = np.asarray(norms, dtype=float)
    return float(np.sum(np.diag(norms) ** 2)) / float(np.sum(norms**2))


def layer_profile(norm: str, n_layers: int, seeds, term: str = "full") -> np.ndarray:
    """``(seeds, n_layers)``: ``‖H[l_i.W_Q, l_i.W_Q]‖₂`` of ``term`` for every layer ``i`` of one stack."""
    cfg = base_config(norm, n_layers)
    names = [in_layer(cfg, "W_Q", i) for i in range(n_layers)]
    out = np.empty((len(seeds), n_layers))
    for j, s in enumerate(seeds):
        res = hv.hessian(cfg, *seeded_inputs(cfg, s, unit_entry_norm(cfg)), wrt=names)  # one forward pass
        out[j] = [matrix_norm(res.block(n, n, term)) for n in names]
    return out


def output_rms(norm: str, n_layers: int, seeds) -> float:
    """Root mean square of the stack's output ``Z`` (geometric mean over seeds): the scale the loss sees."""
    cfg = base_config(norm, n_layers)
    rms = []
    for s in seeds:
        params, X, _ = seeded_inputs(cfg, s, unit_entry_norm(cfg))
        rms.append(float(hv.forward(cfg, params, X).square().mean().sqrt()))
    return float(np.exp(np.mean(np.log(rms))))


def attention_scale(norm: str, n_layers: int, seeds) -> list[float]:
    """``σ`` of each layer's attention output rows, ``SA_i = SA(ln1(Z_{i−1}))`` (mean row standard
    deviation, geometric mean over seeds): the scale Peri-LN's ``ln1_out`` divides out, its Jacobian
    ``(Π − y yᵀ/n)/σ``."""
    cfg = base_config(norm, n_layers)
    attention = hv.BlockConfig(seq_len=8, d_model=16, d_k=8, d_ff=32, norm="attention")
    out = np.empty((len(seeds), n_layers))
    for j, s in enumerate(seeds):
        params, Z, _ = seeded_inputs(cfg, s, unit_entry_norm(cfg))
        for i in range(n_layers):
            weights = {n: params[in_layer(cfg, n, i)] for n in cfg.block.param_names}
            sa = hv.forward(
                attention, {n: weights[n] for n in attention.param_names}, layernorm.value(Z, 0.0)[0]
            )
            out[j, i] = float(sa.std(-1, correction=0).mean())
            Z = hv.forward(cfg.block, weights, Z)
    return np.exp(np.log(out).mean(axis=0)).tolist()


def measure(quick: bool = False) -> Measurement:
    depths = (1, 2, 3) if quick else (1, 2, 3, 4)
    seeds = (0, 1) if quick else (0, 1, 2)
    measured: dict = {}
    sweeps: dict[str, Sweep] = {}
    profiles: dict[str, np.ndarray] = {}
    for norm in PLACEMENTS:
        cfg = base_config(norm)
        sw = sweep(
            cfg,
            "layers",
            depths,
            seeds,
            block_norms_measure(CURVES, layer=0),
            input_norm=unit_entry_norm(cfg),
            label=norm,
        )
        sweeps[norm] = sw
        for key in sw.values:
            r, lo, hi = factor_per_layer(sw.grid, sw.values[key])
            measured[f"factor_{norm}_{key}"] = r
            measured[f"ci_{norm}_{key}"] = [lo, hi]
        profiles[norm] = layer_profile(norm, depths[-1], seeds)
        measured[f"rms_Z_{norm}"] = [output_rms(norm, n, seeds) for n in depths]
        measured[f"profile_{norm}_QQ_full"] = np.exp(np.log(profiles[norm]).mean(axis=0))
        if norm == "peri":
            measured["sigma_SA_peri"] = attention_scale(norm, depths[-1], seeds)
    data = {f"{n}_{k}": v for n, sw in sweeps.items() for k, v in sw.to_arrays().items()}
    data.update({f"profile_{n}_QQ_full": p for n, p in profiles.items()})
    return Measurement(
        measured, data, {"sweeps": sweeps, "profiles": profiles, "depths": depths, "seeds": seeds}
    )


def judge(m: dict) -> Verdict:
    calmer = {k: abs(np.log(m[f"factor_pre_{k}"])) < abs(np.log(m[f"factor_post_{k}"])) for k in JUDGED}
    words = ", ".join(
        f"{k}: Pre-LN r = {m[f'factor_pre_{k}']:.3g} vs Post-LN r = {m[f'factor_post_{k}']:.3g}"
        for k in JUDGED
    )
    rule = (
        "holds when one more block changes the first layer's W_Q–W_Q curvature by less in Pre-LN than "
        f"in Post-LN (|ln r_pre| < |ln r_post|) for both the outer and the full block ({words}); "
        "partly when for one of them"
    )
    return grade(all(calmer.values()), any(calmer.values()), rule)


def report(ms: Measurement, v: Verdict) -> tuple[str, dict]:
    m, d = ms.numbers, ms.detail

    def r(norm: str, key: str) -> str:
        lo, hi = m[f"ci_{norm}_{key}"]
        return f"{m[f'factor_{norm}_{key}']:.3g} [{lo:.3g}, {hi:.3g}]"

    note = (
        f"Stacks of N ∈ {list(d['depths'])} blocks (L = 8, d = 16, d_k = 8, d_ff = 32, ReLU, MSE on the "
        f"last Z, unit-variance inputs), {len(d['seeds'])} seeds; exact block norms of the first layer, "
        "every later block's token-coupling curvature included. Factor per added block r (geometric fit, "
        f"95% interval): W_Q–W_Q outer Post-LN {r('post', 'QQ_outer')}, Pre-LN {r('pre', 'QQ_outer')}; "
        f"full Post-LN {r('post', 'QQ_full')}, Pre-LN {r('pre', 'QQ_full')}; W_V–W_V outer Post-LN "
        f"{r('post', 'VV_outer')}, Pre-LN {r('pre', 'VV_outer')}. Layer profile of the "
        f"{d['depths'][-1]}-block stack (W_Q–W_Q full, geometric mean over seeds, layer 0 first): Post-LN "
        + ", ".join(f"{x:.3g}" for x in m["profile_post_QQ_full"])
        + "; Pre-LN "
        + ", ".join(f"{x:.3g}" for x in m["profile_pre_QQ_full"])
        + ". RMS of the output Z over N: Post-LN "
        + ", ".join(f"{x:.3g}" for x in m["rms_Z_post"])
        + "; Pre-LN "
        + ", ".join(f"{x:.3g}" for x in m["rms_Z_pre"])
        + ". "
        "The papers state no depth law; this claim follows their LayerNorm-Jacobian argument "
        "(module docstring of hessviz.experiments.depth). "
        + (WHY_CALMER if v.holds is True else WHY_NOT)
        + (" " + peri_note(m, r) if "factor_peri_QQ_outer" in m else "")
    )
    sweeps = d["sweeps"]
    figs = {
        "depth": plots.compare_plot(
            sweeps,
            "QQ_outer",
            stat=STAT,
            logx=False,
            x_title="stack depth N (blocks)",
            y_title="‖H[l0.W_Q, l0.W_Q]‖₂ (outer)",
            title="First layer's W_Q–W_Q outer block vs depth",
        ),
        "depth_profile": plots.band_plot(
            np.arange(d["depths"][-1]),
            d["profiles"],
            stat=STAT,
            logx=False,
            x_title="layer i",
            y_title="‖H[l_i.W_Q, l_i.W_Q]‖₂ (full)",
            names={n: plots.placement_name(n) for n in d["profiles"]},
            title=f"W_Q–W_Q curvature by layer, {d['depths'][-1]}-block stack",
        ),
    }
    for fig in figs.values():
        fig.update_xaxes(dtick=1)
    return note, figs


def peri_note(m: dict, r: Callable[[str, str], str]) -> str:
    """The Peri-LN rows of the note: the measured factors, the RMS of ``Z`` against ``√(1 + 2N)`` and the
    layer profile, with the chain-of-Jacobians reading of each (which way each comparison goes is read
    from the numbers, never assumed)."""
    rms, depths = m["rms_Z_peri"], range(1, len(m["rms_Z_peri"]) + 1)
    order = sorted(PLACEMENTS, key=lambda n: m[f"factor_{n}_QQ_outer"])
    names = {"post": "Post-LN", "pre": "Pre-LN", "peri": "Peri-LN"}
    profile, sigma = m["profile_peri_QQ_full"], m["sigma_SA_peri"]
    return (
        f"Peri-LN (a LayerNorm before and after each sublayer): W_Q–W_Q outer r = {r('peri', 'QQ_outer')}, "
        f"full {r('peri', 'QQ_full')}, W_V–W_V outer {r('peri', 'VV_outer')}; ordered by the outer r: "
        + " < ".join(f"{names[n]} {m[f'factor_{n}_QQ_outer']:.3g}" for n in order)
        + ". The RMS of Z over N is "
        + ", ".join(f"{x:.3g}" for x in rms)
        + " against √(1 + 2N) = "
        + ", ".join(f"{np.sqrt(1 + 2 * n):.3g}" for n in depths)
        + ": each of the 2N output norms adds rows of mean 0 and variance 1 to a unit-variance input, "
        "nearly uncorrelated at initialisation. By the chain rule ∂Z_N/∂θ_0 = Π_k (I + B_k) · ∂Z_1/∂θ_0, "
        "and each later branch's Jacobian B_k = J_ln_out J_sublayer J_ln passes an output norm whose "
        "1/σ restores the branch to unit rows however small the sublayer's output is, so the paths a "
        "block adds to layer 0 keep unit order where Pre-LN's keep the sublayer's own scale. Layer "
        "profile (W_Q–W_Q full, layer 0 first): "
        + ", ".join(f"{x:.3g}" for x in profile)
        + ". Layer 0's ln1_out divides by σ of SA(ln1(X)), whose rows near-uniform attention averages "
        "over independent tokens; σ of each layer's SA rows is "
        + ", ".join(f"{x:.3g}" for x in sigma)
        + f", so the 1/σ² of ln1_out's Jacobian alone makes layer 0 {(sigma[1] / sigma[0]) ** 2:.2g}× "
        f"layer 1 (measured {profile[0] / profile[1]:.2g}×); the rest is the extra block layer 0's paths "
        f"cross (r above)."
    )


WHY_CALMER = (
    "As that argument implies, Pre-LN's identity path keeps the first layer's curvature "
    "nearly unchanged as blocks are added, while each Post-LN block rescales it."
)
WHY_NOT = (
    "What the argument leaves out: the stack has no final LayerNorm (the loss is on the last Z, as "
    "MODEL.md fixes), so in Pre-LN every block adds its branch to the residual stream undiminished: "
    "the RMS of Z grows with depth (above), and with it the paths from layer 0 to Z and the first "
    "layer's curvature. Post-LN's LayerNorms rescale every block's output to unit row variance (RMS "
    "of Z stays 1), which keeps the first layer's curvature closer to flat."
)


DEPTH = Claim(
    "depth",
    "Stacking blocks changes the curvature of the first layer's attention geometrically in Post-LN, "
    "where every later block's LayerNorm Jacobians lie on each path to the loss, and much less in "
    "Pre-LN, whose identity path bypasses them.",
    SOURCES["tomihari"] + "; " + SOURCES["ormaniec"],
    measure,
    judge,
    report,
)
