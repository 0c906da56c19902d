r"""What the "Real model" page draws for one layer of a real model on one text (no Streamlit).

* :func:`attention_pattern` ``(cfg, params, X) -> A (H, L, L)``: each head's attention weights
  ``A_h = softmax(Q_h K_hᵀ / √d_k)`` on the layer's input (after ``ln1`` in a Pre-LN layer),
  from the same forward record :func:`hessviz.hessian` uses;
* :func:`slice_window` ``(res, name, start, size) -> (size, size)``: the exact block
  ``H[S, S]`` of a head slice (``W_Q[h]`` …) for a window ``S`` of its entries, read column
  by column from closed-form Hessian-vector products (``H e_j``, ``size`` products; no
  ``P × P`` matrix, no autograd). The slice's entries are in ``vec_r`` order, so for
  ``W_Q[h] (d, d_k)`` a window of ``m · d_k`` entries starting at ``i · d_k`` is input
  features ``i … i+m−1`` × the head's ``d_k`` columns;
* :func:`gradient_blocks` ``(cfg, params, X, Y, by_head) -> (names, norms, sizes)``: ``‖g_b‖_F``
  of every weight (or every head of a weight with heads) from the closed-form gradient, for
  the Gini coefficient :func:`hessviz.fitting.gini`.

The loss is the block's own (``cfg.loss``) against the target ``Y`` given; the page uses the
app's synthetic seeded target.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

import hessviz as hv
from hessviz.budget import EXACT_BLOCK, Cost, block_list, lanczos_products
from hessviz.config import BlockConfig
from hessviz.errors import ConfigError
from hessviz.record import record

Progress = Callable[[int, int | None, str], None]
WINDOW_CHUNK = 64
"""Columns per closed-form product call in :func:`slice_window` (progress between chunks)."""
PRODUCT_S = 2.1e-10
"""Seconds per product column per ``L · P`` on one core, measured on MiniLM's layer 3 at 29 tokens
(1 thread: 12 ms per column of ``W_Q[0]``'s window, 5 ms per single product of ``W_1``). The
generic :func:`hessviz.budget.matvec_cost` is calibrated on the paper's blocks and over-estimates
a real layer's batched products about 20-fold."""


def attention_pattern(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """``(H, L, L)``: row ``i`` of head ``h`` is how token ``i`` spreads its attention over the tokens."""
    return record(cfg, params, X).attention.A


def check_window(cfg: BlockConfig, name: str, start: int, size: int) -> tuple[int, int]:
    """``(start, size)`` checked against the slice ``name`` (raises :class:`ConfigError`)."""
    n = cfg.param_size(cfg.sort_names((name,))[0])
    for field, value, lo, hi in (("size", size, 1, n), ("start", start, 0, n - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ConfigError(f"{field} must be an integer in [{lo}, {hi}] for {name} ({n} entries), "
                              f"got {value!r}")
    if start + size > n:
        raise ConfigError(f"start + size must be ≤ {n} (the entries of {name}), got {start} + {size}")
    return start, size


def slice_window(res: hv.HessianResult, name: str, start: int, size: int, term: str = "full",
                 progress: Progress | None = None) -> Tensor:
    """``(size, size)``: ``H[S, S]`` for entries ``start … start+size−1`` of ``name`` (a weight or a
    head slice that ``res`` was computed for), from ``size`` closed-form products ``H e_j``."""
    start, size = check_window(res.cfg, name, start, size)
    mf = res.products
    layout = mf.layout((name,))
    window = torch.arange(start, start + size, device=mf.X.device)
    columns = []
    for first in range(0, size, WINDOW_CHUNK):
        idx = window[first:first + WINDOW_CHUNK]
        E = mf.X.new_zeros(idx.numel(), layout.size)
        E[torch.arange(idx.numel()), idx] = 1.0
        columns.append(mf.product(E, term, layout, layout)[:, window])
        if progress is not None:
            progress(first + idx.numel(), size, f"{first + idx.numel()} of {size} products")
    return torch.cat(columns).T


def gradient_blocks(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor | None,
                    by_head: bool = True, loss: hv.CustomLoss | None = None
                    ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(names, ‖g_b‖_F, sizes)`` of every block of :func:`hessviz.budget.block_list` (every weight,
    or every head's slice of a weight with heads), from the closed-form gradient of the layer's
    loss against ``Y``, or of ``loss`` (a custom loss, ``Y = None``)."""
    grads = {n: g.reshape(-1) for n, g in hv.gradient(cfg, params, X, Y, loss=loss).items()}
    names, norms, sizes = [], [], []
    for name, size in block_list(cfg, by_head):
        base = name.partition("[")[0]
        g = grads[base] if name == base else grads[base][cfg.head_indices(name).to(grads[base].device)]
        names.append(name)
        norms.append(float(g.norm()))
        sizes.append(size)
    return names, np.asarray(norms), np.asarray(sizes)


def product_seconds(cfg: BlockConfig, columns: int) -> float:
    """Estimated seconds of ``columns`` closed-form product columns on a real layer (:data:`PRODUCT_S`)."""
    return PRODUCT_S * cfg.seq_len * cfg.num_params * columns


def window_cost(cfg: BlockConfig, size: int) -> Cost:
    """Work of :func:`slice_window` for ``size`` entries: ``size`` product columns."""
    return Cost(product_seconds(cfg, size), 8 * size * size + 4 * 8 * WINDOW_CHUNK * cfg.num_params,
                f"the exact Hessian block of {size:,} entries ({size:,} products)")


def table_cost(cfg: BlockConfig, by_head: bool, samples: int) -> Cost:
    """Work of :func:`hessviz.matfree.block_table` on a real layer: per block ≤ ``EXACT_BLOCK``
    entries its size in columns, per larger block Lanczos (:func:`hessviz.budget.lanczos_products`
    single products) and ``samples`` Hutch++ columns."""
    blocks = block_list(cfg, by_head)
    columns = sum(n if n <= EXACT_BLOCK else lanczos_products(1) + samples for _, n in blocks)
    return Cost(product_seconds(cfg, columns), 8 * 24 * cfg.num_params,
                f"the table of {len(blocks)} blocks ({columns:,} products)")
