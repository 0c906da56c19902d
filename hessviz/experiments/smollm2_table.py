r"""SmolLM2-135M's per-tensor table under its own next-token loss, computed once and stored.

For every layer ``i`` of the 30 and every weight ``t`` of it (``ln1_gamma, W_Q, W_K, W_V, W_O,
ln2_gamma, W_G, W_1, W_2``), and per head for ``W_Q, W_K, W_V, W_O`` (9 query heads, 3 key/value
heads, so 9 + 3 + 3 + 9 = 24 head blocks a layer), two numbers:

* ``top``: the largest eigenvalue of the diagonal block ``H_{tt}`` of the Hessian of the loss in
  every layer weight, by Lanczos (``k = 1``) on hessviz's closed-form products
  (:func:`hessviz.whole.table.tensor_table`, ``trace_samples = 0``, ``bound = "value"``,
  tolerance :data:`TOL`: each eigenvalue to about 1 % relative), started from the block's gradient;
* ``grad``: ``‖∂ℓ/∂t‖`` (Frobenius).

The loss ``ℓ`` is the model's own next-token cross-entropy, the mean over the predicted tokens of
one sequence: :data:`TEXT`, the opening sentences of three public-domain novels
(:data:`SOURCES_OF_TEXT`), joined and cut to :data:`TOKENS` tokens of SmolLM2's own tokenizer.
Weights dequantized from the bundled Q4_1 GGUF file, float32 (the file's precision is 4 bits).

The full table is ≈ 990 Lanczos runs of products through up to 30 layers: tens of minutes on two
shared cores. So it is computed by :func:`run` once (``python -m hessviz.experiments.smollm2_table``),
checkpointed to a JSON file after every layer (a crash loses one layer; a rerun resumes). Layers go
in :func:`head_layer_order` (spread over depth): every layer's weights, then the heads of
:data:`HEAD_LAYERS_FIRST` and the other layers' until a wall-clock ``budget`` is spent (a head layer is
not started when the last one's time would overrun it); the layers reached are listed in the file
(``weight_layers``, ``head_layers``). The claims of
:mod:`hessviz.experiments.smollm2` and the app read the file.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import torch

from hessviz.resources import data

STORED = data("claims", "smollm2")
"""The package's stored results of SmolLM2 (read-only: runs write where ``--out`` says)."""
TABLE = STORED / "table.json"
"""The stored table (read by the claims and the app)."""

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
HEAD_LAYERS_FIRST = (29, 14, 0)
"""The layers whose heads come first (the last layer's are the cheapest: a product on a layer's block
sweeps every layer above it), then the others in :func:`head_layer_order`."""
MODEL = "smollm2-135m"


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


def token_ids() -> list[int]:
    """The ids of :data:`TEXT` under SmolLM2's tokenizer, cut to :data:`TOKENS`."""
    from hessviz import pretrained

    return list(pretrained.token_ids(MODEL, TEXT))[:TOKENS]


def _save(path: pathlib.Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(path)


def run(
    path: pathlib.Path,
    budget: float = 2400.0,
    log=print,
    heads_after: int = 30,
    deep_first: bool = False,
) -> dict:
    """Compute (or resume) the table into ``path``; per-head layers only while ``budget`` seconds of
    this call are left (a layer is not started when the last one's time would overrun it). The heads
    of the first of :data:`HEAD_LAYERS_FIRST` come after the weights of the first ``heads_after``
    layers of :func:`head_layer_order` (a run that may be cut short gets heads of one layer early).
    ``deep_first``: the weights' layers from the last to the first instead (the cheapest first)."""
    import hessviz as hv
    from hessviz.whole.table import tensor_table

    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    state = json.loads(path.read_text()) if path.exists() else None
    model = hv.load_model(MODEL, dtype=torch.float32)
    ids = token_ids()
    if state is None:
        state = {
            "model": MODEL,
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
        for n in names:
            r0 = time.perf_counter()
            tab = tensor_table(res, tensors=[n], trace_samples=0, exact_limit=0, tol=TOL, bound="value")
            row = tab.rows[0]
            state["rows"][n] = {
                "top": row.top,
                "grad": row.grad_norm,
                "size": row.size,
                "matvecs": tab.matvecs,
                "seconds": round(time.perf_counter() - r0, 3),
            }
            log(
                f"{n:14s} top {row.top:.5g} grad {row.grad_norm:.4g} {tab.matvecs} products "
                f"{time.perf_counter() - r0:.1f} s"
            )
        state[key].append(layer)
        state["seconds"] += time.perf_counter() - t
        state["load_average_end"] = list(os.getloadavg())
        _save(path, state)
        return time.perf_counter() - t

    order = head_layer_order(cfg.n_layers)
    heads_of = {i: [h for w in HEADED for h in cfg.head_names(f"l{i}.{w}")] for i in order}
    rest = tuple(i for i in order if i not in HEAD_LAYERS_FIRST)
    heads = [("head_layers", i) for i in HEAD_LAYERS_FIRST + rest]
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


GRADIENTS = STORED / "gradients.json"
"""Every weight's and every head's gradient norm on the same tokens (one backward: all 30 layers)."""


def gradients(path: pathlib.Path) -> dict:
    """``‖∂ℓ/∂t‖`` of every layer weight and every head slice of :data:`HEADED` (the gradient column
    of the table for every layer, whatever part of the eigenvalue column a run reached), written to
    ``path``."""
    import hessviz as hv

    t = time.perf_counter()
    model = hv.load_model(MODEL, dtype=torch.float32)
    ids = token_ids()
    res = hv.model_hessian(model, torch.tensor(ids), "next_token")
    cfg = model.cfg
    heads = [h for i in range(cfg.n_layers) for w in HEADED for h in cfg.head_names(f"l{i}.{w}")]
    grads = res.gradient(list(res.names))
    out = {n: float(g.norm()) for n, g in grads.items()}
    for h in heads:
        out[h] = float(res.stack_gradient(res._names([h]))[res._names([h])[0]].norm())
    state = {
        "model": MODEL,
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
        state = gradients(args.out or pathlib.Path(GRADIENTS.name))
        print(f"{len(state['grad'])} gradient norms in {state['seconds']:.0f} s", flush=True)
        return
    run(
        args.out or pathlib.Path(TABLE.name),
        args.budget,
        log=lambda s: print(time.strftime("%H:%M:%S"), s, flush=True),
        heads_after=args.heads_after,
        deep_first=args.deep_first,
    )


if __name__ == "__main__":
    main()
