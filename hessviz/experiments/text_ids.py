"""Token ids of a text for the claims' protocols, for every model they run on.

hessviz's own tokenizer (:func:`hessviz.pretrained.tokens.tokenizer`) serves every source it can
build one for; a GGUF file with a SentencePiece vocabulary (Gemma 3: ``tokenizer.ggml.model =
'llama'``) is refused for texts. For those, ``benchmarks/gemma3_tokenizer.py`` converts the file's
vocabulary once with ``transformers`` and saves it as :func:`cached` (a ``tokenizers`` JSON), which
:func:`tokenizer` then loads (``tokenizers`` only, no ``transformers`` here).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from hessviz.errors import CheckpointError
from hessviz.resources import cache_dir


def cached(source: str) -> Path:
    """Where a converted tokenizer of ``source`` lives: ``<cache>/<source>-tokenizer.json``."""
    return cache_dir() / f"{Path(str(source)).name}-tokenizer.json"


@lru_cache(maxsize=8)
def tokenizer(source: str):
    """``source``'s tokenizer (anything with ``encode(text).ids``): hessviz's own, else the converted one
    of :func:`cached`; a :class:`CheckpointError` saying how to make it when neither exists."""
    from hessviz.pretrained import tokens
    from hessviz.pretrained.sources import open_source

    try:
        tok = tokens.tokenizer(open_source(source))
        tok.encode("a")
        return tok
    except CheckpointError as e:
        path = cached(source)
        if not path.is_file():
            raise CheckpointError(
                f"{e}; for the claims, convert it once: python benchmarks/gemma3_tokenizer.py ({path})"
            ) from None
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path))


def text_ids(source: str, text: str) -> list[int]:
    """``text``'s token ids under :func:`tokenizer` (special tokens as it adds them)."""
    return list(tokenizer(source).encode(text).ids)
