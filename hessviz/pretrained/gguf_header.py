"""A GGUF file's header walked within bounds before ``gguf.GGUFReader`` parses it.

``gguf.GGUFReader`` trusts the header's counts: it loops ``kv_count`` and ``tensor_count`` times and
once per array item, building a few numpy views each time (~1 KB per item), and a count that runs past
the end of the file makes views of nothing without moving on, so a 40-byte file that claims 2⁶³ items
loops until memory runs out. :func:`check_header` reads the same header first, with ``struct`` on a
memory map, and refuses with one :class:`~hessviz.errors.CheckpointError`:

* a version other than :data:`VERSIONS` (either byte order, as the reader takes);
* more than :data:`MAX_KEYS` metadata keys or :data:`MAX_TENSORS` tensors, or more than :data:`MAX_ITEMS`
  array items in all (Llama 3's vocabulary, merges and token types are ~540k), which bounds what the
  reader then builds;
* any length or count that runs past the end of the file (a string, an array, a tensor's data), read
  before anything is taken from it;
* an unknown value type, an array of arrays (llama.cpp writes none), a key or tensor name longer than
  :data:`MAX_NAME` bytes, more than :data:`MAX_DIMS` dimensions, an unknown tensor type id, an
  alignment that is not a power of two.

The walk is one pass over the header: numeric arrays are skipped by their size, strings one length at a
time (a 150k-token vocabulary takes ~0.1 s). What the header's values *mean* is checked afterwards
(:mod:`hessviz.pretrained.gguf_file`).
"""

from __future__ import annotations

import mmap
import struct

from hessviz.errors import CheckpointError

VERSIONS = (2, 3)
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
MAX_ITEMS = 1 << 20
MAX_NAME = (1 << 16) - 1
"""GGUF's own limit on a key's length."""
MAX_DIMS = 4
"""``GGML_MAX_DIMS``."""
DEFAULT_ALIGNMENT = 32
SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""GGUF value type id -> bytes: uint8, int8, uint16, int16, uint32, int32, float32, bool, uint64,
int64, float64."""
STRING, ARRAY, UINT32 = 8, 9, 4


class _Header:
    """A cursor over the mapped file: every read checks that its bytes are there first."""

    def __init__(self, buf, size: int, path: str, order: str):
        self.buf, self.size, self.path, self.order, self.pos = buf, size, path, order, 0
        self.items = 0

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"source {self.path!r}: GGUF header: {what}")

    def take(self, n: int, what: str) -> int:
        """Skip ``n`` bytes of ``what``; their offset."""
        if n > self.size - self.pos:
            raise self.fail(
                f"{what} needs {n} bytes at byte {self.pos}, past the end of the file "
                f"({self.size} bytes): the file is truncated or damaged"
            )
        start, self.pos = self.pos, self.pos + n
        return start

    def number(self, code: str, what: str) -> int:
        at = self.take(struct.calcsize(code), what)
        return struct.unpack_from(self.order + code, self.buf, at)[0]

    def string(self, what: str, limit: int | None = None) -> int:
        """Skip a string (``uint64`` length, then bytes); its length."""
        n = self.number("Q", f"the length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long, more than the {limit} a GGUF name may have")
        self.take(n, what)
        return n

    def count(self, n: int, what: str) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise self.fail(
                f"{what} brings the header's arrays to {self.items} items, more than the {MAX_ITEMS} "
                "hessviz reads (a real vocabulary and its merges hold well under a million)"
            )

    def value(self, kind: int, what: str) -> None:
        """Skip one value of type id ``kind``."""
        if kind in SCALARS:
            self.take(SCALARS[kind], what)
        elif kind == STRING:
            self.string(what)
        elif kind == ARRAY:
            item = self.number("I", f"the item type of {what}")
            n = self.number("Q", f"the length of {what}")
            if item == ARRAY:
                raise self.fail(f"{what} is an array of arrays, which GGUF files do not hold")
            self.count(n, what)
            if item in SCALARS:
                self.take(n * SCALARS[item], f"{what} ({n} items)")
            elif item == STRING:
                for i in range(n):
                    self.string(f"item {i} of {what}")
            else:
                raise self.fail(f"{what} has items of unknown type id {item}")
        else:
            raise self.fail(f"{what} has unknown type id {kind}")


def check_header(path: str, size: int, quant_sizes: dict[int, tuple[int, int]]) -> None:
    """Walk the header of the GGUF file ``path`` (``size`` bytes, its magic already checked);
    ``quant_sizes``: tensor type id -> (block size in elements, block size in bytes)."""
    if size < 24:
        raise CheckpointError(f"source {path!r}: GGUF file of {size} bytes: the file is truncated")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        size = min(size, len(buf))
        (version,) = struct.unpack_from("<I", buf, 4)
        order = ">" if version & 0xFFFF == 0 else "<"  # written on a machine of the other byte order
        h = _Header(buf, size, path, order)
        h.take(4, "the magic")
        version = h.number("I", "the version")
        if version not in VERSIONS:
            raise h.fail(f"version {version} is not read (hessviz reads GGUF versions 2 and 3)")
        tensors, keys = h.number("Q", "the tensor count"), h.number("Q", "the key count")
        if keys > MAX_KEYS or tensors > MAX_TENSORS:
            raise h.fail(
                f"{keys} metadata keys and {tensors} tensors; hessviz reads at most {MAX_KEYS} keys "
                f"and {MAX_TENSORS} tensors (real files hold tens of keys and at most a few thousand tensors)"
            )
        alignment = DEFAULT_ALIGNMENT
        for i in range(keys):
            start = h.pos + 8
            n = h.string(f"the name of key {i}", MAX_NAME)
            name = bytes(buf[start : start + n]).decode("utf-8", "replace")
            kind = h.number("I", f"the type of key {name!r}")
            if name == "general.alignment" and kind == UINT32:
                alignment = h.number("I", "general.alignment")
                if alignment == 0 or alignment & (alignment - 1):
                    raise h.fail(f"general.alignment = {alignment} is not a power of two")
            else:
                h.value(kind, f"key {name!r}")
        infos = []
        for i in range(tensors):
            start = h.pos + 8
            n = h.string(f"the name of tensor {i}", MAX_NAME)
            name = bytes(buf[start : start + n]).decode("utf-8", "replace")
            n_dims = h.number("I", f"the dimension count of tensor {name!r}")
            if n_dims > MAX_DIMS:
                raise h.fail(f"tensor {name!r} has {n_dims} dimensions; GGUF tensors have at most {MAX_DIMS}")
            elements = 1
            for _ in range(n_dims):
                elements *= h.number("Q", f"a dimension of tensor {name!r}")
            kind = h.number("I", f"the type of tensor {name!r}")
            if kind not in quant_sizes:
                raise h.fail(f"tensor {name!r} has unknown type id {kind}")
            offset = h.number("Q", f"the data offset of tensor {name!r}")
            block, block_bytes = quant_sizes[kind]
            infos.append((name, offset, -(-elements // block) * block_bytes))
        data = h.pos + (-h.pos) % alignment
        for name, offset, n_bytes in infos:
            if data + offset + n_bytes > size:
                raise h.fail(
                    f"tensor {name!r} ends at byte {data + offset + n_bytes} but the file has {size} "
                    "bytes: the GGUF file is truncated"
                )
