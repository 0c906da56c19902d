"""A Gemma GGUF file's SentencePiece vocabulary as a tokenizer (:mod:`hessviz.pretrained.gguf_spm`),
on a tiny synthetic vocabulary written to a ``gemma3`` GGUF header: the merges the pieces imply, in file
order, derived here by hand; the ids a text gets (merges, respelled space runs, added tokens, byte
fallback, ``<bos>``); and each bound that fails closed. The real Gemma 3 vocabulary against
``transformers`` is ``tests/test_pretrained_gemma_gguf.py`` (slow tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hessviz.errors import CheckpointError
from hessviz.pretrained import gguf_spm, tokens
from hessviz.pretrained.sources import open_source

gg = pytest.importorskip("gguf")

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0–3, control
USER = ["\n", "  "]  # ids 4, 5: user-defined; "  " is respelled "▁▁"
BYTES = [f"<0x{b:02X}>" for b in range(256)]  # ids 6–261
NORMAL = ["▁", "a", "b", "c", "bc", "ab", "▁b", "cab", "abc"]  # ids 262–270, scores falling by one
PIECES = SPECIAL + USER + BYTES + NORMAL
TYPES = [3] * 4 + [4] * 2 + [6] * 256 + [1] * len(NORMAL)
SCORES = [-1000.0] * 262 + [-float(i) for i in range(len(NORMAL))]  # as Gemma 3's file: -1000 off the list
ID = {p.replace(" ", "▁"): i for i, p in enumerate(PIECES)}


def byte(b: int) -> int:
    return 6 + b


def write_gemma_gguf(path: Path, pieces=PIECES, types=TYPES, scores=SCORES, **keys: object) -> Path:
    """A ``gemma3`` GGUF file of metadata only (a config and the vocabulary, no tensors); ``keys`` add or
    replace ``tokenizer.ggml.*`` keys (a bool, an int or a string)."""
    w = gg.GGUFWriter(str(path), "gemma3")
    for key, value in {
        "block_count": 1,
        "context_length": 64,
        "embedding_length": 8,
        "feed_forward_length": 16,
        "attention.head_count": 2,
        "attention.head_count_kv": 1,
        "attention.key_length": 4,
        "attention.sliding_window": 16,
    }.items():
        w.add_uint32(f"gemma3.{key}", value)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", pieces)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.scores", scores)
    values = {"bos_token_id": 2, "eos_token_id": 1, "unknown_token_id": 3, "add_bos_token": True}
    values["add_space_prefix"] = False  # Gemma 3's file says so
    for key, value in (values | keys).items():
        if isinstance(value, bool):
            w.add_bool(f"tokenizer.ggml.{key}", value)
        elif isinstance(value, int):
            w.add_uint32(f"tokenizer.ggml.{key}", value)
        else:
            w.add_string(f"tokenizer.ggml.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return open_source(write_gemma_gguf(tmp_path_factory.mktemp("spm") / "tiny-gemma.gguf"))


def test_merges_follow_the_pieces_in_file_order():
    """By hand: "  " (id 5, respelled) gives (▁, ▁); bc, ab, ▁b, cab one merge each ("ca" is no piece);
    abc two, the longer left half first. Control, byte and one-character pieces give none."""
    pieces = [p.replace(" ", "▁") if not p.strip(" ") else p for p in PIECES]
    assert gguf_spm.merges(pieces) == [
        ("▁", "▁"),
        ("b", "c"),
        ("a", "b"),
        ("▁", "b"),
        ("c", "ab"),
        ("ab", "c"),
        ("a", "bc"),
    ]
    assert gguf_spm.respelled("   ") == "▁▁▁" and gguf_spm.respelled("\n") == "\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        # a b c: (b, c) ranks before (a, b), then (a, bc) makes abc
        ("abc", ["<bos>", "abc"]),
        # c a b: (a, b), then (c, ab)
        ("cab", ["<bos>", "cab"]),
        # a ▁ ▁ b: "  " (file position 5) merges before ▁b (position 268), though its score is -1000
        ("a  b", ["<bos>", "a", "▁▁", "b"]),
        ("a b", ["<bos>", "a", "▁b"]),
        # "\n" is matched whole; d and é are not pieces: their UTF-8 bytes
        ("ab\nd", ["<bos>", "ab", "\n", byte(0x64)]),
        ("é", ["<bos>", byte(0xC3), byte(0xA9)]),
        # a control piece in the text is that token; no prefix space before the first word
        ("<eos>bc", ["<bos>", "<eos>", "bc"]),
    ],
)
def test_a_text_gets_the_hand_derived_ids(tiny, text, expected):
    ids = [ID[e] if isinstance(e, str) else e for e in expected]
    assert tokens.token_ids(tiny, text, len(PIECES), 64) == ids
    assert tiny.build_tokenizer().decode(ids) == text.replace("<eos>", "")  # special tokens skipped


def test_the_tokenizer_is_built_once_per_file(tiny):
    assert tiny.build_tokenizer() is open_source(tiny.folder).build_tokenizer()


def test_without_add_bos_token_no_bos_and_with_add_eos_token_eos_last(tmp_path):
    ckpt = open_source(write_gemma_gguf(tmp_path / "t.gguf", add_bos_token=False, add_eos_token=True))
    assert tokens.token_ids(ckpt, "ab", len(PIECES), 64) == [ID["ab"], ID["<eos>"]]


def refused(path: Path, match: str) -> str:
    with pytest.raises(CheckpointError, match=match) as info:
        tokens.token_ids(open_source(path), "ab", len(PIECES), 64)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    return str(info.value)


def test_an_absurd_vocabulary_is_refused(tmp_path, monkeypatch):
    """The bound is checked before any merge is derived, for a SentencePiece and a byte-level vocabulary
    alike (lowered here to keep the files tiny)."""
    from tests.test_loaders_fail_closed import V, write_llama_gguf

    monkeypatch.setattr(gguf_spm, "MAX_VOCAB", V - 1)
    refused(
        write_gemma_gguf(tmp_path / "big.gguf"), f"tokens holds {len(PIECES)} tokens, more than the {V - 1}"
    )
    write_llama_gguf(tmp_path / "big-bpe.gguf")
    refused(tmp_path / "big-bpe.gguf", f"tokens holds {V} tokens, more than the {V - 1}")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"pieces": PIECES + ["▁▁"]}, r"items 5 and 271 are both '▁▁'"),
        ({"pieces": PIECES + ["x" * 300]}, "item 271 is 'xxx.*…, 300 characters long"),
        ({"types": TYPES[:-1]}, "token_type has 270 items for 271 tokens"),
        ({"bos_token_id": 9999}, r"bos_token_id = 9999 is not a token id in \[0, 270\]"),
        ({"add_space_prefix": True}, "add_space_prefix = true is not supported"),
        ({"add_bos_token": "yes"}, "add_bos_token must be true or false, got 'yes'"),
        ({"pieces": PIECES + ["$A"], "bos_token_id": 271}, r"bos_token_id names no token .*\('\$A'\)"),
        ({"add_eos_token": True, "eos_token_id": 5}, r"eos_token_id names no token .*\('  '\)"),
    ],
)
def test_a_bad_sentencepiece_vocabulary_is_one_error(tmp_path, change, match):
    pieces = change.pop("pieces", PIECES)
    kinds = change.pop("types", TYPES + [1] * (len(pieces) - len(PIECES)))
    scores = SCORES + [-100.0] * (len(pieces) - len(PIECES))
    refused(write_gemma_gguf(tmp_path / "bad.gguf", pieces, kinds, scores, **change), match)


def test_a_sentencepiece_vocabulary_of_another_architecture_is_refused(tmp_path):
    """Llama 2's SentencePiece conventions differ from Gemma's (a prefix space, no byte runs): ids only."""
    from tests.test_loaders_fail_closed import write_llama_gguf

    path = tmp_path / "llama-spm.gguf"
    write_llama_gguf(path, **{"tokenizer.ggml.model": "llama"})
    with pytest.raises(CheckpointError, match="built for 'gemma3' files, not 'llama'; pass token ids"):
        tokens.token_ids(open_source(path), "ab", 16, 32)
