r"""Repeated products on a GPU replayed as CUDA graphs: one launch instead of about 180.

A closed-form product of a MiniLM layer is about 180 small kernels, which the host takes longer to
launch from Python than the GPU takes to run them (``scripts/gpu_probe.py``; timings:
``benchmarks/MATFREE_NOTES.md``). Lanczos, SLQ and Hutchinson call the same product hundreds of
times at one point, on inputs of one shape, so :class:`Replays` captures the product's kernels once
as a CUDA graph (``torch.cuda.CUDAGraph``) and then replays them: the input is copied into the
graph's own buffer, the graph runs, and the answer is copied out (two device copies of ``k P``
entries, microseconds). The tape the product sweeps is fixed at the point (a cached property of
:class:`~hessviz.products.operator.MatrixFreeHessian`, freed with it), so the captured kernels read
the same memory on every replay; the graphs are kept on the same object and freed with it.

* The first product of each kind (term, rows, columns, ``k``, dtype) runs as usual; the second is
  captured (after one run on the capturing stream, which sets up cuBLAS there) and every later
  one replayed. A single product never pays for a capture.
* Replays are bit-identical to the products they stand for (same kernels, same order:
  ``tests/test_lanczos.py``, run where a GPU is).
* A product that cannot be captured (one that reads a value back to the host, say) raises while
  capturing; that kind then runs as usual for good, with the same numbers.
* Off on the CPU, for the autograd reference, beyond :data:`LIMIT` kinds, and wherever
  ``HESSVIZ_CUDA_GRAPHS=0``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable

import torch
from torch import Tensor

LIMIT = 8
"""Kinds of product captured per result; each graph keeps its intermediates (about 15–45 MiB a
column on a MiniLM layer), so a result sweeping many shapes captures the first few only."""

ENV = "HESSVIZ_CUDA_GRAPHS"


def enabled(like: Tensor) -> bool:
    """Whether products on ``like``'s device may be replayed: CUDA, and not switched off."""
    return like.is_cuda and os.environ.get(ENV, "1") != "0"


class _Captured:
    __slots__ = ("graph", "inputs", "output")

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: Tensor, output: Tensor):
        self.graph, self.inputs, self.output = graph, inputs, output


class Replays:
    """``(key, V, product) -> product(V)``, captured on the second call of a key, replayed after.

    ``product(V)`` must return a fresh ``(k, n)`` tensor computed from ``V (k, m)`` and state that
    stays put between calls; ``key`` names everything else it depends on (term, rows, columns)."""

    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self._seen: set[Hashable] = set()
        self._graphs: dict[Hashable, _Captured | None] = {}  # None: could not be captured
        self._stream: torch.cuda.Stream | None = None
        self._lock = threading.Lock()  # one set of graph buffers per kind

    def __call__(
        self, key: Hashable, V: Tensor, product: Callable[[Tensor], Tensor], out: Tensor | None = None
    ) -> Tensor:
        key = (key, tuple(V.shape), V.dtype, V.device)
        with self._lock:
            cap = self._graphs.get(key)
            second = key in self._seen and key not in self._graphs
            if second and len(self._graphs) < self.limit:
                cap = self._graphs[key] = self._capture(V, product)
            self._seen.add(key)
            if cap is not None:
                cap.inputs.copy_(V)
                cap.graph.replay()
                return cap.output.clone() if out is None else out.copy_(cap.output)
        result = product(V)
        return result if out is None else out.copy_(result)

    def _capture(self, V: Tensor, product: Callable[[Tensor], Tensor]) -> _Captured | None:
        if self._stream is None:
            self._stream = torch.cuda.Stream(V.device)
        inputs = torch.empty_like(V, memory_format=torch.contiguous_format).copy_(V)
        graph = torch.cuda.CUDAGraph()
        self._stream.wait_stream(torch.cuda.current_stream(V.device))
        try:
            with torch.cuda.stream(self._stream):
                product(inputs)  # cuBLAS and caches set up on this stream
            with torch.cuda.graph(graph, stream=self._stream):
                output = product(inputs)
        except RuntimeError:  # not capturable: run it as usual
            torch.cuda.current_stream(V.device).wait_stream(self._stream)
            return None
        torch.cuda.current_stream(V.device).wait_stream(self._stream)
        return _Captured(graph, inputs, output)
