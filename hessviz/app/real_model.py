"""The Real model page's defaults, its reduced views for a small server, and its precomputed views.

* the default view: :data:`DEFAULT_TEXT`, layer :func:`default_layer`, the synthetic loss with
  target seed 0, the window of :func:`default_rows` rows of ``W_Q[h]`` (full term), blocks =
  every weight, :data:`SAMPLES` Hutch++ products;
* :func:`window_rows` / :func:`reduced_table`: the largest window, and the part of the layer
  and number of products, that fit the server's budget when the visitor's choice does not;
* :func:`precompute` computes the default view of every head of each model through the
  app's own cache functions (:mod:`hessviz.app.cache`, the code path of a live view) and
  saves them with :func:`hessviz.pretrained.precomputed.save`
  (``scripts/precompute_real.py`` is its command line).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hessviz.app import budget, cache, real_cache
from hessviz.app.profiles import Limits
from hessviz.block.config import BlockConfig
from hessviz.checks import cost
from hessviz.pretrained import explore, precomputed

DEFAULT_TEXT = (
    "The old lighthouse keeper climbed the narrow stairs every evening to light the lamp "
    "and watch the ships pass safely."
)
OTHER_TEXT = "A lighthouse keeper lit the lamp each night so that ships could find the harbour."
MAX_CHARS = 400
WINDOW_MAX = 2048
"""Largest window of a head slice drawn (entries; one closed-form product per entry)."""
WINDOW_DEFAULT = 128
"""Entries of the default window (4 rows of MiniLM's ``W_Q[h]``; its time: ``benchmarks/APP.md``)."""
ROW_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)
SAMPLES = 30
DEFAULT_WEIGHT, DEFAULT_TERM, DEFAULT_PART = "W_Q", "full", "every block"
FEWEST_SAMPLES = 6
PRECOMPUTED_WEIGHTS = ("W_Q", "W_K", "W_V")
"""Weights whose default window is precomputed for every head (W_O[h]'s is a whole row of d
entries, 9× the bytes of the others in MiniLM: computed live; its time: ``benchmarks/APP.md``)."""


def folder_problem(folder: str) -> str:
    """What is wrong with a checkpoint folder typed on the Real model page, in one line naming the
    path ("" when it holds a config and weights; the library reads and checks them). Plain text: the
    page draws it through :func:`hessviz.app.state.plain`.

    >>> folder_problem("/nonexistent/x")
    '/nonexistent/x is not a folder on this server (models are never downloaded).'
    """
    from hessviz.app.state import shown

    path = Path(folder).expanduser()
    if not path.is_dir():
        return f"{shown(folder)} is not a folder on this server (models are never downloaded)."
    absent = [
        f
        for f, there in (
            ("config.json", (path / "config.json").is_file()),
            ("*.safetensors weights", any(path.glob("*.safetensors"))),
        )
        if not there
    ]
    if absent:
        return f"{shown(folder)} has no {' and no '.join(absent)}: it is not a checkpoint folder."
    return ""


def trained_for_similarity(folder: str) -> bool:
    """Was the checkpoint in ``folder`` trained as a sentence embedder (the cosine objective is its own)?
    A sentence-transformers folder says so (``config_sentence_transformers.json`` or ``modules.json``,
    as all-MiniLM-L6-v2's); a BERT trained on language modelling (pydoc-postln) has neither."""
    path = Path(folder)
    return any((path / f).is_file() for f in ("config_sentence_transformers.json", "modules.json"))


def default_layer(n_layers: int) -> int:
    return min(3, n_layers - 1)


def slice_name(cfg: BlockConfig, weight: str, head: int) -> str:
    """The slice of ``weight`` that query head ``head`` uses: ``W_K[g]`` / ``W_V[g]`` of the key/value
    head it reads, ``g = head // (n_heads / n_kv_heads)`` (grouped-query attention), else ``weight[head]``."""
    from hessviz.block.config import KV_HEADED

    if weight in KV_HEADED:
        head //= cfg.kv_group
    return f"{weight}[{head}]"


def row_counts(rows: int, cols: int) -> list[int]:
    """The numbers of rows of a ``rows × cols`` slice a window may hold (≤ :data:`WINDOW_MAX` entries)."""
    return [k for k in ROW_COUNTS if k <= rows and k * cols <= WINDOW_MAX] or [1]


def default_rows(rows: int, cols: int) -> int:
    """The most rows within :data:`WINDOW_DEFAULT` entries (one row at least)."""
    counts = row_counts(rows, cols)
    return max([k for k in counts if k * cols <= WINDOW_DEFAULT] or [counts[0]])


def _free(what: str) -> budget.Verdict:
    """The verdict on a result already at hand (precomputed or cached): no work."""
    return budget.Verdict(True, cost.Cost(0.0, 0, what), "", "")


def shorter(vocab: int) -> str:
    """The changes that lower every view's work on this page, the one that always works last: a shorter
    text, and under a next-token loss (``vocab``: its head's tokens) the synthetic loss, which has no
    LM head."""
    return "a shorter text, or Loss = synthetic (no LM head)" if vocab else "a shorter text"


