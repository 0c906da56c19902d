r"""Three claims on a real LLM, SmolLM2-135M (the bundled GGUF file), beside the pydoc models.

* ``smollm2_table``: its per-tensor table under its own next-token loss
  (:mod:`hessviz.experiments.llm_table`, stored in ``hessviz/data/claims/smollm2/table.json``): the
  top eigenvalues of the weights' diagonal blocks spread over orders of magnitude (Zhang et al.'s
  block heterogeneity).
* ``sharpness_ordering``: Wang et al.'s sharpness disparity, ``S(Emb) ≪ S(QK) < S(FFN) < S(VO) ≪
  S(Norm)``, ``S`` the mean top eigenvalue of the diagonal Hessian blocks of one type: QK =
  ``{W_Q, W_K}``, VO = ``{W_V, W_O}``, FFN = ``{W_G, W_1, W_2}`` (those present), Norm = the norms'
  ``γ`` inside the layers (``ln1_gamma``, ``ln2_gamma``), Emb = the tied embedding's **output copy**
  (the unembedding; :func:`unembedding_top`). On SmolLM2 from the stored table, on the three pydoc
  models from a table computed here.
* ``gini_smollm2``: Tomihari & Sato's Gini of gradient norms at the protocol of
  :mod:`hessviz.experiments.gini_protocol` (its 22 tensors, a fresh linear head, the docstring task),
  on SmolLM2, set beside the committed pydoc and MiniLM numbers (``hessviz/data/claims/claims.json``).

``python -m hessviz.experiments.smollm2`` (or ``hessviz reproduce --smollm2``) writes
``hessviz/data/claims/smollm2/`` (``claims.json``, ``report.md``, ``data/``, ``figures/``) with the report
machinery (:func:`hessviz.experiments.report.write_report`), from the stored table; the table itself
is computed once by :mod:`hessviz.experiments.llm_table` (tens of minutes on two cores).
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np
import torch

from hessviz import plots
from hessviz.experiments import llm
from hessviz.experiments import llm_table as st
from hessviz.experiments.common import SOURCES, Claim, Measurement, Verdict, grade
from hessviz.experiments.tensor_types import (  # noqa: F401  (read here and by the reports)
    TYPES,
    head_rows,
    split_name,
    type_means,
    unembedding_top,
    weight_rows,
)
from hessviz.laws.fitting import gini
from hessviz.resources import cache_dir, data

COMMITTED = data("claims", "claims.json")
"""The committed ``hessviz reproduce`` records (the pydoc and MiniLM Gini of ``gini_protocol``)."""
WANG = llm.WANG
ZHANG = (
    "Zhang, Chen, Ding, Li, Sun, Luo, 'Why Transformers Need Adam: A Hessian Perspective', "
    "arXiv:2402.16788 (NeurIPS 2024)"
)
ORDER = ("Emb", "QK", "FFN", "VO", "Norm")
PYDOC = ("pydoc-postln", "pydoc-preln", "pydoc-llama")
PYDOC_TEXT = "The sorted() function returns a new sorted list from the items in the iterable."
"""The pydoc models' text: the Whole model page's default (Python's help text, what they learned)."""
MODEL = "smollm2-135m"
SPREAD_HOLDS = 100.0
"""``smollm2_table`` holds when the weights' top eigenvalues span at least this factor (partly: 10×)."""


# ----------------------------------------------------------------------------- the stored table
def load_table(path: pathlib.Path | None = None) -> dict:
    """The stored table (default: the package's; :func:`hessviz.experiments.llm_table.run`), checked for
    its shape."""
    path = path or st.table_path(MODEL)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: python -m hessviz.experiments.llm_table --model {MODEL}")
    t = json.loads(path.read_text())
    for k in ("rows", "weight_layers", "head_layers", "tokens", "text"):
        if k not in t:
            raise ValueError(f"{path}: field {k!r} is missing")
    return t


def own_gradients(path: pathlib.Path | None = None) -> dict[str, float]:
    """Every weight's and head's gradient norm under the table's loss (default: the package's;
    :func:`hessviz.experiments.llm_table.gradients`)."""
    path = path or st.gradients_path(MODEL)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: python -m hessviz.experiments.llm_table --model {MODEL} --gradients"
        )
    return json.loads(path.read_text())["grad"]


