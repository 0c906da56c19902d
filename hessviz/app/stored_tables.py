"""The real LLMs' stored per-tensor tables (``hessviz/data/claims/smollm2/``, ``…/gemma3/``) as the app's
pages draw them.

A table is not computed by the server (SmolLM2-135M's every weight of 30 layers at d = 576 is most of an
hour of two cores, Gemma 3 270M's 18 layers through its 262,144-token head as long):
:mod:`hessviz.experiments.llm_table` computed each once, on a fixed text, and the Whole model,
Heterogeneity and Optimization pages read the files on every profile:

* ``table.json``: the top eigenvalue (and gradient norm) of each tensor the run reached,
  every weight of the layers in ``weight_layers``, every head of ``W_Q, W_K, W_V, W_O`` in
  ``head_layers``;
* ``gradients.json``: the gradient norm of every weight and head of every layer (one backward);
* ``claims.json``: the model's claims (``hessviz reproduce --smollm2``, ``--gemma3``), among them the
  Gini with its interval (:func:`~hessviz.experiments.llm.gini_id`).

:func:`part` returns what :func:`hessviz.app.whole_model.arrays` returns for a live table, with NaN
where the run did not reach a tensor (and no trace: the run computed none), so the pages draw both
alike. Any missing or malformed file is one :class:`~hessviz.errors.InputError` line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from hessviz.errors import InputError
from hessviz.experiments.llm import gini_id, reproduce_command, sharpness_id  # noqa: F401  (the pages')
from hessviz.experiments.llm_table import FOLDERS, stored

MODELS = {m: stored(m) for m in FOLDERS if (stored(m) / "table.json").is_file()}
"""Bundled models whose table is stored rather than computed, and where."""
WEIGHTS = "every weight"

_CACHE: dict[tuple[str, float], dict] = {}


def _json(path: Path) -> dict:
    """``path`` parsed (cached by modification time), or an :class:`InputError` naming it."""
    try:
        key = (str(path), path.stat().st_mtime)
    except OSError:
        raise InputError(f"{path.name} is missing from {path.parent} (its run writes it)") from None
    if key not in _CACHE:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"{path.name} in {path.parent} cannot be read: {e}") from None
        if not isinstance(data, dict):
            raise InputError(f"{path.name} in {path.parent} is not a JSON object")
        _CACHE[key] = data
    return _CACHE[key]


def load(model: str, where: Path | None = None) -> dict:
    """The stored table of ``model`` (``table.json`` with ``gradients.json``'s norms as ``grad``)."""
    if model not in MODELS:
        raise InputError(f"model {model!r} has no stored table (stored: {', '.join(MODELS)})")
    d = MODELS[model] if where is None else Path(where)
    t = _json(d / "table.json")
    for k in ("rows", "weight_layers", "head_layers", "tokens", "text"):
        if k not in t:
            raise InputError(f"table.json in {d}: field {k!r} is missing")
    grads = _json(d / "gradients.json").get("grad", {}) if (d / "gradients.json").is_file() else {}
    return {**t, "grad": grads}


def claims(model: str, where: Path | None = None) -> dict[str, dict]:
    """The stored claim entries of ``model`` by id (``claims.json``), ``{}`` when absent."""
    d = MODELS.get(model) if where is None else Path(where)
    if d is None or not (d / "claims.json").is_file():
        return {}
    try:
        entries = json.loads((d / "claims.json").read_text())
        return {r["id"]: r for r in entries}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"claims.json in {d} cannot be read: {e}") from None


def part(stored: dict, cfg, which: str) -> dict:
    """The rows of ``which`` (:data:`WEIGHTS`, or a headed weight: its heads in every layer) of the
    stack ``cfg``, in :func:`hessviz.app.whole_model.arrays`' format: ``top`` NaN where the run did
    not reach the tensor, ``grad_norm`` from the gradients (every layer) or the table."""
    if which == WEIGHTS:
        names = [f"l{i}.{w}" for i in range(cfg.n_layers) for w in _layer_weights(cfg)]
    else:
        names = [h for i in range(cfg.n_layers) for h in cfg.head_names(f"l{i}.{which}")]
    rows, grads = stored["rows"], stored["grad"]
    top = [float(rows[n]["top"]) if n in rows else math.nan for n in names]
    grad = [
        float(grads[n]) if n in grads else float(rows[n]["grad"]) if n in rows else math.nan for n in names
    ]
    matvecs = sum(int(rows[n]["matvecs"]) for n in names if n in rows)
    seconds = sum(float(rows[n]["seconds"]) for n in names if n in rows)
    return {
        "names": names,
        "size": [cfg.param_size(n) for n in names],
        "top": top,
        "trace": [math.nan] * len(names),
        "trace_se": [math.nan] * len(names),
        "grad_norm": grad,
        "exact": [False] * len(names),
        "matvecs": matvecs,
        "seconds": round(seconds, 1),
        "reached": sum(n in rows for n in names),
    }


def _layer_weights(cfg) -> list[str]:
    """The weights of one layer of the stack ``cfg`` (``W_Q`` … ``ln2_gamma``), in θ order."""
    return [n.partition(".")[2] for n in cfg.param_names if n.startswith("l0.")]


def describe(stored: dict, n_layers: int) -> str:
    """The stored run of a stack of ``n_layers`` layers in one sentence."""
    heads = sorted(stored["head_layers"])
    source = "; ".join(stored.get("sources", [])[:1])
    return (
        f'{stored["tokens"]} tokens of "{stored["text"][:70]}…" ({source}), next-token loss; top '
        f"eigenvalues for every weight of {len(stored['weight_layers'])} of {n_layers} layers and every head "
        f"of layers {', '.join(map(str, heads)) or 'none'}, Lanczos to about 1 % "
        f"({stored.get('dtype', 'float32')}); gradient norms for every layer."
    )
