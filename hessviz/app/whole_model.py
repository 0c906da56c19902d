r"""The Whole model page's defaults, its objectives, its cost estimate and its precomputed tables.

The page draws :func:`hessviz.whole.table.tensor_table` of a bundled model (``pydoc-*``) on a text,
under the model's own objective (:func:`objective_of`):

* the decoders with a head hessviz reads (``pydoc-llama``, ``pydoc-preln``): ``"next_token"``, the
  mean cross-entropy of every position predicting the next token through the final norm and the
  tied LM head;
* ``pydoc-postln`` (a causal BERT whose LM head has a transform, dense + GELU + LayerNorm, that
  hessviz does not read): an :class:`hessviz.Classifier` with ``pooling="last"`` whose ``W`` is the
  tied word embedding ``Eᵀ (d, V)`` and ``b`` the decoder's bias ``cls.predictions.bias``, on the text
  less its last token, labelled by that last token: the cross-entropy of predicting the text's last
  token from the last hidden state through the unembedding alone (no labelled task ships here).

Two *parts* are drawn: :data:`WEIGHTS` (every layer weight, one row each) and, for a headed weight
``w``, every ``l{i}.w[h]`` (one row per layer and head). :func:`table` computes one part;
:func:`precompute` computes the default text's parts of each model and writes them to
:data:`FILE` (``scripts/precompute_whole.py``), which the page reads first; another text's table is
computed live when it fits the server's budget (:func:`table_cost`: a short text fits the hosted 4 s).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from hessviz.checks.cost import Cost
from hessviz.matfree.estimates import lanczos_products
from hessviz.pretrained import precomputed
from hessviz.resources import data
from hessviz.whole.objective import objective_of

FILE = data("whole_tables.json")
"""The precomputed default tables (``scripts/precompute_whole.py``)."""
MODELS = ("pydoc-llama", "pydoc-preln", "pydoc-postln")
"""The models the page offers with precomputed default tables: the bundled ones trained here (small
enough for a whole table)."""
LARGE_MODELS = ("smollm2-135m", "gemma3-270m")
"""Bundled real LLMs the page offers too: SmolLM2-135M (30 layers, 106 M layer weights) and Gemma 3 270M
(18 layers, 100 M layer weights behind a 262,144-token head). Their tables are beyond every profile's
per-view budget, so the page draws the one stored with the package
(:mod:`hessviz.app.stored_tables`), and says so in one line (its cost estimate) where none is stored."""
DEFAULT_TEXT = "The sorted() function returns a new sorted list from the items in the iterable."
"""The page's default text (Python's help text is what the pydoc models were trained on)."""
MAX_CHARS = 300
WEIGHTS = "every weight"
"""The part of one row per layer weight; any other part is a headed weight's name (one row per head)."""
SAMPLES = 10
"""Hutch++ products per block larger than :data:`EXACT` entries (the trace)."""
EXACT = 256
"""Blocks up to this many entries are exact (the dense block's eigenvalues)."""
SEED = 0
STATS = {"top eigenvalue": "top", "trace": "trace", "gradient norm": "grad_norm"}
"""What the bars show, in words -> the table's column."""
WHOLE_COLUMN_S = 1.2e-3
WHOLE_PRODUCT_S = 8e-11
"""A product column through the whole model costs ``WHOLE_COLUMN_S + WHOLE_PRODUCT_S · L · P_stack``
seconds on one core (``P_stack``: every layer weight); calibrated on the pydoc models' tables at 6 and
21 tokens (``benchmarks/real_llm_estimates.py --whole``, ``benchmarks/REAL_LLM.md``). The former
``1e-9 · L · P_stack`` was 9-35× the measured CPU, and refused every typed text on the hosted profile."""
WHOLE_LANCZOS = 13
"""Products a large block's top eigenvalue takes in the table as it runs (9-18 measured)."""
EXACT_COLUMN_SHARE = 0.4
"""An exact small block's column costs this share of a product column (they go in batches)."""


