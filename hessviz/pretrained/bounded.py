"""A checkpoint's JSON files read within bounds, and values shown in messages within bounds.

A checkpoint folder is data someone else wrote; reading it must fail closed. :func:`read_bytes` (any
bounded file, ``tokenizer.json`` too) and :func:`read_json` refuse,
with one :class:`~hessviz.errors.CheckpointError` naming the file:

* a file larger than its cap (``config.json`` :data:`CONFIG_BYTES`, the shard index :data:`INDEX_BYTES`),
  read with a bounded ``read`` (a file that grows while it is read is cut at the cap, then refused);
* nesting deeper than :data:`MAX_DEPTH`, measured *before* parsing: Python's ``json`` recurses once per
  level and would raise a bare ``RecursionError`` near 1,000 levels. Strings are blanked first (a bracket
  inside a string does not nest), then the running count of ``[{`` minus ``]}`` is taken in chunks of
  :data:`CHUNK` bytes with numpy, so the scan costs a few passes over at most the cap, in bounded memory;
* anything that is not standard JSON: bad UTF-8, syntax, ``NaN``/``Infinity``, a float that overflows to
  infinity, an integer of more digits than Python converts.

:func:`shown` is the ``repr`` of an offending value cut to :data:`SHOWN` characters, so a message that
quotes a value a file supplies stays one short line however large the value is.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from hessviz.errors import CheckpointError

CONFIG_BYTES = 4 << 20
"""``config.json``: real ones are a few kB (a classifier's ``id2label`` of thousands of labels, ~1 MB)."""
INDEX_BYTES = 32 << 20
"""``model.safetensors.index.json``: ~100 bytes per tensor; a 90k-tensor mixture of experts is ~9 MB."""
MAX_DEPTH = 64
"""Real configs nest 4 or 5 levels (``text_config`` → ``rope_scaling`` → …)."""
CHUNK = 1 << 20
SHOWN = 120

_STRING = re.compile(rb'"[^"\\]*(?:\\(?:.|\Z)[^"\\]*)*(?:"|\Z)', re.DOTALL)
"""A JSON string; an unterminated one runs to the end of the text, so every match attempt succeeds at
its first quote and the blanking is one linear pass (a failing attempt would rescan from every
escaped quote after it)."""
_BRACKETS = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def shown(value: object) -> str:
    """``repr(value)`` cut to :data:`SHOWN` characters (``…`` marks a cut); one line, as ``repr`` escapes."""
    text = repr(value) if not isinstance(value, (list, dict, tuple)) or len(value) < 64 else None
    if text is None:  # never build the repr of a huge container only to cut it
        text = f"a {type(value).__name__} of {len(value)} items"
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def depth(data: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text ``data``, brackets inside strings not counted."""
    plain = np.frombuffer(_STRING.sub(b'""', data), dtype=np.uint8)
    top = level = 0
    for start in range(0, len(plain), CHUNK):
        part = plain[start : start + CHUNK]
        step = np.zeros(len(part), dtype=np.int32)
        for byte, sign in _BRACKETS.items():
            step[part == byte] = sign
        run = np.cumsum(step) + level
        if len(run):
            top, level = max(top, int(run.max())), int(run[-1])
    return top


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} overflows to infinity")
    return value


def read_bytes(path: Path | str, max_bytes: int, kind: str = "one") -> bytes:
    """The bytes of ``path``, read with a bounded ``read`` of at most ``max_bytes + 1`` bytes: a file
    larger than ``max_bytes`` (or one that grows past it while read) is refused; ``kind`` names the real
    files it is compared with in that message (``"tokenizer.json"``)."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise CheckpointError(f"source: {path} cannot be read ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise CheckpointError(
            f"source: {path} is larger than {max_bytes >> 20} MiB, far beyond any real {kind}; "
            "hessviz refuses to parse it"
        )
    return data


def read_json(path: Path, max_bytes: int) -> object:
    """The JSON value in ``path``, read within the bounds above."""
    data = read_bytes(path, max_bytes)
    levels = depth(data)
    if levels > MAX_DEPTH:
        raise CheckpointError(
            f"source: {path} nests {levels} levels deep, more than the {MAX_DEPTH} "
            "hessviz parses (real ones nest a few); the file is damaged or hostile"
        )
    try:
        return json.loads(data, parse_constant=_constant, parse_float=_finite)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"source: {path} is not valid JSON ({str(e)[:200]})") from None