def head_states(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """``(h (T, d), p (T, V), w (T,), what)`` of ``model``'s own objective (that of the Whole model
    page, :func:`hessviz.whole.objective.objective_of`) on ``ids``: next-token through the final norm
    and the tied unembedding, or pydoc-postln's last-token classifier on ``Eᵀ`` and the decoder bias."""
    import hessviz as hv
    from hessviz.ops import layernorm
    from hessviz.pretrained.load import hidden_states
    from hessviz.whole.objective import objective_of

    objective, used, _ = objective_of(model, ids)
    Z = hidden_states(model.name, torch.tensor(used), dtype=model.dtype, layers=model.layers)[-1].double()
    if isinstance(objective, hv.Classifier):  # the last state, no final norm read
        h = Z[-1:]
        s = h @ objective.W.double() + objective.b.double()
        return h, torch.softmax(s, -1), torch.ones(1, dtype=torch.float64), "Eᵀ of the last-token classifier"
    head = model.head
    n, _ = layernorm.value(Z, head.eps, where="final norm input", centre=head.norm_type == "layernorm")
    h = n * (1.0 if head.gamma is None else head.gamma.double())
    if head.beta is not None:
        h = h + head.beta.double()
    h = h[:-1]  # positions that predict a next token
    p = torch.softmax(h @ head.embedding.double().T, -1)
    return h, p, torch.full((h.shape[0],), 1.0 / h.shape[0], dtype=torch.float64), "the tied unembedding"


def pydoc_table(source: str) -> dict:
    """Every layer weight's top eigenvalue of a pydoc model on :data:`PYDOC_TEXT` under its own
    objective (Lanczos to 1e-6, blocks up to 256 entries exact), and its unembedding's."""
    import hessviz as hv
    from hessviz import pretrained
    from hessviz.whole.objective import objective_of
    from hessviz.whole.table import tensor_table

    model = hv.load_model(source)
    ids = list(pretrained.token_ids(source, PYDOC_TEXT))
    objective, used, _ = objective_of(model, ids)
    names = tuple(n for n in model.names if split_name(n)[1] in sum(TYPES.values(), ()))
    res = hv.model_hessian(model, torch.tensor(used), objective=objective, wrt=names)
    t0 = time.perf_counter()
    tab = tensor_table(res, tensors=names, trace_samples=0, exact_limit=256, tol=1e-6)
    h, p, w, _ = head_states(model, ids)
    emb = unembedding_top(h, p, w)
    return {
        "names": [r.name for r in tab.rows],
        "top": [r.top for r in tab.rows],
        "grad": [r.grad_norm for r in tab.rows],
        "emb": emb,
        "tokens": len(used),
        "seconds": time.perf_counter() - t0,
    }


def smollm2_emb(table: dict) -> float:
    """SmolLM2's unembedding top eigenvalue on the stored table's tokens."""
    import hessviz as hv

    model = hv.load_model(MODEL, dtype=torch.float32)
    ids = st.token_ids(MODEL)
    if len(ids) != table["tokens"]:
        raise ValueError(f"the stored table has {table['tokens']} tokens, the text gives {len(ids)}")
    h, p, w, _ = head_states(model, ids)
    return unembedding_top(h, p, w)


# ----------------------------------------------------------------------------- claim A: the table
def measure_table(quick: bool = False) -> Measurement:
    t = load_table()
    wr, hr = weight_rows(t), head_rows(t)
    tops = np.array([r["top"] for r in wr.values()])
    every = own_gradients()
    grads = np.array([v for n, v in every.items() if "[" not in n])
    pos = tops[tops > 0]
    m = {
        "tensors": len(wr),
        "head_blocks": len(hr),
        "gradient_norms": len(every),
        "layers_with_weights": len(t["weight_layers"]),
        "layers_with_heads": len(t["head_layers"]),
        "tokens": t["tokens"],
        "top_max": float(tops.max()),
        "top_min": float(tops.min()),
        "top_spread": float(pos.max() / pos.min()),
        "gini_grad_all_weights": gini(grads),
        "products": int(sum(r["matvecs"] for r in t["rows"].values())),
        "seconds_table": float(t["seconds"]),
    }
    for ty, v in type_means({n: r["top"] for n, r in wr.items()}).items():
        m[f"mean_top_{ty}"] = v
    for layer in sorted(t["head_layers"]):
        for w in st.HEADED:
            v = [r["top"] for n, r in hr.items() if split_name(n)[:2] == (layer, w)]
            if v and min(v) > 0:
                m[f"head_spread_l{layer}_{w}"] = max(v) / min(v)
    names = list(wr) + list(hr)
    rows = [t["rows"][n] for n in names]
    data = {
        "names": np.array(names),
        "top": np.array([r["top"] for r in rows]),
        "grad": np.array([r["grad"] for r in rows]),
        "size": np.array([r["size"] for r in rows]),
        "matvecs": np.array([r["matvecs"] for r in rows]),
    }
    return Measurement(m, data, {"table": t, "weights": wr, "heads": hr})


def judge_table(m: dict) -> Verdict:
    s = m["top_spread"]
    return grade(
        s >= SPREAD_HOLDS,
        s >= 10,
        f"holds when the largest positive top eigenvalue of the {m['tensors']:.0f} weight blocks "
        f"is at least {SPREAD_HOLDS:g}× the smallest (measured {s:.3g}×); partly from 10×",
    )


def _protocol(t: dict) -> str:
    heads, layers = sorted(t["head_layers"]), sorted(t["weight_layers"])
    which = (
        "all 30 layers"
        if len(layers) == 30
        else f"{len(layers)} of the 30 layers ({', '.join(map(str, layers))})"
    )
    return (
        f"SmolLM2-135M-Instruct from the bundled Q4_1 GGUF file (dequantized, float32, "
        f"{t.get('threads', 2)} threads), its own next-token loss (mean cross-entropy over "
        f"{t['tokens'] - 1} predicted tokens, through the final RMSNorm and the tied unembedding) on one "
        f"sequence: the first {t['tokens']} tokens of {t['sources'][0]} (public domain; "
        f'"{t["text"][:60]}…"). Per tensor: the top eigenvalue of its diagonal block of the full '
        "Hessian (every layer weight in θ), Lanczos k = 1 on closed-form products started from the "
        f"gradient, value tolerance {t['tol']:g} (about 1 % relative), and the gradient's norm. Every "
        f"weight of {which}; per head (9 query heads of W_Q and W_O, 3 key/value heads of W_K and W_V) "
        f"for layers {', '.join(map(str, heads)) or 'none'} ({len(heads)} of 30); gradient norms of "
        "every weight and head of all 30 layers."
    )


def report_table(ms: Measurement, v: Verdict) -> tuple[str, dict]:
    m, t, wr = ms.numbers, ms.detail["table"], ms.detail["weights"]
    big = max(wr, key=lambda n: wr[n]["top"])
    small = min((n for n in wr if wr[n]["top"] > 0), key=lambda n: wr[n]["top"])
    la = t.get("load_average_start", [float("nan")] * 3)
    note = (
        _protocol(t)
        + " Computed once by "
        + (
            " then ".join(f"`{c}`" for c in t["commands"])
            if t.get("commands")
            else f"`python -m hessviz.experiments.llm_table --model {MODEL}`"
        )
        + " (each resuming from the checkpoint) in "
        f"{m['seconds_table'] / 60:.0f} min of work ({m['products']:.0f} products; load average "
        f"{la[0]:.1f} at the start, niced, on a shared 2-core machine). The sharpest weight block is "
        f"{big} (λ = {wr[big]['top']:.3g}), the flattest {small} (λ = {wr[small]['top']:.3g}): "
        f"{m['top_spread']:.3g}×. Mean top eigenvalue per type: "
        + ", ".join(f"{k[len('mean_top_') :]} {m[k]:.3g}" for k in m if k.startswith("mean_top_"))
        + f". Gini of the gradient norms of all 270 weights: {m['gini_grad_all_weights']:.3f}. "
        "Differences from a full table: one short sequence instead of a corpus, float32 weights that were "
        "4-bit in the file, eigenvalues to about 1 % instead of 1e-6, no traces"
        + (
            "."
            if len(t["head_layers"]) == 30 and len(t["weight_layers"]) == 30
            else ", and eigenvalues for the layers listed only (the run's time budget)."
        )
    )
    names = list(wr)
    cats, groups = _by_layer(names, [wr[n]["top"] for n in names])
    figs = {
        "smollm2_table_top": plots.grouped_bars(
            cats,
            groups,
            title="SmolLM2-135M: top eigenvalue of each weight's diagonal block, per layer",
            ylabel="λ_max(H[t, t])",
            logy=True,
        )
    }
    return note, figs


def _by_layer(names, values) -> tuple[list[str], dict[str, list[float]]]:
    """``(weights, {"layer i": values})`` for grouped bars."""
    cats = list(dict.fromkeys(split_name(n)[1] for n in names))
    out: dict[str, list[float]] = {}
    for n, v in zip(names, values):
        layer, w, _ = split_name(n)
        out.setdefault(f"layer {layer}", [float("nan")] * len(cats))[cats.index(w)] = v
    return cats, out


SMOLLM2_TABLE = Claim(
    "smollm2_table",
    "In a Transformer the curvature of different weight blocks differs by orders of magnitude (block "
    "heterogeneity): SmolLM2-135M's per-tensor table under its own next-token loss.",
    ZHANG,
    measure_table,
    judge_table,
    report_table,
)


# ----------------------------------------------------------------------------- claim B: the ordering
def holds_ordering(means: dict[str, float]) -> list[bool]:
    """Each adjacent relation of :data:`ORDER` (``S(a) < S(b)``) among the types present.

    >>> holds_ordering({"Emb": 1, "QK": 2, "FFN": 3, "VO": 2.5, "Norm": 9})
    [True, True, False, True]
    """
    present = [t for t in ORDER if t in means]
    return [means[a] < means[b] for a, b in zip(present, present[1:])]


def measure_ordering(quick: bool = False) -> Measurement:
    t = load_table()
    means = {
        "smollm2-135m": {
            "Emb": smollm2_emb(t),
            **type_means({n: r["top"] for n, r in weight_rows(t).items()}),
        }
    }
    tables = {}
    for s in PYDOC[:1] if quick else PYDOC:
        tables[s] = pydoc_table(s)
        means[s] = {"Emb": tables[s]["emb"], **type_means(dict(zip(tables[s]["names"], tables[s]["top"])))}
    m, data = {}, {}
    for s, mm in means.items():
        for ty in ORDER:
            if ty in mm:
                m[f"S_{ty}_{s}"] = mm[ty]
        rel = holds_ordering(mm)
        m[f"relations_holding_{s}"] = sum(rel)
        m[f"ratio_QK_over_Emb_{s}"] = mm["QK"] / mm["Emb"]
        m[f"ratio_Norm_over_VO_{s}"] = mm["Norm"] / mm["VO"]
        data[f"{s}_S"] = np.array([mm.get(ty, np.nan) for ty in ORDER])
    for s, tb in tables.items():
        data[f"{s}_names"], data[f"{s}_top"] = np.array(tb["names"]), np.array(tb["top"])
    return Measurement(m, data, {"means": means, "tables": tables, "tokens": t["tokens"]})


def judge_ordering(m: dict) -> Verdict:
    models = [k[len("relations_holding_") :] for k in m if k.startswith("relations_holding_")]
    full = [s for s in models if m[f"relations_holding_{s}"] == 4]
    rule = (
        "holds when S(Emb) < S(QK) < S(FFN) < S(VO) < S(Norm) (the four relations, mean top eigenvalue "
        "per type) on every model; partly when on some, or when most relations hold overall. Relations "
        "holding: " + ", ".join(f"{s} {m[f'relations_holding_{s}']:.0f}/4" for s in models)
    )
    most = sum(m[f"relations_holding_{s}"] for s in models) > 2 * len(models)
    return grade(len(full) == len(models), bool(full) or most, rule)


def report_ordering(ms: Measurement, v: Verdict) -> tuple[str, dict]:
    means = ms.detail["means"]
    rows = []
    for s, mm in means.items():
        order = " < ".join(sorted(mm, key=mm.get))
        rel = holds_ordering(mm)
        broken = [f"{a} {'<' if ok else '>'} {b}" for (a, b), ok in zip(zip(ORDER, ORDER[1:]), rel) if not ok]
        rows.append(
            f"{s}: "
            + ", ".join(f"S({k}) = {mm[k]:.3g}" for k in ORDER if k in mm)
            + f"; measured order {order}"
            + (f" (broken: {'; '.join(broken)})" if broken else " (the paper's order)")
        )
    note = (
        "S = the mean over a model's tensors of one type of the top eigenvalue of each tensor's "
        "diagonal block of the full Hessian of the model's own loss (QK = W_Q, W_K; VO = W_V, W_O; FFN = "
        "W_G, W_1, W_2; Norm = the γ of both norms in every layer; Emb = the tied embedding matrix as the "
        "unembedding, the output copy alone: the closed-form block Σ_t w_t (diag p_t − p_t p_tᵀ) ⊗ h_t "
        "h_tᵀ; its input copy and the cross term between the two copies are not included, and the final "
        f"norm's γ is not a block here). SmolLM2 from the stored per-tensor table (claim `smollm2_table`, "
        f"1 × {ms.detail['tokens']} tokens, value tolerance 1e-2); the pydoc models on their Whole model "
        "page's text and objective (Lanczos to 1e-6, blocks of ≤ 256 entries exact). "
        + "; ".join(rows)
        + ". Wang et al. measure during pre-training (GPT-2 and LLaMA, many batches, the embedding as one "
        "block); here one short text on the trained weights."
    )
    types = list(ORDER)
    figs = {
        "sharpness_ordering": plots.grouped_bars(
            types,
            {s: [mm.get(t, np.nan) for t in types] for s, mm in means.items()},
            title="Mean top eigenvalue per block type (Wang et al.: Emb ≪ QK < FFN < VO ≪ Norm)",
            ylabel="S = mean λ_max(H[t, t])",
            logy=True,
        )
    }
    return note, figs


SHARPNESS = Claim(
    "sharpness_ordering",
    "The sharpness of a Transformer's block types is ordered S(Emb) ≪ S(QK) < S(FFN) < S(VO) ≪ S(Norm), "
    "S the mean top eigenvalue of the blocks' Hessians.",
    WANG,
    measure_ordering,
    judge_ordering,
    report_ordering,
)


# ----------------------------------------------------------------------------- claim C: the Gini
def committed_gini() -> dict[str, float]:
    """``{model: Gini}`` of the committed ``gini_protocol`` record, for each of its models
    (:data:`hessviz.experiments.gini_protocol.MODELS`: the pydoc models and MiniLM; not its bands, its
    differences or its Peri-LN variant of a model)."""
    from hessviz.experiments.gini_protocol import MODELS

    if not COMMITTED.is_file():
        return {}
    rec = {r["id"]: r for r in json.loads(COMMITTED.read_text())}.get("gini_protocol", {})
    m = rec.get("measured", {})
    return {name: m[f"gini_{name}"] for name in MODELS if f"gini_{name}" in m}


POST_LN = ("pydoc-postln", "all-MiniLM-L6-v2")
SEEDS = (0, 1)
GINI_BATCHES = 1


GINI_FILE = st.stored(MODEL) / "gini_gradients.json"
"""The protocol's gradient norms per batch, as stored with the package (minutes each on two shared cores)."""


def gini_gradients(
    plan: tuple[tuple[int, int], ...],
    path: pathlib.Path = GINI_FILE,
    log=lambda s: None,
    cache: pathlib.Path | None = None,
    source: str = MODEL,
    dtype: torch.dtype = torch.float64,
) -> dict[str, list[float]]:
    """``{"seed,batch": the 22 gradient norms}`` of :func:`hessviz.experiments.gini_protocol.gradient_norms`
    on ``source`` (SmolLM2 by default; in ``dtype``) for each ``(seed, batch index)`` of ``plan``.
    Stored batches are read back from ``path`` (the package's, read-only) and from ``cache``
    (default: ``gini_gradients.json`` in :func:`hessviz.resources.cache_dir`); new ones are
    computed and added to ``cache`` only."""
    import hessviz as hv
    from hessviz.experiments import gini_protocol as gp
    from hessviz.experiments.docstring_task import build

    cache = cache or cache_dir() / path.name
    done = {"batch": gp.BATCH, "grads": {}, "seconds": {}}
    for stored in (path, cache):
        if stored.is_file():
            got = json.loads(stored.read_text())
            done["grads"] |= got["grads"]
            done["seconds"] |= got["seconds"]
    todo = [(s, b) for s, b in plan if f"{s},{b}" not in done["grads"]]
    if todo:
        task, model = build(), hv.load_model(source, dtype=dtype)
        for s, b in todo:
            t = time.perf_counter()
            ids, labels = task.batches(source, gp.BATCH, s, drop_short=source != MODEL)[b]
            done["grads"][f"{s},{b}"] = gp.gradient_norms(model, ids, labels, s).tolist()
            done["seconds"][f"{s},{b}"] = time.perf_counter() - t
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(done, indent=1) + "\n")
            log(f"seed {s} batch {b}: {done['seconds'][f'{s},{b}']:.0f} s")
    return {f"{s},{b}": done["grads"][f"{s},{b}"] for s, b in plan} | {
        "_seconds": [done["seconds"][f"{s},{b}"] for s, b in plan]
    }


