r"""Claim ``gini_protocol``: Tomihari & Sato's gradient heterogeneity, at their protocol.

Their code (tom4649/gradient-heterogeneity) takes ``roberta-base`` with a fresh linear
classification head, cross-entropy on a GLUE task (128 tokens, batches of 32), and, before
fine-tuning (mode ``pretrained``), for every batch and for 22 weight tensors records the top
eigenvalue of each tensor's diagonal Hessian block (PyHessian's power iteration) and the L2 norm
of its gradient: layers 0, 6 and 11 × {attention-output LayerNorm weight, query, key, value,
intermediate dense, output LayerNorm weight, output dense}, plus the classifier weight. From them,
with ``x_b = ‖g_b‖`` and ``λ_b`` the top eigenvalue of ``H_bb``,

.. math::
    G = \frac{\sum_i \sum_j |x_i - x_j|}{2 n^2 \bar x},\qquad
    Λ_G = \frac{\sum_b ‖g_b‖^2 λ_b}{\sum_b ‖g_b‖^2},\qquad
    Λ_P = \frac{\sum_b P_b λ_b}{\sum_b P_b}.

Here, the same on the bundled models and :mod:`hessviz.experiments.docstring_task`:

* **the tensors**: first, middle and last layer (``0, n // 2, n − 1``: 0, 2, 3 for the four-layer
  pydoc models, 0, 3, 5 for MiniLM; RoBERTa's 0, 6, 11) × :data:`WEIGHTS`, the paper's seven in
  hessviz's names: ``ln1_gamma`` (Post-LN: the LayerNorm after attention, RoBERTa's
  ``attention.output.LayerNorm``; Pre-LN and Llama: the norm before attention), ``W_Q``, ``W_K``,
  ``W_V``, ``W_1`` (``intermediate.dense``; Llama's up projection, its gate ``W_G`` left out),
  ``ln2_gamma`` (Post-LN: ``output.LayerNorm``; Pre-LN and Llama: the norm before the MLP),
  ``W_2`` (``output.dense``), and the classifier weight ``W_C``: 22 tensors;
* **the head**: a fresh linear head ``W_C (d, C) ~ N(0, 0.02²)`` (Hugging Face's initialiser
  range), ``b = 0``, one draw per seed, on the last token for the causal pydoc models and on
  ``[CLS]`` for MiniLM, after the model's final norm where it has one;
* **the numbers**: per batch, :func:`hessviz.whole.table.tensor_table` (Lanczos ``k = 1`` on each
  diagonal block's closed-form products, tolerance :data:`TOL`) and the gradient norms; the
  classifier block dense in closed form, ``H_{W_C} = \frac1B \sum_β z_β z_β^⊤ ⊗ (\mathrm{diag}\,p_β −
  p_β p_β^⊤)`` with ``z_β`` the pooled state that ``hv.model_hessian`` (``head.W`` among its names)
  computed (``d·C`` entries: exact is cheaper than Lanczos there);
  a band over batches and seeds.

Where it differs (said in the report): models of 0.9 M (pydoc) and 22 M (MiniLM) weights instead
of RoBERTa's 125 M, :data:`BATCH` sequences of 24 tokens instead of 32 of 128, a docstring task
instead of GLUE, Lanczos instead of power iteration, fewer batches; the pydoc pair differ in more
than the placement (hessviz/data/models/README.md).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

import hessviz as hv
from hessviz import plots
from hessviz.block.config import layer_name
from hessviz.experiments.common import SOURCES, Claim, Measurement, Verdict, grade
from hessviz.experiments.docstring_task import MODULES, build
from hessviz.laws.fitting import gini, t_interval
from hessviz.losses import HEAD_W
from hessviz.pretrained.checkpoint import available_models
from hessviz.whole.table import tensor_table

WEIGHTS = ("ln1_gamma", "W_Q", "W_K", "W_V", "W_1", "ln2_gamma", "W_2")
HEAD = "W_C"
PAPER_GINI = {"post": 0.941, "pre": 0.880}
"""Tomihari & Sato, RoBERTa (Post-LN) and the Pre-LN model they set beside it."""
MODELS = ("pydoc-postln", "pydoc-preln", "pydoc-llama", "all-MiniLM-L6-v2")
PAIR = ("pydoc-postln", "pydoc-preln")
MINILM = "all-MiniLM-L6-v2"
PERI = "pydoc-preln+peri"
"""The Peri-LN variant of ``pydoc-preln`` (:func:`peri_variant`): its Gini sits beside the pair's."""
BATCH = 4
TOL = 1e-2
HEAD_STD = 0.02


