"""Estimate against measured CPU for every stage of the Real model page on SmolLM2-135M (issue 44).

Each stage is called through the app's own cache functions (:mod:`hessviz.app.cache`, the code path
of a live view, nothing precomputed), on one thread, and its thread CPU time is measured around the
call; the estimate is the one the page shows and the budget checks (:mod:`hessviz.checks.cost`). Stages:

* **setup**: reading the model's layers and running the text through them (the first view of a text);
* **window**: the exact Hessian block of ``W_Q[0]`` (``--entries`` entries, 2 rows by default);
* **gradient**: the gradient norms of the layer (by weight);
* **table**: the per-block curvature table of the part the page would draw on the local profile
  with ``--samples`` Hutch++ products;

under the synthetic loss and the model's own next-token loss (its LM head: 49,152 tokens), on texts
of a few and about twenty tokens (``--long`` adds the 400-character text of the issue, about ninety;
a stage estimated past ``--max-seconds`` is skipped). ``--whole`` adds the Whole model page's live tables
of the pydoc models, ``--stack`` a Scaling / Depth sweep point of stacks of 1-4 blocks. Prints a table of
estimate, measured CPU and their ratio; the ratios should lie within 2× (``benchmarks/REAL_LLM.md``).
A timing, not a test::

    OMP_NUM_THREADS=1 python benchmarks/real_llm_estimates.py [--long] [--whole] [--stack] [--max-seconds 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hessviz.app import cache, real_cache  # noqa: E402
from hessviz.app import real_model as rm  # noqa: E402
from hessviz.checks import cost  # noqa: E402
from hessviz.losses import names  # noqa: E402
from hessviz.pretrained import explore  # noqa: E402

MODEL = "smollm2-135m"
TEXTS = {
    "short": "The cat sat on the mat.",
    "default": rm.DEFAULT_TEXT,
    "long": (
        "A lighthouse stands on the rocks at the end of the harbour wall. Every evening the keeper climbs "
        "the narrow stairs, trims the wick, winds the clockwork that turns the lens, and watches the "
        "fishing boats come home before the fog rolls in from the open sea. In winter storms he stays "
        "awake all night, writing the weather in a log book and listening for ships in trouble."
    ),
}
LOSSES = {"synthetic": real_cache.SYNTHETIC, "next token": names.NEXT_TOKEN}


def measured(fn, *args) -> float:
    """Thread CPU seconds of ``fn(*args)``."""
    t = time.thread_time()
    fn(*args)
    return time.thread_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=128)
    ap.add_argument("--samples", type=int, default=rm.FEWEST_SAMPLES)
    ap.add_argument("--long", action="store_true", help="also the 400-character text of the issue")
    ap.add_argument("--whole", action="store_true", help="also the Whole model page's pydoc tables")
    ap.add_argument("--stack", action="store_true", help="also a sweep point of stacks of 1-4 blocks")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="skip a stage estimated over this")
    args = ap.parse_args()
    torch.set_num_threads(1)
    real_cache.PRECOMPUTED = None
    texts = {k: v for k, v in TEXTS.items() if args.long or k != "long"}
    rows = []
    info = __import__("hessviz").pretrained.model_info(MODEL)
    layer = info.n_layers - 1
    kept = real_cache.stack_fits(MODEL)
    print(f"{MODEL}: layer {layer}, torch threads {torch.get_num_threads()}, stack kept: {kept}")
    for label, text in texts.items():
        cache.clear()
        cfg = real_cache.real_config(MODEL, text)
        est = real_cache.real_setup_seconds(MODEL, text)
        rows.append((label, cfg.seq_len, "setup", "-", est, measured(real_cache.real_states, MODEL, text)))
        for lname, loss in LOSSES.items():
            vocab = real_cache.head_vocab(MODEL, loss)
            if vocab:
                real_cache.real_head(MODEL)  # read once per model (not a view's work)
            est = cost.real_window_cost(cfg, "W_Q[0]", args.entries, vocab).seconds
            if est <= args.max_seconds:
                cpu = measured(
                    real_cache.real_window, MODEL, layer, text, 0, "W_Q[0]", 0, args.entries, "full", loss
                )
                rows.append((label, cfg.seq_len, f"window {args.entries}", lname, est, cpu))
            est = cost.real_gradient_cost(cfg, vocab).seconds
            cpu = measured(real_cache.real_gradients, MODEL, layer, text, 0, False, loss)
            rows.append((label, cfg.seq_len, "gradient", lname, est, cpu))
            lim = cache.profiles.limits_from_env({"HESSVIZ_PROFILE": "local"})
            part, samples, verdict = rm.reduced_table(
                cfg, False, rm.DEFAULT_PART, args.samples, lim, vocab=vocab
            )
            blocks = tuple(n for n, _ in explore.part_blocks(cfg, False, part))
            est = verdict.cost.seconds
            if verdict.ok and est <= args.max_seconds:
                cpu = measured(
                    real_cache.real_block_table, MODEL, layer, text, 0, "full", blocks, samples, loss
                )
                rows.append((label, cfg.seq_len, f"table {part}/{samples}", lname, est, cpu))
            else:
                print(f"  skipped: {label} table under {lname} (estimate {est:.0f} s)")
    if args.whole:
        rows += whole_rows(texts)
    if args.stack:
        rows += stack_rows()
    print(f"\n{'text':8} {'L':>4} {'stage':28} {'loss':11} {'estimate s':>10} {'CPU s':>8} {'ratio':>6}")
    for label, L, stage, lname, est, cpu in rows:
        print(f"{label:8} {L:4d} {stage:28} {lname:11} {est:10.2f} {cpu:8.2f} {est / max(cpu, 1e-3):6.2f}")


def stack_rows() -> list[tuple]:
    """One Scaling / Depth sweep point (``W_Q, W_Q``, 128 entries) of stacks of 1-4 of the app's default
    block, the mean of three seeds, against :func:`hessviz.checks.cost.sweep_point_cost`."""
    import dataclasses

    from hessviz.app.state import View
    from hessviz.laws import sweeps

    block = View.from_values({}).cfg
    rows = []
    for n in (1, 2, 3, 4):
        c = dataclasses.replace(block, n_layers=n)
        sweeps.point(c, 1.0, 0, ("W_Q", "W_Q"))  # warm
        cpu = sum(measured(sweeps.point, c, 1.0, s, ("W_Q", "W_Q")) for s in (1, 2, 3)) / 3
        rows.append(("-", c.seq_len, f"sweep point, {n} blocks", "mse", cost.sweep_point_cost(c, 128), cpu))
    return rows


def whole_rows(texts: dict[str, str]) -> list[tuple]:
    """The Whole model page's live tables (every weight, every head of ``W_Q``) of the pydoc models on
    the short and default texts, estimate (:func:`hessviz.app.whole_model.table_cost`) against CPU."""
    from hessviz import pretrained
    from hessviz.app import whole_model as wm

    rows = []
    for model in wm.MODELS:
        info = pretrained.model_info(model)
        stack = wm.stack_config(info)
        for label in ("short", "default"):
            text = texts[label] if label == "short" else wm.DEFAULT_TEXT
            n = len(pretrained.token_ids(model, text))
            for part in (wm.WEIGHTS, "W_Q"):
                est = wm.table_cost(stack, wm.tensors(stack, part), n).seconds
                cpu = measured(wm.table, model, text, part)
                rows.append((label, n, f"{model} {part}", "own", est, cpu))
    return rows


if __name__ == "__main__":
    main()
