"""The Real model and Whole model pages' results, stored as every result of the app is
(:func:`hessviz.app.cache.stored`).

Each result of the Real model page has a key of plain values that names exactly what it
depends on (:mod:`hessviz.pretrained.precomputed`): the attention does not depend on the
loss or the target seed, nothing under a model's own loss depends on the seed (its key holds
``None``), and the Hutch++ probes of the block table have their own fixed seed, so a change
of target seed recomputes only what the target enters. A key found in the precomputed file
(:data:`PRECOMPUTED`) is read from it without loading the model; the store keeps the others
under ``("real",) + key``. The checkpoint's weights, hidden states and output head are stored
under their own names (``real_stack``, ``real_layer``, ``real_states``, ``real_head``) and shared
by every visitor and page.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np
import torch

import hessviz as hv
from hessviz.app import cache, progress, whole_model
from hessviz.app.state import device
from hessviz.checks import cost
from hessviz.losses import mean_pooled, names
from hessviz.pretrained import explore, precomputed

# ----------------------------------------------------------------------------- the store's wrapper for these

PRECOMPUTED: Path | None = precomputed.FILE
"""The precomputed views the Real model page reads first (None: compute everything)."""
TABLE_SEED = 0
"""Seed of the block table's Lanczos start and Hutch++ probes (not the target's)."""
SYNTHETIC = names.SYNTHETIC
"""The loss key of the app's synthetic target; ``"cosine:<other sentence>"`` and ``"next_token"``
name a model's own objective (:mod:`hessviz.losses.names`, on the last layer)."""


def _precomputed(key: tuple, **_: object) -> dict | None:
    return None if PRECOMPUTED is None else precomputed.lookup(key, PRECOMPUTED)


real = functools.partial(cache.stored, first=_precomputed, prefix=("real",))
""":func:`hessviz.app.cache.stored` for a result of the Real model page: its precomputed entry
(:data:`PRECOMPUTED`) first, else the store's under ``("real",) + key``."""


def target_seed(loss: str, seed: int) -> int | None:
    """The seed a result under ``loss`` depends on: the synthetic target's, or None (a model's own loss)."""
    return int(seed) if loss == SYNTHETIC else None


def result_key(kind: str, model: str, text: str, layer: int, loss: str, seed: int, *rest: object) -> tuple:
    """The key of a result that depends on the loss: ``(kind, model, text, layer, loss, the target's
    seed or None, *rest)`` (:mod:`hessviz.pretrained.precomputed`'s layout)."""
    return (kind, model, text, int(layer), loss, target_seed(loss, seed), *rest)


# ----------------------------------------------------------------------------- a model's weights and states


def head_vocab(model: str, loss: str) -> int:
    """The vocabulary of ``model``'s LM head when ``loss`` is its next-token loss (the head's work enters
    every estimate, :func:`hessviz.checks.cost.head_cost`), else 0."""
    from hessviz import pretrained

    return pretrained.model_info(model).vocab_size if names.kind(loss) == names.NEXT_TOKEN else 0


def stack_bytes(model: str) -> int:
    """Bytes of every layer of ``model`` in float64 (what :func:`real_stack` holds)."""
    from hessviz import pretrained

    info = pretrained.model_info(model)
    return info.n_layers * info.block.num_params * 8


def stack_fits(model: str) -> bool:
    """Are all of ``model``'s layers kept in memory (:func:`real_stack`, within half of this server's
    results)? If not (SmolLM2's 810 MiB on the hosted profile), its layers are read one at a time for
    the hidden states and only the layer drawn is kept (:func:`real_layer`)."""
    return stack_bytes(model) <= cache.LEDGER.capacity // 2


def real_setup_seconds(model: str, text: str) -> float:
    """Estimated seconds to read ``model``'s layers and run ``text`` through them (0 once done)."""
    if ("real_states", model, text) in cache.STORE:
        return 0.0
    from hessviz import pretrained

    info = pretrained.model_info(model)
    return cost.real_setup_seconds(info.n_layers * info.block.num_params)


