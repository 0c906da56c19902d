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
  the Gini coefficient :func:`hessviz.laws.fitting.gradient_summary`;
* :func:`window` the same block from the layer's inputs, as numpy; :func:`window_summary` its
  eigenvalues in four numbers;
* :func:`curvature_table` ``(cfg, params, X, Y, custom, blocks, samples) -> dict``: top
  eigenvalue and trace of every diagonal block ``H[b, b]`` (:func:`hessviz.matfree.block_table`),
  of one part of the layer (:func:`part_blocks`); which have no curvature is
  :func:`hessviz.matfree.estimates.block_spread`.

The loss is the block's own (``cfg.loss``) against the target ``Y`` given; the page uses the
app's synthetic seeded target.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from hessviz.api import gradient, hessian
from hessviz.block.config import BlockConfig
from hessviz.dense.record import record
from hessviz.errors import ConfigError
from hessviz.losses import CustomLoss
from hessviz.matfree.estimates import block_list
from hessviz.matfree.spectral import EXACT_BLOCK, block_table
from hessviz.result import HessianResult

Progress = Callable[[int, int | None, str], None]
WINDOW_CHUNK = 64
"""Columns per closed-form product call in :func:`slice_window` (progress between chunks)."""


def attention_pattern(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """``(H, L, L)``: row ``i`` of head ``h`` is how token ``i`` spreads its attention over the tokens."""
    return record(cfg, params, X).attention.A


def check_window(cfg: BlockConfig, name: str, start: int, size: int) -> tuple[int, int]:
    """``(start, size)`` checked against the slice ``name`` (raises :class:`ConfigError`)."""
    n = cfg.param_size(cfg.sort_names((name,))[0])
    for field, value, lo, hi in (("size", size, 1, n), ("start", start, 0, n - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ConfigError(
                f"{field} must be an integer in [{lo}, {hi}] for {name} ({n} entries), got {value!r}"
            )
    if start + size > n:
        raise ConfigError(f"start + size must be ≤ {n} (the entries of {name}), got {start} + {size}")
    return start, size


def slice_window(
    res: HessianResult,
    name: str,
    start: int,
    size: int,
    term: str = "full",
    progress: Progress | None = None,
) -> Tensor:
    """``(size, size)``: ``H[S, S]`` for entries ``start … start+size−1`` of ``name`` (a weight or a
    head slice that ``res`` was computed for), from ``size`` closed-form products ``H e_j``."""
    start, size = check_window(res.cfg, name, start, size)
    op = res.operator(term).block(name, name)
    like = op.like
    window = torch.arange(start, start + size, device=like.device)
    columns = []
    for first in range(0, size, WINDOW_CHUNK):
        idx = window[first : first + WINDOW_CHUNK]
        E = like.new_zeros(idx.numel(), op.shape[1])
        E[torch.arange(idx.numel()), idx] = 1.0
        columns.append(op.apply(E)[:, window])
        if progress is not None:
            progress(first + idx.numel(), size, f"{first + idx.numel()} of {size} products")
    return torch.cat(columns).T


def window(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    Y: Tensor | None,
    loss: CustomLoss | None,
    name: str,
    start: int,
    size: int,
    term: str = "full",
    progress: Progress | None = None,
) -> np.ndarray:
    """``(size, size)`` float64 numpy: :func:`slice_window` of the layer's loss against ``Y`` (or
    of the custom ``loss``, ``Y = None``), from a result computed for the slice ``name`` alone."""
    res = hessian(cfg, params, X, Y, wrt=(name,), loss=loss)
    return slice_window(res, name, start, size, term, progress).to(torch.float64).cpu().numpy()


def window_summary(B: np.ndarray) -> dict[str, float | int]:
    """``top``, ``bottom``, ``trace`` and ``negative`` (the count below ``−10⁻¹² max|λ|``, round-off
    is not curvature) of the eigenvalues of the symmetric part ``(B + Bᵀ)/2`` of a window."""
    eig = np.linalg.eigvalsh(0.5 * (B + B.T))
    scale = float(np.abs(eig).max()) if eig.size else 0.0
    return {
        "top": float(eig[-1]),
        "bottom": float(eig[0]),
        "trace": float(eig.sum()),
        "negative": int((eig < -1e-12 * scale).sum()),
    }


PARTS = ("every block", "attention", "FFN", "biases and norms")
"""The parts of a layer that :func:`part_blocks` can keep: attention = ``W_Q, W_K, W_V, W_O`` (or
their heads), FFN = ``W_1, W_2`` (and the gate ``W_G`` of a gated feed-forward), the rest = biases and
the norms' weights (LayerNorm or RMSNorm γ/β, QK-norm's ``q_norm_gamma``, ``k_norm_gamma``)."""
_WEIGHTS = {"attention": ("W_Q", "W_K", "W_V", "W_O"), "FFN": ("W_G", "W_1", "W_2")}


def part_blocks(cfg: BlockConfig, by_head: bool, part: str = "every block") -> list[tuple[str, int]]:
    """``(name, size)`` of the blocks of :func:`hessviz.matfree.estimates.block_list` in one part of the layer
    (:data:`PARTS`)."""
    if part not in PARTS:
        raise ConfigError(f"part must be one of {', '.join(map(repr, PARTS))}, got {part!r}")
    blocks = block_list(cfg, by_head)
    if part == "every block":
        return blocks
    weights = {w for ws in _WEIGHTS.values() for w in ws}
    keep = (lambda base: base in _WEIGHTS[part]) if part in _WEIGHTS else (lambda base: base not in weights)
    return [(n, size) for n, size in blocks if keep(n.partition("[")[0])]


def curvature_table(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    Y: Tensor | None,
    loss: CustomLoss | None,
    blocks: list[str],
    samples: int,
    term: str = "full",
    seed: int = 0,
    progress: Progress | None = None,
) -> dict:
    """Per block ``b`` of ``blocks``: the top eigenvalue and the trace of ``H[b, b]``
    (:func:`hessviz.matfree.block_table`: exact for ≤ :data:`hessviz.matfree.spectral.EXACT_BLOCK` entries,
    else Lanczos, the eigenvalue within ``1e-6`` relative by its error bound (``bound="value"``), and
    Hutch++ with ``samples`` products, probes from ``seed``), as arrays:
    ``names, size, top, trace, trace_se, exact`` and the totals ``matvecs, seconds``."""
    t = block_table(
        hessian(cfg, params, X, Y, loss=loss),
        term,
        blocks,
        trace_samples=samples,
        exact_limit=EXACT_BLOCK,
        seed=seed,
        progress=progress,
        bound="value",
    )
    return table_arrays(t)


def table_arrays(t) -> dict:
    """A :class:`hessviz.matfree.spectral.BlockTable` as plain arrays (what the pages draw and cache)."""
    rows = t.as_dicts()
    return {
        "names": [r["name"] for r in rows],
        "size": np.array([r["size"] for r in rows]),
        "top": np.array([r["top"] for r in rows]),
        "trace": np.array([r["trace"] for r in rows]),
        "trace_se": np.array([r["trace_stderr"] for r in rows]),
        "exact": np.array([r["exact"] for r in rows]),
        "matvecs": t.matvecs,
        "seconds": t.seconds,
    }


def gradient_blocks(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    Y: Tensor | None,
    by_head: bool = True,
    loss: CustomLoss | None = None,
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(names, ‖g_b‖_F, sizes)`` of every block of :func:`hessviz.matfree.estimates.block_list`
    (every weight, or every head's slice of a weight with heads), from the closed-form gradient of the layer's
    loss against ``Y``, or of ``loss`` (a custom loss, ``Y = None``)."""
    grads = {n: g.reshape(-1) for n, g in gradient(cfg, params, X, Y, loss=loss).items()}
    names, norms, sizes = [], [], []
    for name, size in block_list(cfg, by_head):
        base = name.partition("[")[0]
        g = grads[base] if name == base else grads[base][cfg.head_indices(name).to(grads[base].device)]
        names.append(name)
        norms.append(float(g.norm()))
        sizes.append(size)
    return names, np.asarray(norms), np.asarray(sizes)
