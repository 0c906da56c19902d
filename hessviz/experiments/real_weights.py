r"""The gradient-heterogeneity claim (Tomihari & Sato) re-measured on real weights.

The claim module :mod:`hessviz.experiments.heterogeneity` measures ``G`` (the Gini coefficient
of block gradient norms) and ``Λ_G/Λ_P`` on one small random block. Here the same quantities are
measured on layers of real models, each on its real input (the hidden state of a real text
entering the layer), side by side:

* **all-MiniLM-L6-v2** (Post-LN BERT, trained; the ``models`` extra), layers 0 and 5;
* **pydoc-postln** and **pydoc-preln**, the matched pair trained here (``hessviz/data/models/``),
  layers 0 and 3;
* **random initialisation** of each of these layers (:func:`hessviz.init_params` for the same
  config, on the same real input).

Blocks are those of the paper's code: per layer ``W_Q, W_K, W_V, W_O, W_1, W_2`` and the
LayerNorm weights ``γ, β`` of both LayerNorms (10 blocks per layer; the Gini is over every block
of the selected layers). ``‖g_b‖`` from the closed-form gradient; ``‖H_bb‖₂`` the largest
``|λ|`` of the diagonal block of the full Hessian, by Lanczos on closed-form Hessian-vector
products (scipy ``eigsh``, ``which = "LM"``, no dense matrix). With
``Λ_G = Σ_b ‖g_b‖² ‖H_bb‖₂ / Σ_b ‖g_b‖²`` and ``Λ_P = Σ_b P_b ‖H_bb‖₂ / P``, the optimizer lens
reads ``Λ_G/Λ_P > 1`` as a case where SignSGD's (and Adam's) complexity bound beats SGD's.

The loss is the layer's MSE against a seeded random target (the same synthetic target as the
block claim), on each layer separately: the models' own objectives through the stack come with
the depth work (custom losses). ``python -m hessviz.experiments.real_weights [--out DIR]`` writes
``DIR`` (default ``real_weights/`` in the working directory; the package's stored run is
``hessviz/data/claims/real_weights/``) with the report machinery
(:func:`hessviz.experiments.report.write_report`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import time

import numpy as np
import torch
from scipy.sparse.linalg import eigsh

import hessviz as hv
from hessviz import plots
from hessviz import pretrained as pt
from hessviz.experiments.common import SOURCES, Claim, Measurement, Verdict
from hessviz.experiments.heterogeneity import PAPER_GINI, Heterogeneity, grade_gini_and_lambda
from hessviz.losses import Cosine
from hessviz.pretrained import objectives

BLOCKS = ("W_Q", "W_K", "W_V", "W_O", "W_1", "W_2", "ln1_gamma", "ln1_beta", "ln2_gamma", "ln2_beta")
"""The paper code's blocks of one layer: Q, K, V, O, the FFN and the LayerNorm weights."""
LAYERS = {"all-MiniLM-L6-v2": (0, 5), "pydoc-postln": (0, 3), "pydoc-preln": (0, 3)}
TEXTS = {
    "all-MiniLM-L6-v2": (
        "The old lighthouse keeper climbed the narrow stairs every evening to light the lamp.",
        "A small bakery on the corner sells fresh bread and warm cinnamon rolls each morning.",
        "Scientists measured the temperature of the lake every hour for three summers.",
    ),
    "pydoc-postln": (
        "def add(a, b):\n    return a + b",
        "The for statement is used to iterate over a list.",
        "import sys\nprint(sys.argv)",
    ),
}
TEXTS["pydoc-preln"] = TEXTS["pydoc-postln"]
OWN_OBJECTIVE = {
    "all-MiniLM-L6-v2": dict(
        zip(
            TEXTS["all-MiniLM-L6-v2"],
            (
                "Every night the keeper of the old lighthouse went up the stairs to light its lamp.",
                "Each morning the corner bakery sells warm cinnamon rolls and freshly baked bread.",
                "For three summers researchers recorded the lake's temperature once an hour.",
            ),
        )
    )
}
"""Models with their own objective here, and the other sentence of each text (a paraphrase): MiniLM's
sentence-similarity loss ``1 − cos`` of mean-pooled embeddings, on its last layer (kind ``own``)."""
QUICK_TEXTS = 1
OUT = pathlib.Path("real_weights")
"""The default folder of a run, relative to the working directory (nothing is written into the package)."""


def block_norm(res: hv.HessianResult, name: str, tol: float = 1e-4) -> float:
    """``‖H_bb‖₂``: the largest ``|λ|`` of the diagonal block ``name`` of the full Hessian, by
    Lanczos on closed-form products (exact ``eigvalsh`` of the block when it is small)."""
    op = res.block_operator(name)
    n = op.shape[0]
    if n <= 64:
        H = op.matmat(np.eye(n))
        return float(np.abs(np.linalg.eigvalsh(0.5 * (H + H.T))).max())
    v0 = np.random.default_rng(0).standard_normal(n)
    return float(np.abs(eigsh(op, k=1, which="LM", v0=v0, tol=tol, return_eigenvectors=False)).max())


