"""Text to token ids with the checkpoint's own ``tokenizer.json`` (the ``tokenizers`` package).

The tokenizer adds the model's special tokens as its post-processor says (``[CLS] … [SEP]``
for BERT, nothing for GPT-2). Padding and truncation are switched off whatever
``tokenizer.json`` configures (MiniLM's pads and truncates to 128), so a text is never cut
or padded silently: a text longer than the model's positions is refused instead.
Tokenizers are cached per file state in a bounded LRU cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import torch
from tokenizers import Tokenizer

from hessviz.errors import CheckpointError, InputError, ModelRangeError
from hessviz.pretrained.bounded import read_bytes
from hessviz.pretrained.checkpoint import CACHE_SIZE, Checkpoint

TOKENIZER_FILE = "tokenizer.json"


TOKENIZER_BYTES = 64 << 20
"""The largest ``tokenizer.json`` read (real ones: 0.7 MB for BERT, 7 to 35 MB for 150k–260k vocabularies)."""


@lru_cache(maxsize=CACHE_SIZE)
def _load(state: tuple[str, int, int]) -> Tokenizer:
    """The tokenizer of the file ``state`` names, read with a bounded ``read`` (``tokenizers``' own JSON
    parser refuses nesting past 128 levels, so depth needs no scan of ours)."""
    path = state[0]
    data = read_bytes(path, TOKENIZER_BYTES, TOKENIZER_FILE)
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise CheckpointError(f"source: {path} is not a readable tokenizer.json ({str(e)[:200]})") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def tokenizer(ckpt: Checkpoint) -> Tokenizer:
    """The checkpoint's tokenizer, without padding or truncation (a GGUF file builds its own)."""
    build = getattr(ckpt, "build_tokenizer", None)
    if build is not None:
        return build()
    path: Path = ckpt.folder / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(
            f"source {ckpt.name!r} has no {TOKENIZER_FILE}, so a text cannot be "
            "tokenised; pass token ids instead of a text"
        )
    st = path.stat()
    return _load((str(path), st.st_size, st.st_mtime_ns))


def _check_length(ids: list[int], max_positions: int, what: str) -> list[int]:
    if not ids:
        raise InputError(f"text_or_ids must hold at least one token, got {what} with none")
    if len(ids) > max_positions:  # in words a reader of the app's message knows (no argument name)
        raise ModelRangeError(
            f"the {'text' if what.startswith('a text') else 'sequence of token ids'} is "
            f"{len(ids)} tokens long, more than the model's {max_positions} positions; "
            "shorten it"
        )
    return ids


def token_ids(
    ckpt: Checkpoint, text_or_ids: str | Sequence[int] | torch.Tensor, vocab_size: int, max_positions: int
) -> list[int]:
    """``text_or_ids`` as a list of token ids, checked: non-empty, at most ``max_positions``,
    each id in ``[0, vocab_size)``. A string is tokenised; a sequence or 1-D integer tensor is
    taken as ids."""
    if isinstance(text_or_ids, str):
        if not text_or_ids.strip():
            raise InputError(
                "text_or_ids must be a non-empty text or a sequence of token ids, got an empty text"
            )
        ids = _check_length(tokenizer(ckpt).encode(text_or_ids).ids, max_positions, "a text that tokenises")
    else:
        if isinstance(text_or_ids, torch.Tensor):
            if (
                text_or_ids.ndim != 1
                or text_or_ids.dtype.is_floating_point
                or text_or_ids.is_complex()
                or text_or_ids.dtype == torch.bool
            ):
                raise InputError(
                    f"text_or_ids as a tensor must be 1-D integer token ids, got shape "
                    f"{tuple(text_or_ids.shape)} and dtype {text_or_ids.dtype}"
                )
            text_or_ids = text_or_ids.tolist()
        if not isinstance(text_or_ids, Sequence) or any(
            isinstance(t, bool) or not isinstance(t, int) for t in text_or_ids
        ):
            raise InputError(
                f"text_or_ids must be a text or a sequence of integer token ids, got "
                f"{type(text_or_ids).__name__}"
            )
        ids = _check_length(list(text_or_ids), max_positions, "a sequence")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InputError(
            f"text_or_ids: token ids must be in [0, {vocab_size - 1}] (the vocabulary), got "
            f"{', '.join(map(str, bad[:5]))}{' …' if len(bad) > 5 else ''}"
        )
    return ids


def token_strings(ckpt: Checkpoint, ids: list[int]) -> list[str]:
    """The tokenizer's string for each id (``"[CLS]"``, ``"##z"``, ``"Ġthe"``), or ``"#id"``
    where the folder has no tokenizer."""
    if not getattr(ckpt, "has_tokenizer", (ckpt.folder / TOKENIZER_FILE).is_file()):
        return [f"#{t}" for t in ids]
    tok = tokenizer(ckpt)
    return [tok.id_to_token(t) or f"#{t}" for t in ids]