def over_budget_advice(profile: str) -> str:
    """What a visitor can do when a table is over this server's budget, for this ``profile``: only
    commands and settings that exist and apply there.

    >>> "streamlit run" in over_budget_advice("hosted"), "HESSVIZ_MAX_SECONDS" in over_budget_advice("local")
    (True, True)
    """
    first = "The default text is precomputed for every model: clear the text box to draw it"
    if profile == "local":
        return (
            f"{first}, use a shorter text, or start this server with a larger budget per view, e.g. "
            "`HESSVIZ_MAX_SECONDS=300 streamlit run app.py` (a progress bar shows the table's progress)."
        )
    return (
        f"{first}, or use a shorter text. On your own machine (`streamlit run app.py`, the local "
        "profile) a table like this one is computed with a progress bar."
    )


def stack_config(info):
    """The stack of every layer of the model described by ``info`` (:func:`hessviz.pretrained.model_info`),
    as :func:`hessviz.load_model` builds it, without reading a weight."""
    import dataclasses

    return dataclasses.replace(info.block, n_layers=info.n_layers)


def tensors(cfg, part: str) -> tuple[str, ...]:
    """The tensors of ``part`` in the stack ``cfg``: every layer weight, or every head of one weight."""
    if part == WEIGHTS:
        return tuple(f"l{i}.{n}" for i in range(cfg.n_layers) for n in cfg.block.param_names)
    return tuple(h for i in range(cfg.n_layers) for h in cfg.head_names(f"l{i}.{part}"))


def headed(cfg) -> tuple[str, ...]:
    """The weights of a layer that have heads (the per-head parts)."""
    return tuple(n for n in cfg.block.param_names if cfg.block.is_headed(n))


def table_cost(cfg, names: Sequence[str], L: int) -> Cost:
    """Core-seconds and bytes of the table of ``names`` at ``L`` tokens: per block up to :data:`EXACT`
    entries its size in columns (:data:`EXACT_COLUMN_SHARE` of a column's cost each), else
    :data:`WHOLE_LANCZOS` Lanczos and :data:`SAMPLES` Hutch++ columns, each column
    ``WHOLE_COLUMN_S + WHOLE_PRODUCT_S · L · P_stack`` s. The products counted (``products``) bound
    Lanczos by :func:`~hessviz.matfree.estimates.lanczos_products`, as memory is sized. Memory: the tape
    of every layer (~12 vectors of ``L d`` and ``L²`` per head) and 24 vectors of the largest block."""
    sizes = [cfg.param_size(n) for n in names]
    columns = sum(n if n <= EXACT else lanczos_products(1) + SAMPLES for n in sizes)
    exact = sum(n for n in sizes if n <= EXACT)
    large = sum(WHOLE_LANCZOS + SAMPLES for n in sizes if n > EXACT)
    P = cfg.num_params
    seconds = (WHOLE_COLUMN_S + WHOLE_PRODUCT_S * L * P) * (large + EXACT_COLUMN_SHARE * exact)
    tape = cfg.n_layers * 12 * L * (cfg.d_model + cfg.d_ff + cfg.n_heads * L)
    return Cost(
        seconds,
        8 * (4 * P + tape + 24 * max(sizes)),
        f"the table of {len(names)} tensors ({columns:,} products)",
        columns,
    )


def exact_count(table: dict) -> int:
    """How many of a drawn table's rows are exact (their block small enough to compute densely)."""
    return sum(bool(e) for e in table["exact"])


def arrays(table) -> dict:
    """A :class:`hessviz.whole.table.TensorTable` as plain lists (what the page draws, caches, saves)."""
    rows = table.rows
    return {
        "names": [r.name for r in rows],
        "size": [r.size for r in rows],
        "top": [r.top for r in rows],
        "trace": [r.trace for r in rows],
        "trace_se": [r.trace_stderr for r in rows],
        "grad_norm": [r.grad_norm for r in rows],
        "exact": [bool(r.exact) for r in rows],
        "matvecs": int(table.matvecs),
        "seconds": round(float(table.seconds), 3),
    }


