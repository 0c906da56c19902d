"""The closed form against autograd: relative errors per block and term, and timings.

Used by ``hessviz verify`` and the app's *Verify & speed* page. An error is relative to
the larger of the reference block and the reference *full* block: autograd's
functional term is ``full − outer``, so it is only known to ``ε ‖full‖`` and a block
that is exactly zero in closed form (e.g. ``W_V–W_V`` of attention alone) would
otherwise show a meaningless relative error of 1. Likewise a block is never compared at a
scale below :data:`BLOCK_FLOOR` of the whole reference Hessian: a key bias's blocks are exactly
zero (softmax ignores a shift of a score row), and autograd gives them only as round-off of
the whole, ``~1e-17 ‖H‖``.

Nor is a result compared below the size of the numbers it is computed from, its *rounding
scale* (:func:`rounding_scale`): in some blocks everything cancels. A Post-LN block of width
d = 2 normalises every token to ±1 whatever the weights, so its gradients and its whole Hessian
are zero, and both methods return only their round-off (``~1e-14``): relative to itself that
round-off is an error of 1, relative to the numbers that cancelled it is ``~1e-16``. The scale is
measured, not guessed: the closed form is run once more in float32, and its departure from the
float64 result, over float32's unit round-off, is the size of what the result was computed from
(the whole Hessian's size, for :data:`BLOCK_FLOOR`, is the larger of its norm and that scale; the
Jacobian and the gradient, cheap, are run in float32 both ways, as a closed form can cancel exactly
where autograd leaves round-off). A formula that is wrong is wrong in both precisions, so the scale
does not grow with the error and a wrong block is still seen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

import hessviz as hv
from hessviz.block.terms import TERMS
from hessviz.reference import torch_forward

BLOCK_FLOOR = 1e-6
"""The smallest scale, relative to the whole reference ``full`` Hessian, a block's error is taken at."""


ROUNDING = float(torch.finfo(torch.float32).eps)
"""float32's unit round-off, ``2⁻²³``: what a float32 result's departure from the float64 one is
divided by to give its rounding scale."""


def rounding_scale(single: Tensor, double: Tensor) -> float:
    """``‖single − double‖_F / ε₃₂``: the size of the numbers a float64 result ``double`` was computed
    from, read off the same computation in float32 (``single``). A result whose terms cancel has a
    rounding scale far above its own norm; one that does not, about its own norm. 0 when the float32
    result is not finite (it overflowed): no scale is then claimed."""
    gap = float(torch.linalg.norm(single.to(double.dtype) - double))
    return gap / ROUNDING if np.isfinite(gap) else 0.0


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


def _flat(g: dict[str, Tensor]) -> Tensor:
    return torch.cat([v.reshape(-1) for v in g.values()])


def _single(params: dict[str, Tensor], X: Tensor, Y: Tensor) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """The inputs in float32 (class indices stay integers)."""
    return {k: v.float() for k, v in params.items()}, X.float(), Y.float() if Y.is_floating_point() else Y


def _both_ways(fn, cfg, params, X, Y, wrt) -> float:
    """The relative error of ``fn`` (the Jacobian or the gradient) closed form against autograd, at
    the larger rounding scale of the two (each method run once more in float32: a closed form that
    cancels exactly, such as LayerNorm's Jacobian at d = 2, leaves the round-off to autograd)."""
    p32, X32, Y32 = _single(params, X, Y)
    out = {}
    for method in ("closed_form", "autograd"):
        double, single = fn(cfg, params, X, Y, wrt, method), fn(cfg, p32, X32, Y32, wrt, method)
        out[method] = (double, rounding_scale(single, double))
    (closed, s1), (ref, s2) = out["closed_form"], out["autograd"]
    return relative_error(closed, ref, floor=max(s1, s2))


def _jacobian(cfg, params, X, Y, wrt, method: str) -> Tensor:
    return hv.jacobian(cfg, params, X, wrt, method=method)


def _gradient(cfg, params, X, Y, wrt, method: str) -> Tensor:
    return _flat(hv.gradient(cfg, params, X, Y, wrt, method=method))


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
    """Compute every term both ways (timing each ``repeats`` times) and compare: each error is
    relative to the reference, its full term, :data:`BLOCK_FLOOR` of the whole and the result's
    :func:`rounding_scale`, whichever is largest."""
    res, closed, t_closed = _timed_terms(cfg, params, X, Y, wrt, "closed_form", repeats)
    _, ref, t_ref = _timed_terms(cfg, params, X, Y, wrt, "autograd", repeats)
    offsets, names = res.offsets, res.names
    p32, X32, Y32 = _single(params, X, Y)
    scale, block_scale = {}, {}
    for term in TERMS:  # one float32 term alive at a time (4 P² bytes), its scales read and it dropped
        s = hv.hessian(cfg, p32, X32, Y32, wrt=wrt).term(term)
        scale[term] = rounding_scale(s, closed[term])
        block_scale[term] = {
            (a, b): rounding_scale(s[offsets[a], offsets[b]], closed[term][offsets[a], offsets[b]])
            for a in names
            for b in names
        }
        del s
    blocks, whole = {}, {}
    floor = BLOCK_FLOOR * max(float(torch.linalg.norm(ref["full"])), scale["full"])
    for term in TERMS:
        err = np.zeros((len(names), len(names)))
        for i, a in enumerate(names):
            for j, b in enumerate(names):
                rows, cols = offsets[a], offsets[b]
                at = max(floor, block_scale[term][a, b])
                err[i, j] = relative_error(
                    closed[term][rows, cols], ref[term][rows, cols], ref["full"][rows, cols], at
                )
        blocks[term] = err
        whole[term] = relative_error(closed[term], ref[term], ref["full"], scale[term])
    whole["jacobian"] = _both_ways(_jacobian, cfg, params, X, Y, wrt)
    whole["gradient"] = _both_ways(_gradient, cfg, params, X, Y, wrt)
    whole["forward"] = relative_error(hv.forward(cfg, params, X), torch_forward(cfg, params, X))
    return Comparison(names, blocks, whole, {"closed_form": t_closed, "autograd": t_ref})
