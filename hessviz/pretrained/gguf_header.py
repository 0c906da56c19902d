"""A GGUF file's header read within bounds: metadata values, deferred arrays, the tensor index.

hessviz reads the header itself (``struct`` and ``numpy`` on a memory map) instead of
``gguf.GGUFReader``, which trusts the header's counts (it loops ``kv_count`` and ``tensor_count`` times
and once per array item, building a few numpy views each time, ~1 KB per item: 786k parts and ~700 MB
for Gemma 3's 262,144-token vocabulary; a count that runs past the end of the file makes views of
nothing without moving on, so a 40-byte file that claims 2⁶³ items loops until memory runs out).
:func:`read_header` walks the header once and refuses with one :class:`~hessviz.errors.CheckpointError`:

* a version other than :data:`VERSIONS` (either byte order, as ``gguf`` takes);
* more than :data:`MAX_KEYS` metadata keys or :data:`MAX_TENSORS` tensors, or more than :data:`MAX_ITEMS`
  array items in all (Llama 3's vocabulary, merges and token types are ~540k);
* any length or count that runs past the end of the file (a string, an array, a tensor's data), read
  before anything is taken from it;
* an unknown value type, an array of arrays (llama.cpp writes none), a key or tensor name longer than
  :data:`MAX_NAME` bytes or not UTF-8, a key or tensor name twice, more than :data:`MAX_DIMS`
  dimensions, an unknown tensor type id, a ``general.alignment`` not a ``uint32`` power of two.

What it returns (:class:`Header`), the values as ``gguf``'s ``ReaderField.contents()`` gives them:

* ``metadata``: key -> Python value (``int``, ``float``, ``bool``, ``str``, or a list of them), for
  every key but the ``deferred`` ones;
* ``deferred``: key -> ``(type id, byte offset of the value)`` for the keys the caller reads later, if
  at all (a vocabulary: only a text needs it), by :func:`deferred_value`: the walk only skips them
  (numeric arrays by their size, strings one length at a time: ~0.1 s for 262k strings);
* ``tensors``: each tensor's :class:`TensorInfo` (name, type id, dimensions in GGUF order, the absolute
  offset and byte count of its data), checked to lie inside the file.

What the values *mean* is checked afterwards (:mod:`hessviz.pretrained.gguf_file`).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np

from hessviz.errors import CheckpointError
from hessviz.pretrained.bounded import shown

VERSIONS = (2, 3)
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
MAX_ITEMS = 1 << 20
MAX_NAME = (1 << 16) - 1
"""GGUF's own limit on a key's length."""
MAX_DIMS = 4
"""``GGML_MAX_DIMS``."""
DEFAULT_ALIGNMENT = 32
CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""GGUF value type id -> ``struct`` code: uint8, int8, uint16, int16, uint32, int32, float32, bool,
uint64, int64, float64."""
SCALARS = {kind: struct.calcsize(code) for kind, code in CODES.items()}
"""GGUF value type id -> bytes."""
STRING, ARRAY, UINT32 = 8, 9, 4


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the index: ``dims`` in GGUF order (fastest first), ``offset`` the absolute byte
    offset of its data in the file, ``n_elements`` and ``n_bytes`` (whole blocks of the type: ``gguf``'s
    ``n_elements · block bytes / block`` wherever rows are whole blocks, which :mod:`gguf_file` requires)."""

    name: str
    kind: int
    dims: tuple[int, ...]
    offset: int
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class Header:
    """What :func:`read_header` read: see the module docstring."""

    order: str
    metadata: dict = field(default_factory=dict)
    deferred: dict = field(default_factory=dict)
    tensors: list = field(default_factory=list)


class _Cursor:
    """A cursor over the mapped file: every read checks that its bytes are there first."""

    def __init__(self, buf, size: int, path: str, order: str, pos: int = 0):
        self.buf, self.size, self.path, self.order, self.pos = buf, size, path, order, pos
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

    def text(self, at: int, n: int, what: str) -> str:
        try:
            return str(self.buf[at : at + n], "utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not UTF-8 text ({e.reason} at its byte {e.start})") from None

    def string(self, what: str, keep: bool = True, limit: int | None = None) -> str | None:
        """A string (``uint64`` length, then bytes): its text, or ``None`` when not ``keep``."""
        n = self.number("Q", f"the length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long, more than the {limit} a GGUF name may have")
        at = self.take(n, what)
        return self.text(at, n, what) if keep else None

    def strings(self, n: int, what: str, keep: bool) -> list[str] | None:
        """``n`` strings, item by item (the loop of a vocabulary: kept tight, the checks of
        :meth:`string` inline and its messages on failure)."""
        buf, size, pos, out = self.buf, self.size, self.pos, []
        length = struct.Struct(self.order + "Q").unpack_from
        for i in range(n):
            if size - pos < 8 or length(buf, pos)[0] > size - pos - 8:
                self.pos = pos
                self.string(f"item {i} of {what}", keep=False)  # raises, naming the item
            k = length(buf, pos)[0]
            if keep:
                out.append(self.text(pos + 8, k, f"item {i} of {what}"))
            pos += 8 + k
        self.pos = pos
        return out if keep else None

    def value(self, kind: int, what: str, keep: bool = True) -> object:
        """One value of type id ``kind``: as Python (``keep``) or skipped (``None``)."""
        if kind in SCALARS:
            at = self.take(SCALARS[kind], what)
            return struct.unpack_from(self.order + CODES[kind], self.buf, at)[0] if keep else None
        if kind == STRING:
            return self.string(what, keep)
        if kind != ARRAY:
            raise self.fail(f"{what} has unknown type id {kind}")
        item = self.number("I", f"the item type of {what}")
        n = self.number("Q", f"the length of {what}")
        if item == ARRAY:
            raise self.fail(f"{what} is an array of arrays, which GGUF files do not hold")
        self.items += n
        if self.items > MAX_ITEMS:
            raise self.fail(
                f"{what} brings the header's arrays to {self.items} items, more than the {MAX_ITEMS} "
                "hessviz reads (a real vocabulary and its merges hold well under a million)"
            )
        if item in SCALARS:
            at = self.take(n * SCALARS[item], f"{what} ({n} items)")
            return (
                np.frombuffer(self.buf, np.dtype(self.order + CODES[item]), n, at).tolist() if keep else None
            )
        if item == STRING:
            return self.strings(n, what, keep)
        raise self.fail(f"{what} has items of unknown type id {item}")


def byte_order(buf) -> str:
    """``"<"``, or ``">"`` for a file written on a machine of the other byte order (its version's low
    half zero, as ``gguf`` tells)."""
    (version,) = struct.unpack_from("<I", buf, 4)
    return ">" if version & 0xFFFF == 0 else "<"


def read_header(
    buf, size: int, path: str, quant_sizes: dict[int, tuple[int, int]], deferred: tuple[str, ...] = ()
) -> Header:
    """The header of the GGUF file ``path`` mapped as ``buf`` (``size`` bytes, its magic already
    checked); ``quant_sizes``: tensor type id -> (block size in elements, block size in bytes);
    ``deferred``: the keys whose values are skipped, their places kept (:func:`deferred_value`)."""
    if size < 24:
        raise CheckpointError(f"source {path!r}: GGUF file of {size} bytes: the file is truncated")
    size = min(size, len(buf))
    h = _Cursor(buf, size, path, byte_order(buf))
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
    out = Header(h.order)
    alignment = DEFAULT_ALIGNMENT
    for i in range(keys):
        name = h.string(f"the name of key {i}", limit=MAX_NAME)
        if name in out.metadata or name in out.deferred:
            raise h.fail(f"key {name!r} appears twice")
        kind = h.number("I", f"the type of key {name!r}")
        if name in deferred:
            out.deferred[name] = (kind, h.pos)
            h.value(kind, f"key {name!r}", keep=False)
            continue
        out.metadata[name] = h.value(kind, f"key {name!r}")
        if name == "general.alignment":
            alignment = out.metadata[name]
            if kind != UINT32 or alignment == 0 or alignment & (alignment - 1):
                raise h.fail(f"general.alignment = {shown(alignment)} is not a power of two (a uint32)")
    infos, names = [], set()
    for i in range(tensors):
        name = h.string(f"the name of tensor {i}", limit=MAX_NAME)
        if name in names:
            raise h.fail(f"tensor {name!r} appears twice")
        names.add(name)
        n_dims = h.number("I", f"the dimension count of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise h.fail(f"tensor {name!r} has {n_dims} dimensions; GGUF tensors have at most {MAX_DIMS}")
        dims = tuple(h.number("Q", f"a dimension of tensor {name!r}") for _ in range(n_dims))
        kind = h.number("I", f"the type of tensor {name!r}")
        if kind not in quant_sizes:
            raise h.fail(f"tensor {name!r} has unknown type id {kind}")
        offset = h.number("Q", f"the data offset of tensor {name!r}")
        infos.append((name, kind, dims, offset))
    data = h.pos + (-h.pos) % alignment
    for name, kind, dims, offset in infos:
        elements = math.prod(dims)
        block, block_bytes = quant_sizes[kind]
        n_bytes = -(-elements // block) * block_bytes  # whole blocks (a partial one is refused later)
        end = data + offset + n_bytes
        if end > size:
            raise h.fail(
                f"tensor {name!r} ends at byte {end} but the file has {size} bytes: "
                "the GGUF file is truncated"
            )
        out.tensors.append(TensorInfo(name, kind, dims, data + offset, elements, n_bytes))
    return out


def deferred_value(buf, size: int, path: str, header: Header, key: str) -> object:
    """The value of the deferred key ``key`` of ``header`` (its bounds checked by :func:`read_header`),
    as Python."""
    kind, pos = header.deferred[key]
    return _Cursor(buf, min(size, len(buf)), path, header.order, pos).value(kind, f"key {key!r}")
