r"""Claim ``optimizers_protocol``: SGD against sign-based methods, at Tomihari & Sato's protocol.

Their code fine-tunes RoBERTa with a linear head on GLUE/SuperGLUE with SGD, SGD with momentum,
SignSGD (with and without momentum), Adam and RMSprop, and compares the training-loss curves. The
paper's claim: SGD falls behind the sign-based methods, and most so where gradient heterogeneity
is highest (Post-LN).

Here, the same on the bundled models and :mod:`hessviz.experiments.docstring_task`:

* **what trains**: every layer weight of the model and a fresh linear head
  (``W_C ~ N(0, 0.02²)``, ``b = 0``, the draw of :func:`hessviz.experiments.gini_protocol.head`)
  on the pooled last hidden state (last token, after the model's final norm where it has one);
  the token embeddings and the final norm stay frozen, dropout off;
* **the loss**: mean cross-entropy of minibatches of :data:`BATCH` training docstrings (24 tokens),
  reshuffled every epoch by the seed;
* **the updates** (``g`` the minibatch gradient, ``β = 0.9``)

  .. math::
      \text{SGD: } θ ← θ − ηg,\quad \text{SGD+m: } m ← βm + g,\ θ ← θ − ηm,\quad
      \text{SignSGD: } θ ← θ − η\,\mathrm{sign}(g),

      \text{SignSGD+m: } m ← βm + (1−β)g,\ θ ← θ − η\,\mathrm{sign}(m),\quad
      \text{Adam: } (β_1, β_2) = (0.9, 0.999),\ ε = 10^{-8};

* **tuning**: each optimizer's learning rate from :data:`GRIDS` by the final training loss of the
  first seed (the train split: the task is the optimisation, as in the paper's curves), then the
  other seeds at that rate; each seed draws its own head and minibatch order.

The curve is the loss of :data:`EVAL_PER_CLASS` fixed training docstrings per class (the first of
each class in the split) every :data:`EVAL_EVERY` steps, which costs less than the whole split.

Training uses ``torch.autograd`` through :func:`hessviz.reference.torch_forward` (float32, the
sequences of a batch by ``torch.func.vmap``): these are first derivatives, not the Hessian.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch
from torch import Tensor

import hessviz as hv
from hessviz import plots
from hessviz.experiments.common import SOURCES, Claim, Measurement, Verdict, grade
from hessviz.experiments.docstring_task import build
from hessviz.experiments.gini_protocol import head
from hessviz.laws.fitting import t_interval
from hessviz.reference import torch_forward, torch_norm

OPTIMIZERS = ("SGD", "SGD+m", "SignSGD", "SignSGD+m", "Adam")
SIGN_BASED = ("SignSGD", "SignSGD+m", "Adam")
MODELS = ("pydoc-postln", "pydoc-preln", "pydoc-llama")
PAIR = ("pydoc-postln", "pydoc-preln")
GRIDS = {
    "SGD": (0.03, 0.1, 0.3),
    "SGD+m": (0.003, 0.01, 0.03),
    "SignSGD": (1e-4, 3e-4, 1e-3),
    "SignSGD+m": (1e-4, 3e-4, 1e-3),
    "Adam": (1e-4, 3e-4, 1e-3),
}
QUICK_GRIDS = {o: g[1:2] for o, g in GRIDS.items()}
BATCH = 8
EVAL_EVERY = 5
EVAL_PER_CLASS = 8
MOMENTUM = 0.9
THRESHOLD = 0.5
"""Steps to reach a training loss of ``THRESHOLD ·`` the initial loss (``ln 6`` for a uniform head)."""


@dataclasses.dataclass(frozen=True)
class Task:
    """A model's frozen part and its data: the stack ``cfg``, the embedded training split ``X (N, L, d)``,
    ``labels (N,)``, the evaluation rows ``evaluate``, the final norm (``None``: none) and the initial
    trainable weights."""

    cfg: hv.BlockConfig
    X: Tensor
    labels: Tensor
    evaluate: Tensor
    norm: object
    params: dict[str, Tensor]


def task_for(source: str) -> Task:
    model = hv.load_model(source, dtype=torch.float32)
    if not model.causal:
        raise ValueError(f"source must be a causal model (the head reads the last token), got {source!r}")
    ids, labels = build().ids(source, "train")
    cfg = dataclasses.replace(model.cfg, seq_len=ids.shape[1])
    X = torch.stack(model.embed(ids))
    norm = model.head if model.head is not None and model.head.gamma is not None else None
    evaluate = torch.cat([torch.nonzero(labels == c).ravel()[:EVAL_PER_CLASS] for c in labels.unique()])
    return Task(cfg, X, labels, evaluate, norm, dict(model.params))


def logits(task: Task, params: dict[str, Tensor], W: Tensor, b: Tensor, X: Tensor) -> Tensor:
    """``(B, C)``: the head on the last token of each sequence of ``X (B, L, d)``."""
    Z = torch.func.vmap(lambda x: torch_forward(task.cfg, params, x, check=False))(X)[:, -1]
    n = task.norm
    if n is not None:
        Z = torch_norm(Z, n.norm_type, n.eps, n.gamma.to(Z), None if n.beta is None else n.beta.to(Z))
    return Z @ W + b


def train(task: Task, optimizer: str, lr: float, steps: int, seed: int) -> np.ndarray:
    """The loss of the evaluation rows every :data:`EVAL_EVERY` steps, ``(steps // EVAL_EVERY + 1,)``;
    a run that diverges (non-finite or above 1e3) stays at 1e3 from there."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    W0, b0 = head(task.cfg.d_model, seed)
    weights = {n: p.detach().clone().requires_grad_(True) for n, p in task.params.items()}
    weights["W_C"] = W0.float().requires_grad_(True)
    weights["b_C"] = b0.float().requires_grad_(True)
    state = {n: torch.zeros_like(p) for n, p in weights.items()}
    adam = torch.optim.Adam(weights.values(), lr=lr) if optimizer == "Adam" else None
    gen = torch.Generator().manual_seed(seed)
    N = task.X.shape[0]
    order: list[int] = []
    curve = []

    def full_loss() -> float:
        with torch.no_grad():
            out = logits(task, weights, weights["W_C"], weights["b_C"], task.X[task.evaluate])
            return float(torch.nn.functional.cross_entropy(out, task.labels[task.evaluate]))

    for k in range(steps + 1):
        if k % EVAL_EVERY == 0:
            value = full_loss()
            if not np.isfinite(value) or value > 1e3:
                curve += [1e3] * (steps // EVAL_EVERY + 1 - len(curve))
                break
            curve.append(value)
        if k == steps:
            break
        if len(order) < BATCH:
            order = torch.randperm(N, generator=gen).tolist()
        idx, order = order[:BATCH], order[BATCH:]
        loss = torch.nn.functional.cross_entropy(
            logits(task, weights, weights["W_C"], weights["b_C"], task.X[idx]), task.labels[idx]
        )
        grads = torch.autograd.grad(loss, list(weights.values()))
        with torch.no_grad():
            if adam is not None:
                for p, g in zip(weights.values(), grads):
                    p.grad = g
                adam.step()
                continue
            for (n, p), g in zip(weights.items(), grads):
                if optimizer == "SGD":
                    p -= lr * g
                elif optimizer == "SGD+m":
                    state[n] = MOMENTUM * state[n] + g
                    p -= lr * state[n]
                elif optimizer == "SignSGD":
                    p -= lr * torch.sign(g)
                else:
                    state[n] = MOMENTUM * state[n] + (1 - MOMENTUM) * g
                    p -= lr * torch.sign(state[n])
    return np.asarray(curve)


def steps_to(curve: np.ndarray, threshold: float) -> float:
    """The first evaluated step whose loss is ``≤ threshold`` (one evaluation past the end when never)."""
    hit = np.nonzero(curve <= threshold)[0]
    return float((hit[0] if hit.size else len(curve)) * EVAL_EVERY)


def _settings(quick: bool) -> tuple[tuple[int, ...], int, dict]:
    """``(seeds, steps, grids)``."""
    return ((0,), 10, QUICK_GRIDS) if quick else ((0, 1, 2), 40, GRIDS)


def best_lr(runs: dict[float, np.ndarray]) -> float:
    """The learning rate whose final loss (first seed) is lowest."""
    return min(runs, key=lambda lr: float(runs[lr][-1]))


def measure(quick: bool = False, progress=None) -> Measurement:
    seeds, steps, grids = _settings(quick)
    models = MODELS[:2] if quick else MODELS
    measured: dict = {"steps": steps, "n_seeds": len(seeds), "batch": BATCH}
    data: dict = {}
    study: dict = {}
    for k, source in enumerate(models):
        task = task_for(source)
        t = time.perf_counter()
        tuning = {o: {lr: train(task, o, lr, steps, seeds[0]) for lr in grids[o]} for o in OPTIMIZERS}
        chosen = {o: best_lr(r) for o, r in tuning.items()}
        runs = {
            o: np.stack([tuning[o][chosen[o]]] + [train(task, o, chosen[o], steps, s) for s in seeds[1:]])
            for o in OPTIMIZERS
        }
        measured[f"seconds_{source}"] = time.perf_counter() - t
        threshold = THRESHOLD * float(np.mean([r[:, 0].mean() for r in runs.values()]))
        for o in OPTIMIZERS:
            C = runs[o]
            measured[f"lr_{source}_{o}"] = chosen[o]
            measured[f"final_loss_{source}_{o}"] = float(C[:, -1].mean())
            measured[f"steps_to_threshold_{source}_{o}"] = float(np.mean([steps_to(c, threshold) for c in C]))
            data[f"{source}_{o}"] = C
            data[f"{source}_{o}_tuning"] = np.stack([tuning[o][lr] for lr in grids[o]])
            data[f"{source}_{o}_grid"] = np.array(grids[o])
        measured[f"threshold_{source}"] = threshold
        sgd = runs["SGD"][:, -1]
        best = min(SIGN_BASED, key=lambda o: measured[f"final_loss_{source}_{o}"])
        gaps = np.log(sgd / runs[best][:, -1])
        mean, lo, hi = t_interval(gaps)
        measured[f"log_final_ratio_SGD_over_sign_{source}"] = mean
        measured[f"log_final_ratio_SGD_over_sign_ci_{source}"] = [lo, hi]
        for o in SIGN_BASED:
            measured[f"log_final_ratio_SGD_over_{o}_{source}"] = float(np.mean(np.log(sgd / runs[o][:, -1])))
        study[source] = {"runs": runs, "chosen": chosen, "best_sign": best, "threshold": threshold}
        if progress is not None:
            progress(k + 1, len(models), source)
    data["eval_every"] = np.array(EVAL_EVERY)
    return Measurement(measured, data, {"study": study, "seeds": seeds, "grids": grids, "steps": steps})


def judge(m: dict) -> Verdict:
    models = [s for s in MODELS if f"log_final_ratio_SGD_over_sign_{s}" in m]
    gap = {s: m[f"log_final_ratio_SGD_over_sign_{s}"] for s in models}
    behind = all(v > 0 for v in gap.values())
    most_post = gap[PAIR[0]] > gap[PAIR[1]]
    rule = (
        "holds when, for every model, SGD's final training loss (its best learning rate) is above the "
        "best sign-based method's (log ratio > 0: "
        + ", ".join(f"{s} {v:+.3f}" for s, v in gap.items())
        + f") and the gap is larger for pydoc-postln than for pydoc-preln ({gap[PAIR[0]]:+.3f} vs "
        f"{gap[PAIR[1]]:+.3f}); partly when one of the two holds"
    )
    return grade(behind and most_post, behind or most_post, rule)


def report(ms: Measurement, v: Verdict) -> tuple[str, dict]:
    m, d = ms.numbers, ms.detail
    study = d["study"]
    parts = []
    for s, st in study.items():
        parts.append(
            f"{s} ({m[f'seconds_{s}']:.0f} s): final loss "
            + ", ".join(
                f"{o} {m[f'final_loss_{s}_{o}']:.3f} (lr {st['chosen'][o]:g}, "
                f"{m[f'steps_to_threshold_{s}_{o}']:.0f} steps)"
                for o in OPTIMIZERS
            )
            + f"; SGD vs the best sign-based ({st['best_sign']}): log ratio "
            f"{m[f'log_final_ratio_SGD_over_sign_{s}']:+.3f}"
        )
    note = (
        "Tomihari & Sato's protocol (module docstring of hessviz.experiments.optimizers_protocol): every "
        "layer weight and a fresh linear head fine-tuned on the docstring task (6 classes, "
        f"{BATCH} × 24 tokens per step, {d['steps']} steps, {len(d['seeds'])} seeds), embeddings and final "
        "norm frozen; learning rates tuned on "
        f"{ {o: list(g) for o, g in d['grids'].items()} } by the final training loss of seed 0. Final "
        "training loss and steps to reach "
        f"{THRESHOLD:g} × the initial loss (every {EVAL_EVERY} steps; the mean over seeds, a seed that never "
        f"reaches it counting {d['steps'] + EVAL_EVERY}): " + "; ".join(parts) + ". The paper: "
        "on RoBERTa (Post-LN), SGD's training loss falls far behind SignSGD's and Adam's, and SignSGD "
        "without momentum already beats SGD. Where this still differs: 0.9 M-weight models instead of "
        "125 M, a docstring task instead of GLUE, minibatches of 8 × 24 tokens instead of 32 × 128, "
        f"{d['steps']} steps instead of epochs, no RMSprop, no learning-rate schedule or clipping, three "
        "learning rates per optimizer, the pydoc pair differ in more than the placement."
    )
    figs = {}
    for s, st in study.items():
        curves = {f"{o} (lr {st['chosen'][o]:g})": st["runs"][o] for o in OPTIMIZERS}
        fig = plots.training_curves(
            curves, title=f"Fine-tuning {s} on the docstring task (best lr each)", threshold=st["threshold"]
        )
        fig.update_xaxes(title_text=f"evaluation (every {EVAL_EVERY} steps)")
        figs[f"optimizers_protocol_{s}"] = fig
    return note, figs


OPTIMIZERS_PROTOCOL = Claim(
    "optimizers_protocol",
    "At Tomihari & Sato's protocol (fine-tuning with a linear head on a real labelled task, each "
    "optimizer at its best learning rate), SGD falls behind SignSGD and Adam, most where gradient "
    "heterogeneity is highest (Post-LN).",
    SOURCES["tomihari"] + " (protocol of the tom4649/gradient-heterogeneity code)",
    measure,
    judge,
    report,
)


def saved_curves(data) -> tuple[dict[str, dict[str, np.ndarray]], int]:
    """``({model: {optimizer: (seeds, evaluations)}}, eval_every)`` from this claim's saved arrays
    (``data/optimizers_protocol.npz``, a mapping of name -> array), for the app's Optimization lens."""
    curves: dict[str, dict[str, np.ndarray]] = {}
    for source in MODELS:
        found = {o: np.asarray(data[f"{source}_{o}"]) for o in OPTIMIZERS if f"{source}_{o}" in data}
        if found:
            curves[source] = found
    if not curves or "eval_every" not in data:
        raise ValueError(
            "data must be the arrays of the optimizers_protocol claim (data/optimizers_protocol.npz)"
        )
    return curves, int(np.asarray(data["eval_every"]))