def layer_heterogeneity(
    cfg: hv.BlockConfig,
    params: dict,
    X: torch.Tensor,
    seed: int,
    prefix: str = "",
    loss: hv.CustomLoss | None = None,
) -> Heterogeneity:
    """Per-block ``‖g_b‖``, ``‖H_bb‖₂`` and sizes of one layer on ``X``: MSE against a seeded random
    target, or the custom ``loss`` when given."""
    Y = None if loss is not None else hv.sample_inputs(cfg, seed=seed)[1]
    grads = hv.gradient(cfg, params, X, Y, wrt=BLOCKS, loss=loss)
    res = hv.hessian(cfg, params, X, Y, loss=loss)
    return Heterogeneity(
        [prefix + b for b in BLOCKS],
        np.array([float(grads[b].norm()) for b in BLOCKS]),
        np.array([block_norm(res, b) for b in BLOCKS]),
        np.array([float(cfg.param_size(b)) for b in BLOCKS]),
    )


def joined(parts: list[Heterogeneity]) -> Heterogeneity:
    """The blocks of several layers as one partition."""

    def cat(field: str) -> np.ndarray:
        return np.concatenate([getattr(p, field) for p in parts])

    names = [n for p in parts for n in p.names]
    return Heterogeneity(names, cat("grad_norms"), cat("hess_norms"), cat("sizes"))


def model_heterogeneity(model: str, text: str, seed: int = 0) -> dict[str, Heterogeneity]:
    """``{"trained": …, "random": …}``: the selected layers of ``model`` on ``text``, with the real
    weights and with the same layers re-drawn by :func:`hessviz.init_params` (seed ``seed``)."""
    stack = pt.load_model(model)
    states = pt.hidden_states(model, text, layers=stack)
    out: dict[str, list] = {"trained": [], "random": []}
    for layer in LAYERS[model]:
        cfg, params = stack[layer]
        cfg = dataclasses.replace(cfg, seq_len=states[layer].shape[0])
        X = states[layer]
        out["trained"].append(layer_heterogeneity(cfg, params, X, seed, f"l{layer}."))
        out["random"].append(layer_heterogeneity(cfg, hv.init_params(cfg, seed=seed), X, seed, f"l{layer}."))
    if model in OWN_OBJECTIVE:  # the model's own objective on its last layer
        last = len(stack) - 1
        cfg, params = stack[last]
        cfg = dataclasses.replace(cfg, seq_len=states[last].shape[0])
        other = objectives.sentence_embedding(model, OWN_OBJECTIVE[model][text])
        loss = Cosine(other).at(states[-1]).custom_loss()
        out["own"] = [layer_heterogeneity(cfg, params, states[last], seed, f"l{last}.", loss)]
    return {k: joined(v) for k, v in out.items()}


def models_here() -> tuple[str, ...]:
    """The models of :data:`LAYERS` available on this machine (MiniLM needs the ``models`` extra)."""
    present = set(pt.available_models())
    return tuple(m for m in LAYERS if m in present)


def measure(quick: bool = False) -> Measurement:
    study = {}
    for model in models_here():
        texts = TEXTS[model][:QUICK_TEXTS] if quick else TEXTS[model]
        study[model] = [model_heterogeneity(model, t, seed=i) for i, t in enumerate(texts)]
    return summarise(study)


def summarise(study: dict[str, list[dict[str, Heterogeneity]]]) -> Measurement:
    """The numbers and arrays of ``{model: [{"trained", "random"} per text]}``."""
    numbers: dict = {
        "paper_gini_post_roberta": PAPER_GINI["post"],
        "paper_gini_pre_roberta": PAPER_GINI["pre"],
    }
    data = {}
    for model, runs in study.items():
        for kind in runs[0]:
            hs = [r[kind] for r in runs]
            key = f"{model}_{kind}"
            numbers[f"gini_{key}"] = float(np.mean([h.gini for h in hs]))
            numbers[f"gini_range_{key}"] = [min(h.gini for h in hs), max(h.gini for h in hs)]
            ratios = [np.log(h.lambda_G / h.lambda_P) for h in hs]
            numbers[f"lambda_G_over_P_{key}"] = float(np.exp(np.mean(ratios)))
            numbers[f"spearman_grad_hess_{key}"] = float(np.nanmean([h.correlation for h in hs]))
            data[f"{key}_grad_norms"] = np.stack([h.grad_norms for h in hs])
            data[f"{key}_hess_norms"] = np.stack([h.hess_norms for h in hs])
        data[f"{model}_block_names"] = np.array(runs[0]["trained"].names)
    if "pydoc-postln" in study and "pydoc-preln" in study:
        diffs = [
            a["trained"].gini - b["trained"].gini for a, b in zip(study["pydoc-postln"], study["pydoc-preln"])
        ]
        numbers["gini_post_minus_pre_trained_pair"] = float(np.mean(diffs))
        numbers["gini_post_minus_pre_trained_pair_range"] = [min(diffs), max(diffs)]
    texts = {m: TEXTS[m][: len(r)] for m, r in study.items()}
    return Measurement(numbers, data, {"study": study, "texts": texts})


