"""The closed form against autograd: relative errors per block and term, and timings.

Used by ``hessviz verify`` and the app's *Verify & speed* page. An error is relative to
the larger of the reference block and the reference *full* block: autograd's
functional term is ``full − outer``, so it is only known to ``ε ‖full‖`` and a block
that is exactly zero in closed form (e.g. ``W_V–W_V`` of attention alone) would
otherwise show a meaningless relative error of 1. Likewise a block is never compared at a
scale below :data:`BLOCK_FLOOR` of the whole reference Hessian: a key bias's blocks are exactly
zero (softmax ignores a shift of a score row), and autograd gives them only as round-off of
the whole, ``~1e-17 ‖H‖``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

import hessviz as hv
from hessviz.reference import torch_forward
from hessviz.terms import TERMS

BLOCK_FLOOR = 1e-6
"""The smallest scale, relative to the whole reference ``full`` Hessian, a block's error is taken at."""


def relative_error(a: Tensor, b: Tensor, scale: Tensor | None = None, floor: float = 0.0) -> float:
    """``‖a − b‖_F / max(‖b‖_F, ‖scale‖_F, floor)`` (absolute when all are 0)."""
    norm = max(float(torch.linalg.norm(b)), floor)
    if scale is not None:
        norm = max(norm, float(torch.linalg.norm(scale)))
    diff = float(torch.linalg.norm(a - b))
    return diff / norm if norm > 0 else diff


AGREE_RTOL = 1e-10
"""Closed form and autograd agree when every block's relative error is below this (float64; the
two differ by round-off, ~1e-15 relative, well below it)."""


@dataclass(frozen=True)
class Comparison:
    names: tuple[str, ...]
    block_errors: dict[str, np.ndarray]
    """term -> ``(n, n)`` relative error of every block pair."""
    whole_errors: dict[str, float]
    """term, ``jacobian``, ``gradient``, ``forward`` -> relative error of the whole object."""
    seconds: dict[str, float]
    """``closed_form`` / ``autograd`` -> wall time for all three terms (best of the repeats)."""

    @property
    def worst(self) -> float:
        return max([float(e.max()) for e in self.block_errors.values()] + list(self.whole_errors.values()))

    @property
    def worst_block(self) -> float:
        """The largest relative error over every block pair of every term (what the Verify page shows)."""
        return max(float(e.max()) for e in self.block_errors.values())

    @property
    def agrees(self) -> bool:
        """Do the two methods agree on every block to :data:`AGREE_RTOL` (float64 round-off)?"""
        return self.worst_block < AGREE_RTOL

    @property
    def speedup(self) -> float:
        return self.seconds["autograd"] / self.seconds["closed_form"]

    def table(self) -> list[tuple[str, str, float]]:
        """``(what, block, error)`` lines of the table: each term whole then by block pair, then the rest."""
        out = []
        for term in TERMS:
            out.append((term, "all", self.whole_errors[term]))
            for i, a in enumerate(self.names):
                for j in range(i, len(self.names)):
                    out.append((term, f"{a}–{self.names[j]}", float(self.block_errors[term][i, j])))
        out += [(what, "all", self.whole_errors[what]) for what in ("jacobian", "gradient", "forward")]
        return out


def _timed_terms(
    cfg, params, X, Y, wrt, method: str, repeats: int
) -> tuple[hv.HessianResult, dict[str, Tensor], float]:
    """The result, its three terms, and the best wall time over ``repeats`` fresh computations."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        res = hv.hessian(cfg, params, X, Y, wrt=wrt, method=method)
        terms = res.terms()
        if X.device.type == "cuda":
            torch.cuda.synchronize(X.device)
        best = min(best, time.perf_counter() - start)
    return res, terms, best


def compare(
    cfg: hv.BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    Y: Tensor,
    wrt: tuple[str, ...] | None = None,
    *,
    repeats: int = 1,
) -> Comparison:
    """Compute every term both ways (timing each ``repeats`` times) and compare."""
    res, closed, t_closed = _timed_terms(cfg, params, X, Y, wrt, "closed_form", repeats)
    _, ref, t_ref = _timed_terms(cfg, params, X, Y, wrt, "autograd", repeats)
    offsets, names = res.offsets, res.names
    blocks, whole = {}, {}
    floor = BLOCK_FLOOR * float(torch.linalg.norm(ref["full"]))
    for term in TERMS:
        err = np.zeros((len(names), len(names)))
        for i, a in enumerate(names):
            for j, b in enumerate(names):
                rows, cols = offsets[a], offsets[b]
                err[i, j] = relative_error(
                    closed[term][rows, cols], ref[term][rows, cols], ref["full"][rows, cols], floor
                )
        blocks[term] = err
        whole[term] = relative_error(closed[term], ref[term], ref["full"])
    whole["jacobian"] = relative_error(
        hv.jacobian(cfg, params, X, wrt), hv.jacobian(cfg, params, X, wrt, method="autograd")
    )
    g, g_ref = hv.gradient(cfg, params, X, Y, wrt), hv.gradient(cfg, params, X, Y, wrt, method="autograd")
    whole["gradient"] = relative_error(
        torch.cat([v.reshape(-1) for v in g.values()]), torch.cat([v.reshape(-1) for v in g_ref.values()])
    )
    whole["forward"] = relative_error(hv.forward(cfg, params, X), torch_forward(cfg, params, X))
    return Comparison(names, blocks, whole, {"closed_form": t_closed, "autograd": t_ref})