def tensors(n_layers: int) -> tuple[str, ...]:
    """The paper's 21 layer tensors scaled to ``n_layers``: first, middle, last layer × :data:`WEIGHTS`.

    >>> tensors(12)[:2], tensors(12)[7], len(tensors(4))
    (('l0.ln1_gamma', 'l0.W_Q'), 'l6.ln1_gamma', 21)
    """
    layers = sorted({0, n_layers // 2, n_layers - 1})
    return tuple(f"l{i}.{w}" for i in layers for w in WEIGHTS)


def pooling(model: hv.Model) -> str:
    return "last" if model.causal else "cls"


def head(d: int, seed: int) -> tuple[Tensor, Tensor]:
    """A fresh linear head ``(W (d, C) ~ N(0, 0.02²), b = 0)``, seeded."""
    g = torch.Generator().manual_seed(1000 + seed)
    return HEAD_STD * torch.randn(d, len(MODULES), generator=g, dtype=torch.float64), torch.zeros(
        len(MODULES), dtype=torch.float64
    )


def pooled(res) -> Tensor:
    """``(B, d)``: each sequence's pooled last hidden state after the final norm, as the
    :class:`hessviz.Classifier` of ``res`` (a :func:`hessviz.model_hessian` with ``head.W`` among its
    names) computed it."""
    return torch.stack([t.z for t in res.terms])


def head_block(z: Tensor, W: Tensor, b: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    r"""``(H (dC, dC), g (d, C))``: the classifier weight's diagonal block and gradient of the mean
    cross-entropy, ``H = \frac1B \sum_β z_β z_β^⊤ ⊗ (\mathrm{diag}\,p_β − p_β p_β^⊤)`` (row-major
    ``vec W``), ``g = \frac1B \sum_β z_β (p_β − e_{y_β})^⊤``."""
    p = torch.softmax(z @ W + b, -1)
    r = p - torch.nn.functional.one_hot(labels, W.shape[1]).to(p)
    A = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    H = torch.einsum("bi,bj,bcd->icjd", z, z, A).reshape(W.numel(), W.numel()) / z.shape[0]
    return H, z.T @ r / z.shape[0]


def _problem(model: hv.Model, ids: Tensor, labels: Tensor, seed: int):
    W, b = head(model.cfg.d_model, seed)
    pool = pooling(model)
    res = hv.model_hessian(
        model, ids, objective=hv.Classifier(W, b, labels, pool), wrt=tensors(model.cfg.n_layers) + (HEAD_W,)
    )
    return res, head_block(pooled(res), W, b, labels)


def gradient_norms(model: hv.Model, ids: Tensor, labels: Tensor, seed: int) -> np.ndarray:
    """``(22,)``: ``‖∂ℓ/∂t‖`` of the 21 tensors of :func:`tensors`, then of ``W_C`` (closed form)."""
    res, (_, gc) = _problem(model, ids, labels, seed)
    grads = res.gradient()
    return np.array([float(grads[n].norm()) for n in tensors(model.cfg.n_layers)] + [float(gc.norm())])


def batch_stats(model: hv.Model, ids: Tensor, labels: Tensor, seed: int) -> dict[str, np.ndarray]:
    """Per tensor (the 21 of :func:`tensors`, then ``W_C``): ``top`` eigenvalue of its diagonal block,
    ``grad`` norm, ``size``; and the table's ``seconds`` and ``matvecs``."""
    res, (Hc, gc) = _problem(model, ids, labels, seed)
    names = tensors(model.cfg.n_layers)
    table = tensor_table(res, tensors=names, trace_samples=3, exact_limit=0, tol=TOL, seed=seed)
    rows = {r.name: r for r in table.rows}
    top = [rows[n].top for n in names] + [float(torch.linalg.eigvalsh(Hc)[-1])]
    grad = [rows[n].grad_norm for n in names] + [float(gc.norm())]
    size = [rows[n].size for n in names] + [Hc.shape[0]]
    return {
        "top": np.array(top),
        "grad": np.array(grad),
        "size": np.array(size, dtype=float),
        "seconds": np.array(table.seconds),
        "matvecs": np.array(table.matvecs),
    }


def summary(grad: np.ndarray, top: np.ndarray, size: np.ndarray) -> dict[str, float]:
    """Λ_G, Λ_P and Λ_G / Λ_P of one batch."""
    g2 = grad**2
    lg = float((g2 * top).sum() / g2.sum())
    lp = float((size * top).sum() / size.sum())
    return {"lambda_G": lg, "lambda_P": lp, "ratio": lg / lp}


@dataclass(frozen=True)
class Plan:
    """What one model runs: gradient norms on ``grad_batches`` batches of each of ``seeds``, the
    eigenvalues on the first batch of each of the first ``eig_seeds`` seeds."""

    seeds: tuple[int, ...]
    grad_batches: int
    eig_seeds: int


def peri_variant(model: hv.Model) -> hv.Model:
    """``model`` (a Pre-LN stack) as Peri-LN (``MODEL.md`` part 5): the same trained weights, and after
    each sublayer an output norm of the model's own kind with ``γ = 1``, ``β = 0`` (untrained: the
    norm that Peri-LN adds, at the initialisation Gemma and Kim et al. start from)."""
    params, layers = {}, []
    for i, (cfg, weights) in enumerate(model.layers):
        peri = dataclasses.replace(cfg, norm="peri")
        extra = {f"{w}_gamma": torch.ones(cfg.d_model, dtype=model.dtype) for w in ("ln1_out", "ln2_out")}
        extra.update(
            {f"{w}_beta": torch.zeros(cfg.d_model, dtype=model.dtype) for w in ("ln1_out", "ln2_out")}
        )
        own = {n: {**weights, **extra}[n] for n in peri.param_names}
        layers.append((peri, own))
        params.update({layer_name(i, n): v for n, v in own.items()})
    cfg = dataclasses.replace(model.cfg, norm="peri")
    return dataclasses.replace(model, source=PERI, cfg=cfg, params=params, layers=layers)


def peri_rows(task, plan: dict[str, Plan], per_model: dict) -> tuple[dict, dict]:
    """The Peri-LN variant of ``pydoc-preln`` on the very batches of the pair (one tokenizer): its Gini
    (mean [min, max]) and the paired differences against Pre-LN and Post-LN with 95 % t-intervals."""
    pl = plan[PAIR[1]]
    model = peri_variant(hv.load_model(PAIR[1]))
    t = time.perf_counter()
    grads = np.stack(
        [
            gradient_norms(model, ids, labels, s)
            for s in pl.seeds
            for ids, labels in task.batches(PAIR[1], BATCH, s)[: pl.grad_batches]
        ]
    )
    g = np.array([gini(x) for x in grads])
    measured = {
        f"gini_{PERI}": float(g.mean()),
        f"gini_band_{PERI}": [float(g.min()), float(g.max())],
        f"seconds_per_gradient_batch_{PERI}": (time.perf_counter() - t) / len(grads),
    }
    for other, key in ((PAIR[1], "gini_peri_minus_pre_pair"), (PAIR[0], "gini_post_minus_peri_pair")):
        diff = per_model[other]["gini"] - g if other == PAIR[0] else g - per_model[other]["gini"]
        md, lo, hi = t_interval(diff)
        measured[key], measured[f"{key}_ci"] = md, [lo, hi]
    names = tensors(model.cfg.n_layers) + (HEAD,)
    per_model[PERI] = {"gini": g, "grad": grads, "names": names, "plan": Plan(pl.seeds, pl.grad_batches, 0)}
    return measured, {f"{PERI}_grad": grads, f"{PERI}_names": np.array(names)}


def _settings(quick: bool) -> dict[str, Plan]:
    """``model -> Plan`` for the models present (MiniLM when installed)."""
    present = set(available_models())
    if quick:
        plan = {"pydoc-postln": Plan((0, 1), 2, 0), "pydoc-preln": Plan((0, 1), 2, 0)}
    else:
        plan = {
            "pydoc-postln": Plan((0, 1, 2), 4, 2),
            "pydoc-preln": Plan((0, 1, 2), 4, 2),
            "pydoc-llama": Plan((0, 1, 2), 4, 1),
            MINILM: Plan((0, 1), 3, 0),
        }
    return {m: plan[m] for m in MODELS if m in plan and m in present}


def measure(quick: bool = False, progress=None) -> Measurement:
    task = build()
    plan = _settings(quick)
    measured: dict = {}
    data: dict = {
        "python_version": np.array(task.python),
        "modules": np.array(MODULES),
        "counts": np.array(list(task.counts.values())),
        "available": np.array(task.available),
    }
    per_model: dict = {}
    for k, (source, pl) in enumerate(plan.items()):
        model = hv.load_model(source)
        grads, tops, eig_grads, size = [], [], [], None
        t = time.perf_counter()
        for s in pl.seeds:
            for ids, labels in task.batches(source, BATCH, s)[: pl.grad_batches]:
                grads.append(gradient_norms(model, ids, labels, s))
        grad_seconds = (time.perf_counter() - t) / len(grads)
        t = time.perf_counter()
        for s in pl.seeds[: pl.eig_seeds]:
            ids, labels = task.batches(source, BATCH, s)[0]
            r = batch_stats(model, ids, labels, s)
            tops.append(r["top"])
            eig_grads.append(r["grad"])
            size = r["size"]
        g = np.array([gini(x) for x in grads])
        measured[f"gini_{source}"] = float(g.mean())
        measured[f"gini_band_{source}"] = [float(g.min()), float(g.max())]
        measured[f"seconds_per_gradient_batch_{source}"] = grad_seconds
        data[f"{source}_grad"] = np.stack(grads)
        names = tensors(model.cfg.n_layers) + (HEAD,)
        data[f"{source}_names"] = np.array(names)
        per_model[source] = {"gini": g, "grad": np.stack(grads), "names": names, "plan": pl}
        if tops:
            stats = [summary(gr, lam, size) for gr, lam in zip(eig_grads, tops)]
            for key in ("lambda_G", "lambda_P", "ratio"):
                v = np.array([st[key] for st in stats])
                measured[f"{key}_{source}"] = float(np.median(v))
                measured[f"{key}_band_{source}"] = [float(v.min()), float(v.max())]
            measured[f"seconds_per_table_{source}"] = (time.perf_counter() - t) / len(tops)
            data[f"{source}_top"], data[f"{source}_eig_grad"], data[f"{source}_size"] = (
                np.stack(tops),
                np.stack(eig_grads),
                size,
            )
            per_model[source].update(top=np.stack(tops), eig_grad=np.stack(eig_grads))
        if progress is not None:
            progress(k + 1, len(plan), source)
    pair = per_model[PAIR[0]]["gini"] - per_model[PAIR[1]]["gini"]  # the same batches: one tokenizer
    md, lo, hi = t_interval(pair)
    measured["gini_post_minus_pre_pair"] = md
    measured["gini_post_minus_pre_pair_ci"] = [lo, hi]
    measured["gini_post_minus_pre_pair_min"] = float(np.min(pair))
    if PAIR[1] in per_model:
        more, arrays = peri_rows(task, plan, per_model)
        measured.update(more)
        data.update(arrays)
        plan = {**plan, PERI: per_model[PERI]["plan"]}
    measured["paper_gini_post_roberta"] = PAPER_GINI["post"]
    measured["paper_gini_pre"] = PAPER_GINI["pre"]
    return Measurement(measured, data, {"per_model": per_model, "plan": plan, "task": task})


PERI_WHY = (
    "Beside them, Peri-LN: pydoc-preln with an output norm (γ = 1, β = 0) after each sublayer, on the same "
    "batches: Gini {gini_pydoc_preln_peri:.3f}; Peri minus Pre {gini_peri_minus_pre_pair:+.3f} (95% "
    "interval [{gini_peri_minus_pre_pair_ci[0]:+.3f}, {gini_peri_minus_pre_pair_ci[1]:+.3f}]), Post minus "
    "Peri {gini_post_minus_peri_pair:+.3f} ([{gini_post_minus_peri_pair_ci[0]:+.3f}, "
    "{gini_post_minus_peri_pair_ci[1]:+.3f}]). Why the gradients change, by the chain rule: every weight "
    "of a sublayer now reaches the loss through its output norm's Jacobian (Π − y yᵀ/n)/σ, which "
    "divides that sublayer's gradient by σ, the scale of its output rows, and removes the component "
    "along y; the trained sublayers' output scales differ, so the 22 gradient norms are rescaled "
    "unevenly, and the norm's γ = 1 leaves every sublayer's branch at unit scale. The variant's "
    "output norms are not trained: it shows what the placement alone does to these weights. "
)
"""The Peri-LN variant's sentence of the note (``str.format`` of the measured numbers, keys with
``_`` for ``-`` and ``+``)."""


def judge(m: dict) -> Verdict:
    lo = m["gini_post_minus_pre_pair_ci"][0]
    models = [k[len("ratio_") :] for k in m if k.startswith("ratio_") and not k.startswith("ratio_band_")]
    ratios = {s: m[f"ratio_{s}"] for s in models}
    post_higher = m["gini_post_minus_pre_pair"] > 0 and m["gini_post_minus_pre_pair_min"] > 0
    lam_ok = bool(ratios) and all(r > 1 for r in ratios.values())
    rule = (
        f"holds when Gini(pydoc-postln) > Gini(pydoc-preln) on every shared batch (smallest paired "
        f"difference {m['gini_post_minus_pre_pair_min']:+.3f}; mean "
        f"{m['gini_post_minus_pre_pair']:+.3f}, "
        f"95% interval from {lo:+.3f}) and the median Λ_G/Λ_P > 1 for every model with eigenvalues ("
        + ", ".join(f"{s} {r:.2f}" for s, r in ratios.items())
        + "); partly when one of the two holds. The paper: 0.941 (Post-LN) > 0.880 (Pre-LN)"
    )
    return grade(post_higher and lam_ok, post_higher or lam_ok, rule)


def _band(m: dict, key: str, source: str) -> str:
    lo, hi = m[f"{key}_band_{source}"]
    return f"{m[f'{key}_{source}']:.3f} [{lo:.3f}, {hi:.3f}]"


def report(ms: Measurement, v: Verdict) -> tuple[str, dict]:
    m, d = ms.numbers, ms.detail
    task = d["task"]

    def row(s: str, pl: Plan) -> str:
        out = (
            f"{s}: Gini {_band(m, 'gini', s)} ({len(pl.seeds)} seeds × {pl.grad_batches} batches, "
            f"{m[f'seconds_per_gradient_batch_{s}']:.1f} s per batch)"
        )
        if f"ratio_{s}" in m:
            out += (
                f", Λ_G {_band(m, 'lambda_G', s)}, Λ_P {_band(m, 'lambda_P', s)}, Λ_G/Λ_P "
                f"{_band(m, 'ratio', s)} ({pl.eig_seeds} batch(es), {m[f'seconds_per_table_{s}']:.0f} s "
                "per batch's 22 eigenvalues)"
            )
        return out

    rows = "; ".join(row(s, pl) for s, pl in d["plan"].items())
    missing = (
        ""
        if MINILM in d["plan"]
        else (
            f" {MINILM} is not installed here (the models extra), so it is left out."
            if MINILM not in available_models()
            else f" {MINILM} is left out of this quick run."
        )
    )
    note = (
        "Tomihari & Sato's protocol (module docstring of hessviz.experiments.gini_protocol): before "
        "fine-tuning, a fresh linear head N(0, 0.02²), cross-entropy, per batch the top eigenvalue of the "
        "diagonal Hessian block and the gradient norm of 22 tensors (first, middle, last layer × "
        "{ln1_gamma, W_Q, W_K, W_V, W_1, ln2_gamma, W_2} + the classifier weight). The task: which of "
        f"{len(MODULES)} standard-library modules ({', '.join(MODULES)}) a docstring is from, "
        f"{len(task.train)} training docstrings (Python {task.python}), batches of {BATCH} × 24 tokens; the "
        "Gini needs only the gradients, so it runs on more batches than the eigenvalues. "
        f"Gini: mean [min, max] over batches and seeds; Λ: median [min, max]: {rows}.{missing} Post-LN minus "
        f"Pre-LN Gini on the same batches: {m['gini_post_minus_pre_pair']:+.3f} (95% interval "
        f"[{m['gini_post_minus_pre_pair_ci'][0]:+.3f}, {m['gini_post_minus_pre_pair_ci'][1]:+.3f}]). "
        + (
            PERI_WHY.format(**{k.replace("-", "_").replace("+", "_"): v for k, v in m.items()})
            if PERI in d["plan"]
            else ""
        )
        + f"The paper: Gini 0.941 (RoBERTa, Post-LN) vs 0.880 (Pre-LN). The synthetic-target row (claim "
        "`gini`: one block at initialisation against a random MSE target) is a different protocol and "
        "stays as it was. Where this still differs from the paper: 0.9 M / 22 M weights instead of 125 M, "
        f"{BATCH} × 24 tokens per batch instead of 32 × 128, a docstring task instead of GLUE, Lanczos "
        f"(tolerance {TOL:g}) instead of power iteration, a few batches instead of every batch of an epoch; "
        "the pydoc pair differ in more than the LayerNorm placement (hessviz/data/models/README.md)."
    )
    per = d["per_model"]
    figs = {
        "gini_protocol_gini": plots.grouped_bars(
            list(per),
            {"Gini": [m[f"gini_{s}"] for s in per]},
            errors={"Gini": [(m[f"gini_band_{s}"][1] - m[f"gini_band_{s}"][0]) / 2 for s in per]},
            title="Gini of the 22 gradient norms before fine-tuning (mean; error bar: half the min–max "
            "range over batches)",
            ylabel="Gini",
        ),
        "gini_protocol_scatter": plots.scatter_figure(
            {s: (p["eig_grad"].ravel(), p["top"].ravel()) for s, p in per.items() if "top" in p},
            title="Per-tensor gradient norm vs top eigenvalue of its diagonal block (every batch)",
            xlabel="‖g_b‖",
            ylabel="λ_max(H_bb)",
        ),
    }
    return note, figs


GINI_PROTOCOL = Claim(
    "gini_protocol",
    "At Tomihari & Sato's protocol (22 tensors, a fresh linear head, cross-entropy on a real labelled "
    "task, before fine-tuning), the Post-LN model has the higher gradient heterogeneity (Gini 0.941 vs "
    "0.880 for Pre-LN on RoBERTa), and Λ_G > Λ_P.",
    SOURCES["tomihari"] + " (protocol of the tom4649/gradient-heterogeneity code)",
    measure,
    judge,
    report,
)
