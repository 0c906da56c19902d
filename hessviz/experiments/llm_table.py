r"""A real LLM's per-tensor table under its own next-token loss, computed once and stored.

For every layer ``i`` and every weight ``t`` of it (SmolLM2-135M: ``ln1_gamma, W_Q, W_K, W_V, W_O,
ln2_gamma, W_G, W_1, W_2``; Gemma 3 270M adds the QK-norms and the two output norms of the sandwich),
and per head for ``W_Q, W_K, W_V, W_O`` (SmolLM2: 9 query heads, 3 key/value heads, 24 head blocks a
layer; Gemma 3: 4 query heads, 1 key/value head, 10), two numbers:

* ``top``: the largest eigenvalue of the diagonal block ``H_{tt}`` of the Hessian of the loss in
  every layer weight, by Lanczos (``k = 1``) on hessviz's closed-form products
  (:func:`hessviz.whole.table.tensor_table`'s rows, ``trace_samples = 0``, ``bound = "value"``,
  tolerance :data:`TOL`: each eigenvalue to about 1 % relative), started from the block's gradient, a
  layer's runs in lockstep (:func:`layer_rows`);
* ``grad``: ``‖∂ℓ/∂t‖`` (Frobenius).

The loss ``ℓ`` is the model's own next-token cross-entropy, the mean over the predicted tokens of
one sequence: :data:`TEXT`, the opening sentences of three public-domain novels
(:data:`SOURCES_OF_TEXT`), joined and cut to :data:`TOKENS` tokens of the model's own tokenizer
(Gemma's begins with its ``<bos>``). Weights dequantized from the bundled GGUF file, float32 (the
file's precision is 4 bits).

A full table is hundreds of Lanczos runs of products through up to 30 layers: tens of minutes on two
shared cores. So it is computed by :func:`run` once (``python -m hessviz.experiments.llm_table
--model NAME``), checkpointed to a JSON file after every layer (a crash loses one layer; a rerun
resumes). Layers go in :func:`head_layer_order` (spread over depth): every layer's weights, then the
heads of :func:`heads_first`'s layers and the other layers' until a wall-clock ``budget`` is spent (a
head layer is not started when the last one's time would overrun it); the layers reached are listed in
the file (``weight_layers``, ``head_layers``). The claims of :mod:`hessviz.experiments.smollm2` and
:mod:`hessviz.experiments.llm`, and the app (:mod:`hessviz.app.stored_tables`), read the file from the
model's folder of ``hessviz/data/claims`` (:func:`stored`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import torch

from hessviz.resources import data

FOLDERS = {"smollm2-135m": "smollm2", "gemma3-270m": "gemma3"}
"""The bundled LLMs whose results are stored, and their folders' (short) names."""


def short(model: str) -> str:
    """``smollm2-135m -> smollm2``, ``gemma3-270m -> gemma3`` (the folder and the claims' suffix).

    >>> short("gemma3-270m")
    'gemma3'
    """
    return FOLDERS.get(model, model)


def stored(model: str) -> pathlib.Path:
    """The package's folder of a real LLM's stored results (``hessviz/data/claims/<short name>``,
    read-only: runs write where ``--out`` says)."""
    return data("claims", short(model))


def table_path(model: str) -> pathlib.Path:
    """The stored table of ``model`` (read by the claims and the app)."""
    return stored(model) / "table.json"


def gradients_path(model: str) -> pathlib.Path:
    """Every weight's and every head's gradient norm on the table's tokens (one backward)."""
    return stored(model) / "gradients.json"


SOURCES_OF_TEXT = (
    (
        "Jane Austen, Pride and Prejudice (1813), first sentence",
        "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
        "must be in want of a wife.",
    ),
    (
        "Charles Dickens, A Tale of Two Cities (1859), first sentence",
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
        "of foolishness.",
    ),
    ("Herman Melville, Moby-Dick (1851), first sentence", "Call me Ishmael."),
)
TEXT = " ".join(s for _, s in SOURCES_OF_TEXT)
TOKENS = 24
"""Tokens of :data:`TEXT` kept: one sequence, Austen's first sentence (its last words cut)."""
TOL = 1e-2
HEADED = ("W_Q", "W_K", "W_V", "W_O")
MODELS = tuple(FOLDERS)