def real_ready(key: tuple) -> bool:
    """Is the result of ``key`` (:func:`window_key`, :func:`table_key`) precomputed or cached, so that
    drawing it costs no work (a server's budget need not be asked)?"""
    return ("real",) + key in cache.STORE or _precomputed(key) is not None


def real_results() -> dict[tuple, dict]:
    """Every Real model result in the store now, by its key (what ``scripts/precompute_real.py`` saves)."""
    return {k[1:]: v for k, v in cache.STORE.items() if k[0] == "real"}


@cache.stored(stack_bytes, "the weights of {model}")
def real_stack(model: str) -> list:
    """Every layer of the checkpoint ``model`` (:func:`hessviz.pretrained.load_model`, float64, on
    the app's device), read once per server and shared by every visitor and text."""
    from hessviz import pretrained

    return pretrained.load_model(model, device=device())


def _layer_bytes(model: str, layer: int) -> int:
    from hessviz import pretrained

    return 8 * pretrained.model_info(model).block.num_params


@cache.stored(_layer_bytes, "layer {layer} of {model}", kind="real_layer")
def _real_layer_alone(model: str, layer: int) -> tuple:
    from hessviz import pretrained

    return pretrained.load_layer(model, layer, device=device())


def real_layer(model: str, layer: int) -> tuple:
    """``(cfg, params)`` of one layer of ``model``: from :func:`real_stack` where it fits this server,
    else read alone (float64) and kept by itself."""
    if stack_fits(model):
        return real_stack(model)[layer]
    return _real_layer_alone(model, layer)


def _states_bytes(model: str, text: str) -> int:
    from hessviz import pretrained

    info = pretrained.model_info(model)
    size = (info.n_layers + 1) * len(real_tokens(model, text)) * info.d_model * 8
    if not stack_fits(model):  # read one layer at a time: the layer being read and its forward pass
        size += 8 * info.block.num_params + cost.forward_bytes(real_config(model, text))
    return size


@cache.stored(_states_bytes, "the hidden states of the text in {model}")
def real_states(model: str, text: str) -> dict:
    """``{"ids", "tokens", "states"}`` of ``text`` in ``model``: its token ids and strings and every
    hidden state ``X_0 … X_n`` (``(n+1, L, d)`` numpy), from the layers in :func:`real_stack`."""
    from hessviz import pretrained

    ids = pretrained.token_ids(model, text)
    layers = real_stack(model) if stack_fits(model) else None  # else read one layer at a time
    states = pretrained.hidden_states(model, ids, layers=layers, device=device())
    return {
        "ids": np.array(ids),
        "tokens": pretrained.token_strings(model, ids),
        "states": torch.stack(states).cpu().numpy(),
    }


@real(1 << 12, "the tokens", kind="tokens", field="tokens")
def real_tokens(model: str, text: str) -> list[str]:
    """The tokens of ``text`` in ``model`` as its tokenizer writes them (no weights read)."""
    from hessviz import pretrained

    return {"tokens": pretrained.token_strings(model, text)}


def real_config(model: str, text: str) -> hv.BlockConfig:
    """A layer of ``model`` as a block whose ``seq_len`` is the length of ``text`` (no weights read)."""
    from hessviz import pretrained

    return dataclasses.replace(pretrained.model_info(model).block, seq_len=len(real_tokens(model, text)))


