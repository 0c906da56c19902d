"""A GGUF file's SentencePiece vocabulary (``tokenizer.ggml.model = "llama"``) as a ``tokenizers``
BPE tokenizer, for Gemma files (``general.architecture = "gemma3"``): the ids ``transformers`` gives
for the same file (``AutoTokenizer.from_pretrained(folder, gguf_file=...)``, its ``GemmaTokenizer``).

A GGUF file stores a SentencePiece BPE vocabulary as a list of pieces (``tokenizer.ggml.tokens``), one
type each (``token_type``: 1 normal, 3 control, 4 user-defined, 6 byte) and one score each, but no
merges. The tokenizer is rebuilt from that list:

* **Spelling.** SentencePiece writes a space as ``▁`` (U+2581). The file keeps the pieces made only of
  spaces (``"  "``, user-defined runs of 2 to 31 spaces in Gemma 3) in real spaces; they are respelled
  ``▁▁`` …, so that the text, whose spaces become ``▁`` before the model sees it, reaches them.
* **Merges.** A piece ``t`` is reached by merging ``t[:k]`` and ``t[k:]`` for every split ``k`` with both
  halves in the vocabulary. The merges are ranked by their piece, best first, and the splits of one piece
  by the longer left half first: the merge list is ``[(t[:k], t[k:]) for t in pieces by rank for k
  descending]``. A piece's rank is its **position in the file** (rank ``i`` for piece ``i``): Gemma's
  scores fall by one per position among the normal pieces (piece ``i`` scores ``-(i - c)``), so there
  the scores give the same order, but the user-defined and control pieces all score ``-1000``, which
  would rank the space runs behind ~1,500 normal pieces; ``transformers`` ranks by position, and so
  does hessviz (``"a  b"`` is ``a ▁▁ b``, not ``a ▁ ▁b``).
* **Model.** ``tokenizers``' ``BPE`` with ``byte_fallback`` (a character outside the vocabulary becomes
  its UTF-8 bytes, the pieces ``<0x00>`` … ``<0xFF>``; unknown pieces fused into one ``<unk>`` where the
  bytes are missing), on the whole text: the normalizer replaces each space by ``▁``, there is no
  pre-tokenizer (no word split) and no prefix space (``add_space_prefix = true`` is refused).
* **Added tokens.** Control pieces (``<bos>``, ``<start_of_turn>`` …) are special tokens and
  user-defined pieces (``"\\n\\n"``, ``"\\t"``, ``<b>`` …) plain added tokens, both matched whole in the
  raw text before anything else, longest first; the space runs, respelled, go through the merges
  instead.
* **Post-processing.** ``<bos>`` first (``tokenizer.ggml.bos_token_id``) unless the file says
  ``add_bos_token = false``; ``<eos>`` last where it says ``add_eos_token = true``. The decoder turns
  ``▁`` back into spaces and byte pieces back into characters.

A vocabulary of more than :data:`MAX_VOCAB` pieces, a piece longer than :data:`MAX_PIECE` characters, two
pieces of one spelling, a token type list of another length, a special token id outside the vocabulary or
a ``<bos>``/``<eos>`` that cannot be added is a :class:`~hessviz.errors.CheckpointError` naming it:
rebuilding the merges costs two set look-ups per split of a piece (1.2 million splits for Gemma 3's
262,144 pieces: the whole build takes about 2 s).
"""

from __future__ import annotations

from collections.abc import Sequence

from hessviz.errors import CheckpointError
from hessviz.pretrained.bounded import shown

ARCHITECTURES = ("gemma3",)
"""The architectures whose SentencePiece vocabulary is built (Gemma's conventions above)."""
MAX_VOCAB = 1 << 19
"""Real vocabularies hold 32,000 (Llama 2) to 262,144 (Gemma 3) tokens."""
MAX_PIECE = 256
"""Gemma 3's longest piece has 31 characters; a piece costs ``O(len²)`` to split."""
SPACE = "\u2581"
CONTROL, USER_DEFINED = 3, 4


def respelled(token: str) -> str:
    """A piece made only of spaces in SentencePiece's spelling (``"  "`` -> ``"▁▁"``); others as they are."""
    return SPACE * len(token) if token and token.strip(" ") == "" else token


def merges(pieces: Sequence[str]) -> list[tuple[str, str]]:
    """The BPE merges that build ``pieces`` (ranked by position, best first): for each piece ``t`` in
    order, ``(t[:k], t[k:])`` for ``k = len(t) - 1, …, 1`` where both halves are pieces."""
    known = set(pieces)
    out = []
    for t in pieces:
        out.extend((t[:k], t[k:]) for k in range(len(t) - 1, 0, -1) if t[:k] in known and t[k:] in known)
    return out


def check_size(path: str, tokens: list) -> None:
    """Refuse a vocabulary (byte-level or SentencePiece) of more than :data:`MAX_VOCAB` tokens."""
    if len(tokens) > MAX_VOCAB:
        raise CheckpointError(
            f"source {path!r}: GGUF key tokenizer.ggml.tokens holds {len(tokens)} tokens, more than the "
            f"{MAX_VOCAB} hessviz reads (real vocabularies hold 32,000 to 262,144)"
        )