def measure_gini(quick: bool = False) -> Measurement:
    from hessviz.experiments import gini_protocol as gp

    plan = tuple((s, b) for s in (SEEDS[:1] if quick else SEEDS) for b in range(1 if quick else GINI_BATCHES))
    got = gini_gradients(plan)
    grads = [np.array(got[f"{s},{b}"]) for s, b in plan]
    seconds = float(np.mean(got["_seconds"]))
    g = np.array([gini(x) for x in grads])
    every = own_gradients()
    own_names = gp.tensors(30)
    own = [every[n] for n in own_names if n in every]
    m = {
        "gini_smollm2-135m": float(g.mean()),
        "gini_band_smollm2-135m": [float(g.min()), float(g.max())],
        "seconds_per_gradient_batch_smollm2-135m": seconds,
        "batches": len(grads),
    }
    if len(own) == len(own_names):
        m["gini_own_loss_21_tensors_smollm2-135m"] = gini(own)
    m["gini_own_loss_all_weights_smollm2-135m"] = gini([v for n, v in every.items() if "[" not in n])
    for k, v in committed_gini().items():
        m[f"committed_gini_{k}"] = v
    names = gp.tensors(30) + (gp.HEAD,)
    return Measurement(
        m,
        {"grad": np.stack(grads), "names": np.array(names), "gini": g},
        {"names": names, "grads": np.stack(grads)},
    )