def table(model_name: str, text: str, part: str, progress: Callable | None = None) -> dict:
    """The table of ``part`` for ``model_name`` on ``text`` under its own objective: :func:`arrays`
    and ``objective`` (in words), ``tokens`` (the ids used) and ``value`` (the objective's value)."""
    import hessviz as hv
    from hessviz import pretrained
    from hessviz.whole.table import tensor_table

    model = hv.load_model(model_name)
    ids = pretrained.token_ids(model_name, text)
    objective, used, words = objective_of(model, ids)
    names = tensors(model.cfg, part)
    res = hv.model_hessian(model, torch.tensor(used), objective=objective, wrt=_wrt(model.cfg, part))
    t = tensor_table(
        res, tensors=names, trace_samples=SAMPLES, exact_limit=EXACT, seed=SEED, progress=progress
    )
    return {**arrays(t), "objective": words, "tokens": len(used), "value": float(res.value)}


def _wrt(cfg, part: str) -> tuple[str, ...]:
    """The weights the Hessian is taken in: every weight, or the headed weight in every layer."""
    return tensors(cfg, WEIGHTS) if part == WEIGHTS else tuple(f"l{i}.{part}" for i in range(cfg.n_layers))


def parts(model_name: str) -> tuple[str, ...]:
    """Every part of ``model_name``: :data:`WEIGHTS` and each headed weight."""
    from hessviz import pretrained

    return (WEIGHTS,) + headed(pretrained.model_info(model_name).block)


def key(model_name: str, text: str, part: str) -> str:
    """The entry's key in :data:`FILE` (every setting it depends on)."""
    return json.dumps([model_name, text, part, SAMPLES, EXACT, SEED])


def lookup(model_name: str, text: str, part: str, path: Path | None = FILE) -> dict | None:
    """The precomputed entry, or None (no file, or not this view)."""
    if path is None or not Path(path).is_file():
        return None
    return _read(str(path), Path(path).stat().st_mtime)["entries"].get(key(model_name, text, part))


_FILES: dict[tuple[str, float], dict] = {}


def _read(path: str, mtime: float) -> dict:
    if (path, mtime) not in _FILES:
        _FILES.clear()
        _FILES[(path, mtime)] = json.loads(Path(path).read_text())
    return _FILES[(path, mtime)]


def precompute(
    models: Sequence[str],
    path: Path,
    command: str = "",
    text: str = DEFAULT_TEXT,
    say: Callable[[str], None] = print,
) -> int:
    """Every part of each of ``models`` on ``text`` (:func:`table`), written to ``path`` as JSON; returns
    its bytes. Nothing is read from an earlier file."""
    import hessviz

    entries, seconds = {}, {}
    for m in models:
        for p in parts(m):
            t0 = time.perf_counter()
            entries[key(m, text, p)] = table(m, text, p)
            seconds[f"{m} {p}"] = round(time.perf_counter() - t0, 2)
            say(f"  {m} {p}: {seconds[f'{m} {p}']:.2f} s")
    made = precomputed.made(
        hessviz.__version__, command, models, text, seconds, samples=SAMPLES, exact=EXACT, seed=SEED
    )
    data = json.dumps({"made": made, "entries": entries}, indent=0, sort_keys=True)
    Path(path).write_text(data + "\n")
    return len(data) + 1


def split(names: Sequence[str]) -> tuple[list[int], list[str]]:
    """``(layer, name inside the layer)`` of each ``l{i}.…`` name."""
    layers, local = [], []
    for n in names:
        layer, _, rest = n.partition(".")
        layers.append(int(layer[1:]))
        local.append(rest)
    return layers, local


def by_layer(names: Sequence[str], values: Sequence[float]) -> tuple[list[str], dict[str, np.ndarray]]:
    """``(categories, {"layer i": one value per category})``: the bars of a table, one group per layer
    (NaN where a layer lacks a category)."""
    layers, local = split(names)
    cats = list(dict.fromkeys(local))
    out = {f"layer {i}": np.full(len(cats), np.nan) for i in sorted(set(layers))}
    for i, n, v in zip(layers, local, values):
        out[f"layer {i}"][cats.index(n)] = v
    return cats, out
