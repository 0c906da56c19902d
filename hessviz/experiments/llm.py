r"""Two papers' claims on a real LLM, generic in the model's name: SmolLM2-135M (Pre-RMSNorm) and
Gemma 3 270M (Peri-RMSNorm, the sandwich).

* ``sharpness_metrics_<short>`` (Wang et al., ICML 2025): ``S(Emb) ≪ S(QK) < S(FFN) < S(VO) ≪ S(Norm)``,
  under each of four metrics, each with its own verdict: the paper's (the GNB estimate of the
  Gauss–Newton trace over size, labels drawn from the model, Emb over both copies of the tied matrix),
  hessviz's exact counterparts (``tr(H_TT)/m_T`` for the ``outer`` and the ``full`` term, from the
  closed-form products; Emb the unembedding copy) and the mean top eigenvalue per type (the stored
  per-tensor table where there is one). The numbers come from
  :mod:`hessviz.experiments.sharpness`, computed once and stored (``sharpness.json`` in the model's
  folder of ``hessviz/data/claims``).
* ``gini_interval_<short>`` (Tomihari & Sato): the Gini of the 22 gradient norms at the protocol of
  :mod:`hessviz.experiments.gini_protocol`, per batch (stored ``gini_gradients.json``), with a 95 %
  Student-t interval over batches, beside the pydoc pair (Post and Pre) and MiniLM (Post) from the
  committed ``gini_protocol`` arrays, each with its interval.

``hessviz reproduce --gemma3`` (:func:`main`) writes ``hessviz/data/claims/gemma3``'s report from
the stored numbers; ``hessviz reproduce --smollm2`` adds these two claims to SmolLM2's three.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from hessviz import plots
from hessviz.experiments.common import SOURCES, Claim, Measurement, Verdict, grade
from hessviz.experiments.llm_table import short
from hessviz.experiments.sharpness import ORDER, stored
from hessviz.laws.fitting import gini, t_interval
from hessviz.resources import data

PLACEMENT = {"smollm2-135m": "Pre-RMSNorm", "gemma3-270m": "Peri-RMSNorm"}
WANG = (
    "Wang, Wang, Zhou, Yan, E, Wu, 'The Sharpness Disparity Principle in Transformers for Accelerating "
    "Language Model Pre-Training', arXiv:2502.19002 (ICML 2025)"
)
METRICS = ("gnb", "outer", "full", "top")
METRIC_WORDS = {
    "gnb": "the paper's: GNB estimate of tr(G_TT)/m_T (labels drawn from the model; Emb both copies)",
    "outer": "exact products: tr(H_outer,TT)/m_T (Hutchinson; Emb the unembedding copy, closed form)",
    "full": "exact products: tr(H_TT)/m_T (Hutchinson; Emb the unembedding copy, closed form)",
    "top": "mean top eigenvalue per type (stored per-tensor table; Emb the unembedding's, on the batch)",
}
COMMITTED = data("claims", "data", "gini_protocol.npz")
GINI_BESIDE = {"pydoc-postln": "Post-LN", "pydoc-preln": "Pre-LN", "all-MiniLM-L6-v2": "Post-LN"}


def sharpness_id(model: str) -> str:
    """The id of :func:`sharpness_claim` on ``model``.

    >>> sharpness_id("smollm2-135m")
    'sharpness_metrics_smollm2'
    """
    return f"sharpness_metrics_{short(model)}"


def gini_id(model: str) -> str:
    """The id of :func:`gini_claim` on ``model``.

    >>> gini_id("gemma3-270m")
    'gini_interval_gemma3'
    """
    return f"gini_interval_{short(model)}"


def reproduce_command(model: str) -> str:
    """The command that writes ``model``'s claims (:func:`main`).

    >>> reproduce_command("smollm2-135m")
    'hessviz reproduce --smollm2'
    """
    return f"hessviz reproduce --{short(model)}"


def _read(path: pathlib.Path, how: str) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (pending): {how}")
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- Wang et al.
def metric_means(model: str) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]], dict]:
    """``(S, stderr, stored run)``: ``S[metric][type]`` and its standard error (over GNB draws or
    Hutchinson probes; 0 where exact) for each of :data:`METRICS` present."""
    run = _read(
        stored(model) / "sharpness.json", f"python -m hessviz.experiments.sharpness --model {model} --out it"
    )
    S, se = {}, {}
    for metric, values in (
        ("gnb", {t: v for t, v in run["gnb"].items() if t in ORDER}),
        ("outer", run["exact"]["outer"]),
        ("full", run["exact"]["full"]),
    ):
        S[metric] = {t: float(np.mean(v)) for t, v in values.items()}
        se[metric] = {
            t: float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0 for t, v in values.items()
        }
    for metric in ("outer", "full"):
        S[metric]["Emb"], se[metric]["Emb"] = run["exact"]["emb_out_trace_over_size"], 0.0
    table = stored(model) / "table.json"
    if table.is_file():
        from hessviz.experiments.tensor_types import type_means, weight_rows

        t = json.loads(table.read_text())
        S["top"] = {
            "Emb": run["exact"]["emb_out_top"],
            **type_means({n: r["top"] for n, r in weight_rows(t).items()}),
        }
        se["top"] = dict.fromkeys(S["top"], 0.0)
        run["table_tokens"] = t["tokens"]
    return S, se, run


def relations(S: dict[str, float]) -> list[bool]:
    """Each adjacent relation of :data:`ORDER` (``S(a) < S(b)``) among the types present.

    >>> relations({"Emb": 1, "QK": 2, "FFN": 3, "VO": 2.5, "Norm": 9})
    [True, True, False, True]
    """
    present = [t for t in ORDER if t in S]
    return [S[a] < S[b] for a, b in zip(present, present[1:])]


def sharpness_claim(model: str) -> Claim:
    """The Wang et al. claim on ``model`` (module docstring)."""

    def measure(quick: bool = False) -> Measurement:
        S, se, run = metric_means(model)
        m = {}
        for metric, means in S.items():
            for t in ORDER:
                if t in means:
                    m[f"S_{t}_{metric}"] = means[t]
                    m[f"S_{t}_{metric}_stderr"] = se[metric][t]
            m[f"relations_holding_{metric}"] = sum(relations(means))
            m[f"ratio_QK_over_Emb_{metric}"] = means["QK"] / means["Emb"]
            m[f"ratio_Norm_over_VO_{metric}"] = means["Norm"] / means["VO"]
        if "Emb_out" in run["gnb"]:  # the estimator against the closed form on the same block
            v = np.array(run["gnb"]["Emb_out"])
            m["S_Emb_out_gnb"], m["S_Emb_out_exact"] = (
                float(v.mean()),
                run["exact"]["emb_out_trace_over_size"],
            )
            m["S_Emb_out_gnb_stderr"] = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else 0.0
        m["seconds_stored_run"] = run["seconds"]
        m["tokens"] = float(np.size(run["ids"]))
        arrays = {f"{metric}_S": np.array([S[metric].get(t, np.nan) for t in ORDER]) for metric in S}
        return Measurement(m, arrays, {"S": S, "se": se, "run": run})

    def judge(m: dict) -> Verdict:
        got = {k: m[f"relations_holding_{k}"] for k in METRICS if f"relations_holding_{k}" in m}
        rule = (
            "holds when all four relations S(Emb) < S(QK) < S(FFN) < S(VO) < S(Norm) hold under the paper's "
            "own metric (GNB) and under hessviz's exact full-Hessian trace; partly when they hold under one "
            "of them or when at least three of four hold under the paper's. Relations holding: "
            + ", ".join(f"{k} {v:.0f}/4" for k, v in got.items())
        )
        ok = [got.get("gnb") == 4, got.get("full") == 4]
        return grade(all(ok), any(ok) or got.get("gnb", 0) >= 3, rule)

    def report(ms: Measurement, v: Verdict) -> tuple[str, dict]:
        S, se, run, m = ms.detail["S"], ms.detail["se"], ms.detail["run"], ms.numbers
        rows = []
        for metric, means in S.items():
            rel = relations(means)
            verdict = "holds" if all(rel) else ("partly" if sum(rel) >= 2 else "does not hold")
            order = " < ".join(sorted(means, key=means.get))
            rows.append(
                f"{METRIC_WORDS[metric]}: "
                + ", ".join(f"S({t}) = {means[t]:.3g} ± {se[metric][t]:.1g}" for t in ORDER if t in means)
                + f"; measured order {order}; {sum(rel)}/4 relations: **{verdict}**"
            )
        B, L = np.shape(run["ids"])
        table = (
            " The top-eigenvalue metric reads the stored per-tensor table "
            f"(1 × {run['table_tokens']} tokens, Lanczos to about 1 %)."
            if "top" in S
            else " No per-tensor table is stored for this model: the top-eigenvalue metric is pending."
        )
        note = (
            f"{model} ({PLACEMENT.get(model, '?')}), float32 weights dequantized from its GGUF file, its own "
            f"next-token loss on a batch of {B} sequences × {L} tokens (the openings of "
            + "; ".join(run["texts"])
            + f"). {run['draws']} GNB label draws, {run['probes']} Rademacher probes per type and term. "
            "Types: QK = W_Q, W_K; VO = W_V, W_O; FFN = W_G, W_1, W_2; Norm = every norm weight in the "
            "layers; Emb = the tied embedding matrix. "
            + " ".join(f"({i + 1}) {r}." for i, r in enumerate(rows))
            + table
            + (
                f" The estimator checked on the model itself: GNB on the unembedding copy alone "
                f"{m['S_Emb_out_gnb']:.3g} ± {m['S_Emb_out_gnb_stderr']:.1g} against its closed form "
                f"{m['S_Emb_out_exact']:.3g} (the same block, exact: its expectation)."
                if "S_Emb_out_gnb" in m
                else ""
            )
            + " The paper's estimator as assumed here (its text was not at hand): Sophia's Gauss–Newton–"
            "Bartlett, N·ĝ⊙ĝ with ĝ the mean cross-entropy's gradient against labels drawn from the model, "
            "summed over a type and divided by its size. Differences from the paper: a trained checkpoint "
            "instead of the pre-training trajectory, one small batch instead of many, a 4-bit file; the "
            "exact metrics miss the input copy of the tied matrix (hessviz has no products in the input X), "
            "and 'outer' is split at the last layer's output (the final norm's curvature inside), not at the "
            f"logits. The stored run took {run['seconds'] / 60:.0f} min (load average "
            f"{run['load_average_start'][0]:.0f} at the start, on 2 shared cores)."
        )
        figs = {
            sharpness_id(model): plots.grouped_bars(
                list(ORDER),
                {k: [S[k].get(t, np.nan) for t in ORDER] for k in S},
                title=f"{model}: S per block type, each metric (Wang et al.: Emb ≪ QK < FFN < VO ≪ Norm)",
                ylabel="S",
                logy=True,
            )
        }
        return note, figs

    return Claim(
        sharpness_id(model),
        f"On {model}, the block types' sharpness is ordered S(Emb) ≪ S(QK) < S(FFN) < S(VO) ≪ S(Norm), "
        "S the average sharpness tr(H_TT)/m_T of a type (Gauss–Newton, GNB-estimated in the paper).",
        WANG,
        measure,
        judge,
        report,
    )


# ----------------------------------------------------------------------------- Tomihari & Sato
def committed_batches() -> dict[str, np.ndarray]:
    """``{model: Gini of each committed batch}`` of the ``gini_protocol`` claim (pydoc pair, MiniLM)."""
    if not COMMITTED.is_file():
        return {}
    d = np.load(COMMITTED)
    return {m: np.array([gini(g) for g in d[f"{m}_grad"]]) for m in GINI_BESIDE if f"{m}_grad" in d}


def gini_claim(model: str) -> Claim:
    """The Tomihari & Sato claim on ``model`` (module docstring)."""

    def measure(quick: bool = False) -> Measurement:
        got = _read(
            stored(model) / "gini_gradients.json",
            f"hessviz.experiments.smollm2.gini_gradients(plan, source={model!r})",
        )
        grads = np.array([got["grads"][k] for k in sorted(got["grads"])])
        per = {model: np.array([gini(g) for g in grads]), **committed_batches()}
        m = {}
        for s, g in per.items():
            mean, lo, hi = t_interval(g)
            m[f"gini_{s}"], m[f"gini_ci_{s}"], m[f"batches_{s}"] = mean, [lo, hi], len(g)
        m[f"seconds_per_batch_{model}"] = float(np.mean(list(got["seconds"].values())))
        return Measurement(m, {"grad": grads, "gini": per[model]}, {"per": per})

    def judge(m: dict) -> Verdict:
        post = [s for s, p in GINI_BESIDE.items() if p == "Post-LN" and f"gini_{s}" in m]
        hi = m[f"gini_ci_{model}"][1]
        below_ci = [s for s in post if hi < m[f"gini_ci_{s}"][0]]
        below = [s for s in post if m[f"gini_{model}"] < m[f"gini_{s}"]]
        rule = (
            f"holds when {model}'s ({PLACEMENT.get(model, '?')}) 95 % interval lies below every Post-LN "
            "model's interval at the same protocol ("
            + ", ".join(f"{s} [{m[f'gini_ci_{s}'][0]:.3f}, {m[f'gini_ci_{s}'][1]:.3f}]" for s in post)
            + f"; {model} [{m[f'gini_ci_{model}'][0]:.3f}, {hi:.3f}]); partly when its mean is below some"
        )
        return grade(bool(post) and len(below_ci) == len(post), bool(below), rule)

    def report(ms: Measurement, v: Verdict) -> tuple[str, dict]:
        m, per = ms.numbers, ms.detail["per"]
        rows = "; ".join(
            f"{s} ({PLACEMENT.get(s) or GINI_BESIDE.get(s)}): {m[f'gini_{s}']:.3f} "
            f"[{m[f'gini_ci_{s}'][0]:.3f}, {m[f'gini_ci_{s}'][1]:.3f}] over {m[f'batches_{s}']:.0f} batches"
            for s in per
        )
        note = (
            "Tomihari & Sato's protocol (hessviz.experiments.gini_protocol: layers first, middle and last × "
            "{ln1_gamma, W_Q, W_K, W_V, W_1, ln2_gamma, W_2} and a fresh linear head N(0, 0.02²) on the last "
            "token after the final norm, cross-entropy on the docstring task, batches of 4 × 24 tokens), the "
            "Gini of the 22 gradient norms per batch, mean and 95 % Student-t interval over batches: "
            + rows
            + f". {model}: {m[f'seconds_per_batch_{model}']:.0f} s a batch (float64, 2 threads, shared "
            "cores). "
            "The paper: 0.941 (RoBERTa, Post-LN) vs 0.880 (Pre-LN); it has no Peri-LN model. A Peri-LN "
            "model's ln1_gamma/ln2_gamma are its input norms (the output norms are not among the 22). "
            "Differences: models of different size, data and training; few batches, so wide intervals."
        )
        figs = {
            gini_id(model): plots.grouped_bars(
                list(per),
                {"Gini": [m[f"gini_{s}"] for s in per]},
                errors={"Gini": [(m[f"gini_ci_{s}"][1] - m[f"gini_ci_{s}"][0]) / 2 for s in per]},
                title="Gini of the 22 gradient norms (error bar: half the 95 % interval over batches)",
                ylabel="Gini",
            )
        }
        return note, figs

    return Claim(
        gini_id(model),
        "Post-LN amplifies gradient heterogeneity (Gini 0.941 vs 0.880 for Pre-LN on RoBERTa): "
        f"{model} ({PLACEMENT.get(model, '?')}) should sit below the Post-LN models at the same protocol.",
        SOURCES["tomihari"] + " (protocol of the tom4649/gradient-heterogeneity code)",
        measure,
        judge,
        report,
    )


def claims(model: str) -> tuple[Claim, ...]:
    """The two claims on ``model``."""
    return sharpness_claim(model), gini_claim(model)


def main(model: str, out: pathlib.Path, quick: bool = False, figures: bool = True) -> list[dict]:
    """Run :func:`claims` of ``model`` from its stored numbers; write ``out`` (claims.json, report.md, …;
    figures unless ``figures=False``).
    A claim whose stored numbers are missing is left out and named in the log (pending)."""
    from hessviz.experiments.report import run_and_write

    return run_and_write(
        claims(model),
        out,
        quick,
        figures=figures,
        title=f"hessviz: two papers' claims on {model}, a real LLM",
        command=reproduce_command(model),
        basis="Every number comes from hessviz's closed-form gradients and Hessian products on CPU, "
        "float32 weights dequantized from the model's 4-bit GGUF file (the Gini in float64).",
    )