def real_inputs(
    model: str, layer: int, text: str, seed: int, loss: str = SYNTHETIC, blocks: bool = False
) -> tuple:
    """``(cfg, params, X, Y, custom)`` of layer ``layer`` on ``text``: ``cfg.seq_len`` is the text's
    length, ``X`` the hidden state entering the layer. With ``loss = "synthetic"``, ``Y`` is the app's
    synthetic target (seeded :func:`hessviz.sample_inputs` for the layer's loss, ``mse``:
    ``Y ~ N(0, 1)``) and ``custom`` is None; otherwise ``Y`` is None and ``custom`` the model's own
    objective at the layer's output as a :class:`hessviz.CustomLoss` (the last layer only), its
    curvature as token-wise blocks only with ``blocks`` (where the products to come pay for building
    them, :func:`hessviz.checks.cost.head_blocks`; a gradient builds none), else as its product."""
    from hessviz import pretrained

    cfg, params = real_layer(model, layer)
    states = real_states(model, text)
    X = cache.as_tensor(states["states"][layer]).to(device())
    cfg = dataclasses.replace(cfg, seq_len=X.shape[0])
    if not names.own(loss):
        _, Y = hv.sample_inputs(cfg, seed=seed, device=device())
        return cfg, params, X, Y, None
    last = pretrained.model_info(model).n_layers - 1
    if layer != last:
        raise hv.ConfigError(
            f"loss {names.kind(loss)!r} is the model's objective on its last hidden states: "
            f"choose layer {last}"
        )
    Z = cache.as_tensor(states["states"][layer + 1]).to(device())
    obj = names.objective(
        loss, lambda other: mean_pooled(cache.as_tensor(real_states(model, other)["states"][-1]).to(device()))
    )
    at = obj.at_text(Z, states["ids"].tolist(), real_head(model) if obj.reads_head else None)
    return cfg, params, X, None, at.custom_loss(blocks)


def _head_bytes(model: str) -> int:
    from hessviz import pretrained

    info = pretrained.model_info(model)
    return 8 * info.vocab_size * info.d_model


@cache.stored(_head_bytes, "the output head of {model}")
def real_head(model: str):
    """GPT-2's output head of ``model`` (``ln_f`` and the tied embedding), read once."""
    from hessviz.pretrained import objectives

    return objectives.lm_head(model)


# ----------------------------------------------------------------------------- the Real model page's results


def _attention_bytes(model: str, layer: int, text: str) -> int:
    cfg = real_config(model, text)
    return 8 * cfg.n_heads * cfg.seq_len**2


@real(
    _attention_bytes,
    "the attention pattern",
    key=lambda model, layer, text: ("attention", model, text, layer),
    field="A",
)
def real_attention(model: str, layer: int, text: str) -> np.ndarray:
    """``(H, L, L)`` attention weights of every head of the layer on the text (no loss, no seed)."""
    cfg, params, X, _, _ = real_inputs(model, layer, text, 0)
    return {"A": explore.attention_pattern(cfg, params, X).cpu().numpy()}


def _window_blocks(model: str, text: str, size: int, loss: str) -> bool:
    """Whether the window's products pay for the head's token-wise blocks
    (:func:`hessviz.checks.cost.head_blocks`)."""
    return cost.head_blocks(real_config(model, text), head_vocab(model, loss), size, cost.product_calls(size))


@real(
    lambda model, layer, text, seed, name, start, size, term_name, loss: cost.real_window_cost(
        real_config(model, text), name, size, head_vocab(model, loss)
    ),
    "the Hessian block of {name}",
    key=lambda model, layer, text, seed, name, start, size, term_name, loss: result_key(
        "window", model, text, layer, loss, seed, name, start, size, term_name
    ),
    field="B",
)
def real_window(
    model: str,
    layer: int,
    text: str,
    seed: int,
    name: str,
    start: int,
    size: int,
    term_name: str = "full",
    loss: str = SYNTHETIC,
) -> np.ndarray:
    """``(size, size)``: the exact Hessian block of entries ``start …`` of the head slice ``name``
    (:func:`hessviz.pretrained.explore.window`, closed-form products)."""
    blocks = _window_blocks(model, text, size, loss)
    cfg, params, X, Y, custom = real_inputs(model, layer, text, seed, loss, blocks)
    reporter = progress.Reporter(0, 1, size, f"{name} block")
    return {"B": explore.window(cfg, params, X, Y, custom, name, start, size, term_name, progress=reporter)}


window_key = real_window.key_of
"""The key of :func:`real_window`'s result, from the same arguments."""


def _table_cost(model: str, text: str, blocks: tuple[str, ...], samples: int, loss: str):
    """The estimate of :func:`real_block_table` and whether its products pay for the head's blocks."""
    cfg = real_config(model, text)
    sized = [(b, cfg.param_size(cfg.sort_names((b,))[0])) for b in blocks]
    vocab = head_vocab(model, loss)
    c = cost.real_table_cost(cfg, sized, samples, vocab)
    return c, cost.head_blocks(cfg, vocab, c.products, cost.table_calls(sized, samples))