def judge(m: dict) -> Verdict:
    trained = [model for model in LAYERS if f"gini_{model}_trained" in m]
    if "gini_post_minus_pre_trained_pair_range" not in m or not trained:
        return Verdict(False, "not measured: the trained pair is missing")
    lo = m["gini_post_minus_pre_trained_pair_range"][0]
    ratios = {t: m[f"lambda_G_over_P_{t}_trained"] for t in trained}
    gini_rule = (
        f"Gini(Post-LN) > Gini(Pre-LN) on the trained pair for every text (smallest difference {lo:+.3f})"
    )
    return grade_gini_and_lambda(lo, gini_rule, ratios, "every trained model")


def report(ms: Measurement, v: Verdict) -> tuple[str, dict]:
    m, study = ms.numbers, ms.detail["study"]
    rows = []
    for model in study:
        rows.append(
            f"{model} (layers {', '.join(map(str, LAYERS[model]))}, {len(study[model])} texts): "
            f"Gini trained {m[f'gini_{model}_trained']:.3f} vs random init "
            f"{m[f'gini_{model}_random']:.3f}, "
            f"Λ_G/Λ_P trained {m[f'lambda_G_over_P_{model}_trained']:.2f} vs random "
            f"{m[f'lambda_G_over_P_{model}_random']:.2f}"
        )
    own = [
        f"With its own objective (1 − cos against a paraphrase, last layer only), {model} gives Gini "
        f"{m[f'gini_{model}_own']:.3f} and Λ_G/Λ_P {m[f'lambda_G_over_P_{model}_own']:.2f}. "
        for model in study
        if f"gini_{model}_own" in m
    ]
    note = (
        "Real layers on real text, each layer's MSE against a seeded random target (N(0, 1)), "
        f"{len(BLOCKS)} blocks per layer (Q, K, V, O, W_1, W_2, LayerNorm γ and β). " + "; ".join(rows) + ". "
        f"RoBERTa's reported Ginis ({PAPER_GINI['post']} Post-LN, {PAPER_GINI['pre']} Pre-LN) are over "
        "all of its parameter tensors with its fine-tuning loss; here 20 blocks of two layers under a "
        "synthetic loss, so only orderings (trained vs random, Post vs Pre) compare, not the absolute "
        "values. "
        + "".join(own)
        + "The optimizer lens is Λ_G/Λ_P alone: no optimizer is trained on these weights."
    )
    cats = [f"{model} {kind}" for model in study for kind in study[model][0]]
    ginis = [m[f"gini_{c.replace(' ', '_')}"] for c in cats]
    ranges = [m[f"gini_range_{c.replace(' ', '_')}"] for c in cats]
    figs = {
        "real_weights_gini": plots.grouped_bars(
            cats,
            {"Gini": ginis},
            errors={"Gini": [hi - g for g, (_, hi) in zip(ginis, ranges)]},
            title="Gini of block gradient norms on real layers (bar: mean over texts, whisker: largest)",
            ylabel="Gini",
        ),
        "real_weights_lambda": plots.grouped_bars(
            cats,
            {"Λ_G/Λ_P": [m[f"lambda_G_over_P_{c.replace(' ', '_')}"] for c in cats]},
            title="Λ_G/Λ_P on real layers (> 1: the SignSGD/Adam bound beats SGD's)",
            ylabel="Λ_G/Λ_P",
            logy=True,
        ),
    }
    return note, figs


REAL_GINI = Claim(
    "gini_real",
    "Post-LN amplifies gradient heterogeneity (Gini 0.941 vs 0.880 for Pre-LN on RoBERTa), and gradient "
    "and Hessian block norms are correlated so that Λ_G > Λ_P: re-measured on real weights.",
    SOURCES["tomihari"],
    measure,
    judge,
    report,
)


def main(quick: bool = False, out: pathlib.Path = OUT, figures: bool = True) -> list[dict]:
    from hessviz.experiments.report import write_report

    torch.set_num_threads(2)
    start = time.perf_counter()
    result = REAL_GINI.run(quick)
    result.seconds = time.perf_counter() - start
    return write_report(
        [result],
        out,
        quick,
        result.seconds,
        title="hessviz: the gradient-heterogeneity claim on real weights",
        command="python -m hessviz.experiments.real_weights",
        figures=figures,
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    out = pathlib.Path(args[args.index("--out") + 1]) if "--out" in args else OUT
    for entry in main(quick="--quick" in args, out=out, figures="--no-figures" not in args):
        print(entry["id"], entry["holds"], entry["note"])
