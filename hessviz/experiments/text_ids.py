"""Token ids of a text for the claims' protocols, for every model they run on.

hessviz's own tokenizer (:func:`hessviz.pretrained.tokens.tokenizer`) serves every source: a folder's
``tokenizer.json``, a GGUF file's byte-level BPE (SmolLM2) or SentencePiece vocabulary (Gemma 3,
:mod:`hessviz.pretrained.gguf_spm`, the ids ``transformers`` gives for the same file).
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=8)
def tokenizer(source: str):
    """``source``'s tokenizer (``encode(text).ids``), built once per process."""
    from hessviz.pretrained import tokens
    from hessviz.pretrained.sources import open_source

    return tokens.tokenizer(open_source(source))


def text_ids(source: str, text: str) -> list[int]:
    """``text``'s token ids under :func:`tokenizer` (special tokens as it adds them)."""
    return list(tokenizer(source).encode(text).ids)