def heads_first(n_layers: int) -> tuple[int, ...]:
    """The layers whose heads come first: the last (the cheapest: a product on a layer's block sweeps
    every layer above it), the middle and the first; then the others in :func:`head_layer_order`.

    >>> heads_first(30), heads_first(18)
    ((29, 14, 0), (17, 8, 0))
    """
    return (n_layers - 1, (n_layers - 1) // 2, 0)


def head_layer_order(n_layers: int) -> list[int]:
    """Layers in an order that spreads over depth: first, last, middle, then halving the gaps.

    >>> head_layer_order(5)
    [0, 4, 2, 1, 3]
    """
    order, seen = [], set()
    stack = [(0, n_layers - 1)]
    for i in (0, n_layers - 1):
        order.append(i)
        seen.add(i)
    while stack:
        nxt = []
        for lo, hi in stack:
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            if mid not in seen:
                order.append(mid)
                seen.add(mid)
            nxt += [(lo, mid), (mid, hi)]
        stack = nxt
    return order + [i for i in range(n_layers) if i not in seen]


def token_ids(model: str) -> list[int]:
    """The ids of :data:`TEXT` under ``model``'s own tokenizer, cut to :data:`TOKENS`."""
    from hessviz import pretrained

    return list(pretrained.token_ids(model, TEXT))[:TOKENS]


def _save(path: pathlib.Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(path)


def layer_rows(res, names: list[str]) -> dict[str, dict]:
    """The rows of ``names`` (one layer's weights, or its heads) of the table at ``res``: ``top``, ``grad``,
    ``size``, ``matvecs`` (its own product columns) and ``seconds``. The layer's Lanczos runs go in
    lockstep, each step's products in one call (:func:`hessviz.whole.table.rows`, the runs'
    eigenvalues and product counts those of one tensor at a time), so a tensor's ``seconds`` is its
    share of the layer's time by its products."""
    from hessviz.whole.table import Options, rows

    t = time.perf_counter()
    got = rows(res, res._names(names), Options("full", 0, 0, TOL, 0, "top", "value"))
    spent = time.perf_counter() - t
    total = sum(m for _, m in got) or 1
    return {
        n: {
            "top": row.top,
            "grad": row.grad_norm,
            "size": row.size,
            "matvecs": m,
            "seconds": round(spent * m / total, 3),
        }
        for n, (row, m) in zip(names, got)
    }


def run(
    model: str,
    path: pathlib.Path,
    budget: float = 2400.0,
    log=print,
    heads_after: int = 30,
    deep_first: bool = False,
) -> dict:
    """Compute (or resume) ``model``'s table into ``path``; per-head layers only while ``budget`` seconds
    of this call are left (a layer is not started when the last one's time would overrun it). The heads
    of the first of :func:`heads_first` come after the weights of the first ``heads_after``
    layers of :func:`head_layer_order` (a run that may be cut short gets heads of one layer early).
    ``deep_first``: the weights' layers from the last to the first instead (the cheapest first)."""
    import hessviz as hv

    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    state = json.loads(path.read_text()) if path.exists() else None
    name = model
    model = hv.load_model(name, dtype=torch.float32)
    ids = token_ids(name)
    if state is None:
        state = {
            "model": name,
            "text": TEXT,
            "sources": [s for s, _ in SOURCES_OF_TEXT],
            "tokens": len(ids),
            "dtype": "float32",
            "tol": TOL,
            "bound": "value",
            "threads": torch.get_num_threads(),
            "rows": {},
            "head_layers": [],
            "weight_layers": [],
            "seconds": 0.0,
            "load_average_start": list(os.getloadavg()),
        }
    res = hv.model_hessian(model, torch.tensor(ids), "next_token")
    log(f"built: {res.info}, {time.perf_counter() - start:.1f} s, load {os.getloadavg()}")
    cfg = model.cfg

    def do_layer(names: list[str], key: str, layer: int) -> float:
        t = time.perf_counter()
        for n, got in layer_rows(res, names).items():
            state["rows"][n] = got
            log(f"{n:14s} top {got['top']:.5g} grad {got['grad']:.4g} {got['matvecs']} products")
        state[key].append(layer)
        state["seconds"] += time.perf_counter() - t
        state["load_average_end"] = list(os.getloadavg())
        _save(path, state)
        return time.perf_counter() - t

    order = head_layer_order(cfg.n_layers)
    heads_of = {i: [h for w in HEADED for h in cfg.head_names(f"l{i}.{w}")] for i in order}
    first = heads_first(cfg.n_layers)
    rest = tuple(i for i in order if i not in first)
    heads = [("head_layers", i) for i in first + rest]
    weights = [("weight_layers", i) for i in (sorted(order, reverse=True) if deep_first else order)]
    work = weights[:heads_after] + heads[:1] + weights[heads_after:] + heads[1:]
    last = 0.0
    for key, i in work:
        if i in state[key]:
            continue
        spent = time.perf_counter() - start
        if key == "head_layers" and spent + last > budget:
            log(f"budget {budget:.0f} s reached after {spent:.0f} s: per-head layers {state['head_layers']}")
            break
        names = heads_of[i] if key == "head_layers" else [n for n in res.names if n.startswith(f"l{i}.")]
        s = do_layer(names, key, i)
        if key == "head_layers":
            last = s
        log(f"layer {i} {key}: {s:.0f} s; total {time.perf_counter() - start:.0f} s; load {os.getloadavg()}")
    state["complete"] = len(state["head_layers"]) == cfg.n_layers
    _save(path, state)
    return state


def gradients(model: str, path: pathlib.Path) -> dict:
    """``‖∂ℓ/∂t‖`` of every layer weight and every head slice of :data:`HEADED` (the gradient column
    of the table for every layer, whatever part of the eigenvalue column a run reached) of ``model``,
    written to ``path`` (one backward through every layer)."""
    import hessviz as hv

    t = time.perf_counter()
    name = model
    model = hv.load_model(name, dtype=torch.float32)
    ids = token_ids(name)
    res = hv.model_hessian(model, torch.tensor(ids), "next_token")
    cfg = model.cfg
    heads = [h for i in range(cfg.n_layers) for w in HEADED for h in cfg.head_names(f"l{i}.{w}")]
    grads = res.gradient(list(res.names))
    out = {n: float(g.norm()) for n, g in grads.items()}
    for h in heads:
        out[h] = float(res.stack_gradient(res._names([h]))[res._names([h])[0]].norm())
    state = {
        "model": name,
        "text": TEXT,
        "tokens": len(ids),
        "dtype": "float32",
        "grad": out,
        "value": float(res.value),
        "seconds": time.perf_counter() - t,
    }
    _save(path, state)
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help="the JSON file to write or resume (default: table.json, or gradients.json with --gradients, "
        "in the working directory)",
    )
    ap.add_argument("--model", choices=MODELS, default=MODELS[0], help="the bundled LLM (%(default)s)")
    ap.add_argument("--budget", type=float, default=2400.0, help="seconds; per-head layers stop after it")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gradients", action="store_true", help="only the gradient norms (gradients.json)")
    ap.add_argument(
        "--heads-after",
        type=int,
        default=30,
        help="the last layer's heads come after this many layers' weights",
    )
    ap.add_argument("--deep-first", action="store_true", help="the deepest layers' weights first (cheapest)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.gradients:
        state = gradients(args.model, args.out or pathlib.Path(gradients_path(args.model).name))
        print(f"{len(state['grad'])} gradient norms in {state['seconds']:.0f} s", flush=True)
        return
    run(
        args.model,
        args.out or pathlib.Path(table_path(args.model).name),
        args.budget,
        log=lambda s: print(time.strftime("%H:%M:%S"), s, flush=True),
        heads_after=args.heads_after,
        deep_first=args.deep_first,
    )


if __name__ == "__main__":
    main()
