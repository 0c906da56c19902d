"""Gemma 3's tokenizer for the real-LLM claims, written once by ``transformers`` into hessviz's cache.

hessviz builds byte-level BPE tokenizers from a GGUF file; Gemma 3's is a SentencePiece vocabulary
(``tokenizer.ggml.model = 'llama'``), refused for texts. ``transformers`` converts it (minutes: it
reads the whole GGUF file); this script saves the converted ``tokenizers`` object as
``<cache>/gemma3-270m-tokenizer.json`` (:func:`hessviz.experiments.text_ids.cached`), which the claims'
protocols (:mod:`hessviz.experiments.sharpness`, the docstring task of the Gini protocol) read.

    python benchmarks/gemma3_tokenizer.py
"""

from __future__ import annotations

import time

import transformers

from hessviz.experiments import text_ids
from hessviz.pretrained.checkpoint import assembled_file


def main(source: str = "gemma3-270m") -> None:
    t = time.perf_counter()
    gguf = assembled_file(source)
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out = text_ids.cached(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.backend_tokenizer.save(str(out))
    print(f"wrote {out} in {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
