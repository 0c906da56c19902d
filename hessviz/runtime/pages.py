r"""Large buffers without a page fault per 4 KiB: transparent huge pages where the kernel offers them.

The one allocator of large buffers: product columns, Lanczos bases, probes and the dense terms
(a fresh dense Hessian is hundreds of MB, and there too the 4 KiB faults cost more than writing it).

A product column of a MiniLM layer is ``P = 1.77 M`` float64 entries, 14 MiB. A fresh buffer of
that size is a fresh ``mmap`` (glibc serves allocations above its threshold that way and returns
them on ``free``), so every product used to fault in and zero 3 500 pages of 4 KiB, which took longer
than writing the same 14 MiB into memory already mapped (timings: ``benchmarks/MATFREE_NOTES.md``,
issue 20). On Linux with transparent huge pages in ``madvise`` mode
(the common default), :func:`empty` asks for 2 MiB pages on the buffer before anything touches it
(``madvise(MADV_HUGEPAGE)``): 512 times fewer faults. Elsewhere (another OS, a GPU tensor, THP
``never``, a buffer under :data:`HUGE_FROM`) it is ``like.new_empty(shape)`` and nothing else.
The advice changes how the memory is mapped, never its contents: results are bit-identical.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import sys
from functools import lru_cache

from torch import Tensor

HUGE_FROM = 4 << 20
"""Buffers of at least this many bytes get the advice (a smaller one may not span a 2 MiB page)."""

PAGE = 2 << 20
MADV_HUGEPAGE = 14


@lru_cache(maxsize=1)
def _madvise():
    """libc's ``madvise`` on Linux, else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        f = libc.madvise
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    f.restype = ctypes.c_int
    return f


def empty(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised contiguous tensor of ``shape`` in the dtype and device of ``like``; on a
    Linux CPU and from :data:`HUGE_FROM` bytes, backed by huge pages where the kernel grants them."""
    out = like.new_empty(shape)
    size = math.prod(shape) * out.element_size()
    advise = _madvise() if out.device.type == "cpu" and size >= HUGE_FROM else None
    if advise is not None:
        start = out.data_ptr()
        lo, hi = -(-start // PAGE) * PAGE, (start + size) // PAGE * PAGE
        if hi > lo:
            advise(lo, hi - lo, MADV_HUGEPAGE)  # advice only: a refusal leaves normal pages
    return out