def judge_gini(m: dict) -> Verdict:
    g = m["gini_smollm2-135m"]
    posts = {s: m[f"committed_gini_{s}"] for s in POST_LN if f"committed_gini_{s}" in m}
    below = [s for s, v in posts.items() if g < v]
    rule = (
        f"holds when SmolLM2's Gini (Pre-RMSNorm, {g:.3f}) is below every Post-LN model's at the same "
        "protocol (" + ", ".join(f"{s} {v:.3f}" for s, v in posts.items()) + "); partly when below some"
    )
    return grade(bool(posts) and len(below) == len(posts), bool(below), rule)


def report_gini(ms: Measurement, v: Verdict) -> tuple[str, dict]:
    m = ms.numbers
    com = {k[len("committed_gini_") :]: val for k, val in m.items() if k.startswith("committed_gini_")}
    lo, hi = m["gini_band_smollm2-135m"]
    note = (
        "The protocol of claim `gini_protocol` (hessviz.experiments.gini_protocol) on SmolLM2-135M "
        "(Pre-RMSNorm, 30 layers, float64 from the Q4_1 file): layers 0, 15 and 29 × {ln1_gamma, W_Q, W_K, "
        "W_V, W_1, ln2_gamma, W_2} and a fresh linear head N(0, 0.02²) on the last token after the final "
        f"norm, cross-entropy on the docstring task (batches of 4 × 24 SmolLM2 tokens), {m['batches']:.0f} "
        f"batches ({m['seconds_per_gradient_batch_smollm2-135m']:.0f} s each): Gini "
        f"{m['gini_smollm2-135m']:.3f} [{lo:.3f}, {hi:.3f}]. Beside it, the committed numbers of "
        "`gini_protocol` (same protocol, more batches): "
        + ", ".join(f"{s} {val:.3f}" for s, val in com.items())
        + ". Under SmolLM2's own next-token loss instead (claim `smollm2_table`'s gradients): Gini "
        + (
            f"{m['gini_own_loss_21_tensors_smollm2-135m']:.3f} over the same 21 layer tensors, "
            if "gini_own_loss_21_tensors_smollm2-135m" in m
            else ""
        )
        + f"{m['gini_own_loss_all_weights_smollm2-135m']:.3f} over all 270 weights. Tomihari & Sato: "
        "0.941 (RoBERTa, Post-LN) vs 0.880 (Pre-LN). No eigenvalues (Λ_G, Λ_P) for SmolLM2 here: 22 "
        "Lanczos runs per batch through 30 layers did not fit beside the table's run; no fine-tuning of it "
        "either (135 M weights). Models of different size, data and training: compare with care."
    )
    names = ms.detail["names"]
    figs = {
        "gini_smollm2_grad": plots.grouped_bars(
            list(names),
            {f"batch {i}": g for i, g in enumerate(ms.detail["grads"])},
            title="SmolLM2-135M: the 22 gradient norms of the Gini protocol",
            ylabel="‖g_b‖",
            logy=True,
        ),
        "gini_smollm2": plots.grouped_bars(
            ["smollm2-135m"] + list(com),
            {"Gini": [m["gini_smollm2-135m"]] + list(com.values())},
            title="Gini of the 22 gradient norms (Tomihari & Sato's protocol)",
            ylabel="Gini",
        ),
    }
    return note, figs


