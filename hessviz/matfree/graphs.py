r"""Products on a CUDA device replayed as CUDA graphs: the whole sweep in one launch.

At the MiniLM size a product is ~300 small kernels, and on a GPU its time goes to launching
them from Python (about 3 ms per product on an H200 at ``L = 32`` and ``L = 128`` alike), not
to the arithmetic. For given ``(k, term, rows, cols)`` the sweep is a fixed sequence of
kernels (its control flow depends only on which tangents are zero, never on values), so it
is captured once into a ``torch.cuda.CUDAGraph`` and then replayed: the columns are copied
into the graph's input buffer, the graph runs, and its output buffer is copied out.

A key is captured on its second use (a one-off product is not worth a capture), after two
warm-up sweeps on a side stream (lazy cuBLAS set-up must not happen inside a capture), and at
most :data:`MAX_GRAPHS` graphs are kept (each holds its sweep's intermediates in a private
memory pool), the least recently used dropped first. A capture that fails marks its key, and
that key's products run eagerly, as on the CPU.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable

import torch
from torch import Tensor

MAX_GRAPHS = 4
"""Captured sweeps kept at once (e.g. ``k = 1`` and ``k = 16`` of two terms)."""

WARMUP = 2


class SweepGraphs:
    """``run(key, fn, V)`` = ``fn(V)``, replayed from a CUDA graph once ``key`` has been seen."""

    def __init__(self) -> None:
        self._graphs: OrderedDict[Hashable, tuple[torch.cuda.CUDAGraph, Tensor, Tensor]] = OrderedDict()
        self._seen: Counter[Hashable] = Counter()
        self._failed: set[Hashable] = set()

    def run(self, key: Hashable, fn: Callable[[Tensor], Tensor], V: Tensor) -> Tensor:
        entry = self._graphs.get(key)
        if entry is None:
            self._seen[key] += 1
            if key in self._failed or self._seen[key] < 2:
                return fn(V)
            entry = self._capture(fn, V)
            if entry is None:
                self._failed.add(key)
                return fn(V)
            self._graphs[key] = entry
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        graph, static_in, static_out = entry
        static_in.copy_(V)
        graph.replay()
        return static_out.clone()

    @staticmethod
    def _capture(fn: Callable[[Tensor], Tensor], V: Tensor):
        """``(graph, input buffer, output buffer)``, or ``None`` when ``fn`` cannot be captured."""
        static_in = V.clone()
        current = torch.cuda.current_stream(V.device)
        side = torch.cuda.Stream(V.device)
        side.wait_stream(current)
        try:
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    fn(static_in)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = fn(static_in)
        except RuntimeError:
            torch.cuda.synchronize(V.device)
            return None
        return graph, static_in, static_out