@real(
    lambda model, layer, text, seed, term_name, blocks, samples, loss: _table_cost(
        model, text, blocks, samples, loss
    )[0],
    "the heterogeneity table of layer {layer}",
    key=lambda model, layer, text, seed, term_name, blocks, samples, loss: result_key(
        "table", model, text, layer, loss, seed, term_name, tuple(blocks), samples
    ),
)
def real_block_table(
    model: str,
    layer: int,
    text: str,
    seed: int,
    term_name: str,
    blocks: tuple[str, ...],
    samples: int,
    loss: str = SYNTHETIC,
) -> dict:
    """:func:`hessviz.pretrained.explore.curvature_table` of the real layer: top eigenvalue and
    trace of each diagonal block in ``blocks``, matrix-free (probes from :data:`TABLE_SEED`)."""
    head_blocks = _table_cost(model, text, blocks, samples, loss)[1]
    cfg, params, X, Y, custom = real_inputs(model, layer, text, seed, loss, head_blocks)
    return explore.curvature_table(
        cfg,
        params,
        X,
        Y,
        custom,
        list(blocks),
        samples,
        term_name,
        seed=TABLE_SEED,
        progress=progress.Reporter(0, 1, len(blocks), f"{term_name} blocks"),
    )


table_key = real_block_table.key_of
"""The key of :func:`real_block_table`'s result, from the same arguments."""


@real(
    lambda model, layer, text, seed, by_head, loss: cost.real_gradient_cost(
        real_config(model, text), head_vocab(model, loss)
    ),
    "the gradient norms of layer {layer}",
    key=lambda model, layer, text, seed, by_head, loss: result_key(
        "gradients", model, text, layer, loss, seed, by_head
    ),
)
def real_gradients(
    model: str, layer: int, text: str, seed: int, by_head: bool, loss: str = SYNTHETIC
) -> dict:
    """``{"names", "norms", "sizes"}``: ``‖g_b‖_F`` of every block of the real layer (closed form)."""
    cfg, params, X, Y, custom = real_inputs(model, layer, text, seed, loss)
    names, norms, sizes = explore.gradient_blocks(cfg, params, X, Y, by_head, custom)
    return {"names": names, "norms": norms, "sizes": sizes}


# ----------------------------------------------------------------------------- whole models

WHOLE_PRECOMPUTED: Path | None = whole_model.FILE
"""The precomputed tables the Whole model page reads first (None: compute everything)."""


def whole_key(model: str, text: str, part: str) -> tuple:
    """The store's key of :func:`whole_table`'s result."""
    return ("whole", whole_model.key(model, text, part))


def whole_ready(model: str, text: str, part: str) -> bool:
    """Is the table precomputed or cached (drawing it costs no work)?"""
    return (
        whole_key(model, text, part) in cache.STORE
        or whole_model.lookup(model, text, part, WHOLE_PRECOMPUTED) is not None
    )


@cache.stored(
    lambda model, text, part, seconds: cost.Cost(seconds, 1 << 24, "the whole-model table"),
    "the whole-model table of {model}",
    key=lambda model, text, part, seconds: whole_key(model, text, part),
    first=lambda key, model, text, part, seconds: whole_model.lookup(model, text, part, WHOLE_PRECOMPUTED),
)
def whole_table(model: str, text: str, part: str, seconds: float = math.inf) -> dict:
    """:func:`hessviz.app.whole_model.table`: the per-tensor table of the whole ``model`` on ``text``
    under its own objective, ``part`` every weight or every head of one weight; the precomputed entry
    when there is one, else computed (``seconds``: its estimate, for the gate and the work bound) with a
    progress bar, and stopped when the visitor leaves or moves a control."""
    label = "every weight" if part == whole_model.WEIGHTS else f"every head of {part}"
    return whole_model.table(
        model, text, part, progress=progress.Reporter(0, 1, 1, f"Whole-model table, {label}")
    )