GINI_SMOLLM2 = Claim(
    "gini_smollm2",
    "Post-LN amplifies gradient heterogeneity (Gini 0.941 vs 0.880 for Pre-LN on RoBERTa): a Pre-RMSNorm "
    "LLM, SmolLM2-135M, should sit below the Post-LN models at the same protocol.",
    SOURCES["tomihari"] + " (protocol of the tom4649/gradient-heterogeneity code)",
    measure_gini,
    judge_gini,
    report_gini,
)

CLAIMS = (SMOLLM2_TABLE, SHARPNESS, GINI_SMOLLM2, *llm.claims(MODEL))
"""The three claims of this module, then the two of :mod:`hessviz.experiments.llm` (generic in the model)."""


def main(
    out: pathlib.Path, quick: bool = False, ids: tuple[str, ...] | None = None, figures: bool = True
) -> list[dict]:
    """Run the claims ``ids`` (default all); write ``out`` (claims.json, report.md, data, figures unless
    ``figures=False``). A claim
    of :mod:`hessviz.experiments.llm` whose stored numbers are missing is left out (pending)."""
    from hessviz.experiments.report import run_and_write

    return run_and_write(
        [c for c in CLAIMS if ids is None or c.id in ids],
        out,
        quick,
        stored=lambda cid: cid.startswith(("sharpness_metrics", "gini_interval")),
        figures=figures,
        title="hessviz: SmolLM2-135M, a real LLM, beside the pydoc models",
        command="hessviz reproduce --smollm2",
        basis="Every number comes from the closed-form Hessians and gradients of hessviz on "
        "CPU: SmolLM2's table in float32 (its weights are 4-bit in the file), the rest "
        "in float64.",
    )


if __name__ == "__main__":
    torch.set_num_threads(2)
    if "--gini-gradients" in sys.argv:  # compute (or resume) the Gini's batches alone
        gini_gradients(tuple((s, b) for s in SEEDS for b in range(GINI_BATCHES)), log=print)
        sys.exit(0)
    for entry in main(pathlib.Path("reproduce-smollm2"), quick="--quick" in sys.argv):
        print(entry["id"], entry["holds"], entry["note"])