def window_rows(
    cfg: BlockConfig,
    name: str,
    n_rows: int,
    lim: Limits,
    ready: Callable[[int], bool] = lambda rows: False,
    vocab: int = 0,
) -> tuple[int, budget.Verdict]:
    """``(rows, verdict)``: ``n_rows`` when a window of that many rows of ``name`` is ``ready``
    (precomputed or cached) or fits ``lim``, else the most rows that do (the verdict is that of the
    rows returned; not ok when not even one row fits: its advice then names only what can help,
    a shorter text or the synthetic loss). ``vocab``: the LM head's tokens under a next-token loss."""
    cols = cfg.shape_of(name)[1]
    for k in [n_rows] + [k for k in reversed(row_counts(*cfg.shape_of(name))) if k < n_rows]:
        if ready(k):
            return k, _free(f"the exact Hessian block of {k * cols:,} entries (at hand)")
        verdict = budget.check(
            cost.real_window_cost(cfg, name, k * cols, vocab),
            lim,
            cfg,
            f"Choose {shorter(vocab)}." if k == 1 else f"Choose fewer rows of {name}, or {shorter(vocab)}.",
        )
        if verdict.ok:
            return k, verdict
    return k, verdict


def reduced_table(
    cfg: BlockConfig,
    by_head: bool,
    part: str,
    samples: int,
    lim: Limits,
    ready: Callable[[tuple[str, ...], int], bool] = lambda blocks, samples: False,
    vocab: int = 0,
) -> tuple[str, int, budget.Verdict]:
    """``(part, samples, verdict)``: the chosen part and products when they are ``ready`` or fit
    ``lim``, else the first smaller choice that does: fewer products (:data:`FEWEST_SAMPLES`), then
    each single part of the layer (:data:`hessviz.pretrained.explore.PARTS`). Not ok (with the
    verdict on the choice) when nothing fits: none of those is then worth naming, and its advice is
    what is left (:func:`shorter`). ``vocab``: the LM head's tokens under a next-token loss."""
    tries = [(part, samples), (part, FEWEST_SAMPLES)]
    tries += [(p, s) for p in explore.PARTS[1:] if p != part for s in (samples, FEWEST_SAMPLES)]
    first = None
    for p, s in tries:
        blocks = explore.part_blocks(cfg, by_head, p)
        if not blocks:
            continue
        if ready(tuple(n for n, _ in blocks), s):
            return p, s, _free(f"the table of {len(blocks)} blocks (at hand)")
        verdict = budget.check(
            cost.real_table_cost(cfg, blocks, s, vocab), lim, cfg, f"Choose {shorter(vocab)}."
        )
        first = first or (part, samples, verdict)
        if verdict.ok:
            return p, s, verdict
    return first


def default_views(model: str, text: str = DEFAULT_TEXT, say: Callable[[str], None] = print) -> dict:
    """Compute (through :mod:`hessviz.app.cache`) the default view of ``model`` for each head:
    tokens, attention, the default window of each weight in :data:`PRECOMPUTED_WEIGHTS`, the
    gradients (by weight and by head) and the block table of every weight; returns the seconds of each."""
    from hessviz import pretrained

    info = pretrained.model_info(model)
    layer, seed, loss = default_layer(info.n_layers), 0, real_cache.SYNTHETIC
    cfg = real_cache.real_config(model, text)
    seconds = {}

    def timed(what: str, fn: Callable[[], object]) -> None:
        t = time.perf_counter()
        fn()
        seconds[what] = round(time.perf_counter() - t, 2)
        say(f"  {model} {what}: {seconds[what]:.2f} s")

    timed("attention", lambda: real_cache.real_attention(model, layer, text))
    for h in range(info.n_heads):
        for weight in PRECOMPUTED_WEIGHTS:
            name = f"{weight}[{h}]"
            if h >= len(cfg.head_names(weight)):  # grouped-query: fewer key/value heads
                continue
            rows, cols = cfg.shape_of(name)
            size = default_rows(rows, cols) * cols
            timed(
                f"window {name}",
                lambda name=name, size=size: real_cache.real_window(
                    model, layer, text, seed, name, 0, size, DEFAULT_TERM, loss
                ),
            )
    for by_head in (False, True):
        timed(
            f"gradients by_head={by_head}",
            lambda b=by_head: real_cache.real_gradients(model, layer, text, seed, b, loss),
        )
    blocks = tuple(n for n, _ in explore.part_blocks(cfg, False, DEFAULT_PART))
    timed(
        "table",
        lambda: real_cache.real_block_table(model, layer, text, seed, DEFAULT_TERM, blocks, SAMPLES, loss),
    )
    return seconds


def precompute(
    models: Sequence[str],
    path: Path,
    command: str = "",
    text: str = DEFAULT_TEXT,
    say: Callable[[str], None] = print,
) -> int:
    """The default views of ``models`` on ``text`` (:func:`default_views`) saved to ``path``; returns
    its bytes. Nothing is read from an earlier file: every entry is computed here."""
    import hessviz

    saved = real_cache.PRECOMPUTED
    real_cache.PRECOMPUTED = None
    cache.clear()
    try:
        seconds = {m: default_views(m, text, say=say) for m in models}
        entries = real_cache.real_results()
    finally:
        real_cache.PRECOMPUTED = saved
    return precomputed.save(
        path, entries, precomputed.made(hessviz.__version__, command, models, text, seconds)
    )