def _checked(path: str, tokens: list[str], types: list[int]) -> dict[str, int]:
    """``piece -> id`` of the respelled pieces, within the bounds above."""
    where = f"source {path!r}: GGUF key tokenizer.ggml"
    check_size(path, tokens)
    if types and len(types) != len(tokens):
        raise CheckpointError(
            f"{where}.token_type has {len(types)} items for {len(tokens)} tokens; it needs one per token"
        )
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if not t or len(t) > MAX_PIECE:
            raise CheckpointError(
                f"{where}.tokens item {i} is {shown(t)}, {len(t)} characters long; a piece has 1 to "
                f"{MAX_PIECE} (Gemma 3's longest has 31)"
            )
        spelled = respelled(t)
        if spelled in vocab:
            raise CheckpointError(
                f"{where}.tokens items {vocab[spelled]} and {i} are both {shown(spelled)} (spaces as "
                f"{SPACE!r}); a vocabulary spells each piece once"
            )
        vocab[spelled] = i
    return vocab


def _special(path: str, metadata: dict, key: str, tokens: list[str]) -> str | None:
    """The piece ``tokenizer.ggml.{key}`` names (``None`` when the file has no such key)."""
    value = metadata.get(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(tokens):
        raise CheckpointError(
            f"source {path!r}: GGUF key tokenizer.ggml.{key} = {shown(value)} is not a token id in "
            f"[0, {len(tokens) - 1}]"
        )
    return tokens[value]


def _flag(path: str, metadata: dict, key: str, default: bool) -> bool:
    value = metadata.get(f"tokenizer.ggml.{key}", default)
    if not isinstance(value, bool):
        raise CheckpointError(
            f"source {path!r}: GGUF key tokenizer.ggml.{key} must be true or false, got {shown(value)}"
        )
    return value


def sentencepiece_tokenizer(path: str, metadata: dict, tokens: list[str], types: list[int]):
    """The ``tokenizers.Tokenizer`` of a Gemma file's SentencePiece vocabulary (module docstring);
    ``metadata``: the file's keys, ``tokens``/``types``: ``tokenizer.ggml.tokens``/``token_type``."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"source {path!r}: a SentencePiece vocabulary (tokenizer.ggml.model = 'llama') is built for "
            f"{', '.join(map(repr, ARCHITECTURES))} files, not {shown(arch)}; pass token ids"
        )
    if _flag(path, metadata, "add_space_prefix", False):
        raise CheckpointError(
            f"source {path!r}: GGUF key tokenizer.ggml.add_space_prefix = true is not supported for "
            "texts (Gemma's tokenizer adds no prefix space); pass token ids"
        )
    vocab = _checked(path, tokens, types)
    pieces = list(vocab)
    unk = _special(path, metadata, "unknown_token_id", tokens)
    unk = unk if unk is not None else ("<unk>" if "<unk>" in vocab else None)
    try:
        tok = Tokenizer(
            BPE(vocab=vocab, merges=merges(pieces), unk_token=unk, fuse_unk=True, byte_fallback=True)
        )
    except Exception as e:  # tokenizers raises a bare Exception
        raise CheckpointError(
            f"source {path!r}: the GGUF SentencePiece vocabulary makes no BPE tokenizer ({str(e)[:200]})"
        ) from None
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    for kind, special in ((CONTROL, True), (USER_DEFINED, False)):
        added = [
            AddedToken(t, normalized=False, special=special)
            for t, k in zip(tokens, types)
            if k == kind and respelled(t) == t  # a respelled space run is reached by the merges
        ]
        if special:
            tok.add_special_tokens(added)
        else:
            tok.add_tokens(added)
    single = _ends(path, metadata, tokens)
    if len(single) > 1:
        try:
            tok.post_processor = processors.TemplateProcessing(
                single=single, special_tokens=[(t, vocab[t]) for t in single if t != "$A"]
            )
        except Exception as e:  # a piece the template cannot hold ("$A" itself)
            raise CheckpointError(
                f"source {path!r}: the GGUF special tokens {shown(single)} make no template ({str(e)[:200]})"
            ) from None
    return tok


def _ends(path: str, metadata: dict, tokens: list[str]) -> list[str]:
    """The template of one text: ``["<bos>", "$A"]`` as ``add_bos_token`` (default true, as llama.cpp
    and ``transformers`` take it for a SentencePiece vocabulary) and ``add_eos_token`` (default false)
    say."""

    def piece(key: str) -> str:
        named = _special(path, metadata, f"{key}_token_id", tokens)
        if named is None or respelled(named) != named or named.startswith("$"):
            raise CheckpointError(  # "$…" is the template's mark of the text itself
                f"source {path!r}: GGUF key tokenizer.ggml.add_{key}_token is true but "
                f"tokenizer.ggml.{key}_token_id names no token that can be added ({shown(named)}); "
                "pass token ids"
            )
        return named

    bos = [piece("bos")] if _flag(path, metadata, "add_bos_token", True) else []
    eos = [piece("eos")] if _flag(path, metadata, "add_eos_token", False) else []
    return [*bos, "$A", *eos]
