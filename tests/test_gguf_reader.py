"""hessviz's own GGUF header reader (:mod:`hessviz.pretrained.gguf_header`, the tensor views of
:mod:`hessviz.pretrained.gguf_file`) against ``gguf.GGUFReader``, which it replaces: the same metadata
(values and Python types), the same vocabulary arrays, and for every tensor the same data array
(``dtype``, shape, bytes) that ``gguf.quants.dequantize`` is given. A tiny file of every value type and
several tensor types in both byte orders, and the bundled SmolLM2 file (its 49k-token vocabulary and
48k merges, 272 tensors)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from hessviz.errors import CheckpointError
from hessviz.pretrained import gguf_file
from tests.test_loaders_fail_closed import gguf_file as gguf_file_of
from tests.test_loaders_fail_closed import gguf_string

gg = pytest.importorskip("gguf")


def opened(path):
    st = path.stat()
    return gguf_file._open_file((str(path), st.st_size, st.st_mtime_ns))


def assert_same_as_reader(path) -> int:
    """Everything hessviz reads of ``path`` equals what ``gguf.GGUFReader`` reads; the tensors compared."""
    mine, reader = opened(path), gg.GGUFReader(str(path))
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    metadata = {k: f.contents() for k, f in fields.items() if k not in gguf_file._DEFERRED}
    assert mine.metadata == metadata
    assert {k: type(v) for k, v in mine.metadata.items()} == {k: type(v) for k, v in metadata.items()}
    for key in gguf_file._DEFERRED:
        assert mine.has(key) == (key in fields)
        if key in fields:
            values, expected = mine.array(key), fields[key].contents()
            assert values == expected and list(map(type, values)) == list(map(type, expected)), key
    tensors = {t.name: t for t in reader.tensors}
    for t in mine.tensors.values():
        ref = tensors[t.name]
        assert (t.tensor_type, t.shape) == (ref.tensor_type, tuple(ref.shape.tolist()))
        assert (t.data.dtype, t.data.shape) == (ref.data.dtype, ref.data.shape), t.name
        assert np.array_equal(t.data, ref.data), t.name
        assert not t.data.flags.writeable
    return len(mine.tensors)


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_every_value_and_tensor_type_reads_as_gguf_reads_it(tmp_path, endian):
    path = tmp_path / "tiny.gguf"
    T = gg.GGUFValueType
    w = gg.GGUFWriter(str(path), "llama", endianess=gg.GGUFEndian[endian])
    scalars = {
        T.UINT8: 200,
        T.INT8: -100,
        T.UINT16: 60000,
        T.INT16: -30000,
        T.UINT32: 4_000_000_000,
        T.INT32: -2_000_000_000,
        T.FLOAT32: 0.1,
        T.BOOL: True,
        T.UINT64: 2**63 + 5,
        T.INT64: -(2**62),
        T.FLOAT64: 0.1,
        T.STRING: "héllo ▁ 日本",
    }
    for kind, value in scalars.items():
        w.add_key_value(f"x.{kind.name}", value, kind)
        if kind != T.STRING:
            w.add_key_value(f"x.{kind.name}.list", [value, value], T.ARRAY, sub_type=kind)
    w.add_key_value("x.strings", ["a", "", "ü b"], T.ARRAY, sub_type=T.STRING)
    w.add_uint32("general.alignment", 64)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "▁ab", "<0x00>"])
    w.add_array("tokenizer.ggml.merges", ["a b"])
    w.add_array("tokenizer.ggml.token_type", [1, 1, 1, 6])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0, -3.0])
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((6, 256)).astype(np.float32)
    w.add_tensor("token_embd.weight", rows)
    w.add_tensor("output_norm.weight", rng.standard_normal(256).astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal((2, 3, 4)).astype(np.float32))
    for name, kind in [("attn_q", "Q8_0"), ("attn_k", "Q4_0"), ("attn_v", "BF16"), ("ffn_up", "Q4_K")]:
        qtype = gg.GGMLQuantizationType[kind]
        if kind == "Q4_K":  # gguf does not quantize to it: any bytes, 144 a block of 256
            raw = rng.integers(0, 256, (6, 144), dtype=np.uint8)
        else:
            raw = gg.quants.quantize(rows, qtype)
        w.add_tensor(f"blk.0.{name}.weight", raw, raw_shape=raw.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert assert_same_as_reader(path) == 7
    mine = opened(path)
    assert mine.metadata["x.STRING"] == "héllo ▁ 日本" and mine.metadata["x.UINT64.list"] == [2**63 + 5] * 2
    assert "tokenizer.ggml.tokens" not in mine.metadata  # read only for a text
    q = mine.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert np.array_equal(
        gg.quants.dequantize(q.data, q.tensor_type),
        gg.quants.dequantize(gg.quants.quantize(rows, q.tensor_type), q.tensor_type),
    )


def test_a_row_that_is_not_whole_blocks_is_one_error(tmp_path):
    """A Q8_0 tensor of 40 values a row (blocks of 32): its data lies inside the file, its rows do not
    split into blocks (``gguf.GGUFWriter`` writes no such file)."""
    path = gguf_file_of(tmp_path / "odd.gguf", tensors=[("token_embd.weight", (40, 2), 8, 0)])
    path.write_bytes(path.read_bytes() + bytes(256))
    with pytest.raises(
        CheckpointError, match=r"tensor 'token_embd.weight' \(Q8_0\) of shape .* cannot be read"
    ):
        opened(path)


def test_an_opened_file_pickles_as_its_state(tmp_path):
    """A checkpoint that holds the mapped file (``hv.load_model``'s model does) pickles as the file's
    state and unpickles to the same opened file; a file changed since is refused."""
    path = gguf_file_of(tmp_path / "t.gguf", keys=[("general.architecture", 8, gguf_string("llama"))])
    mine = opened(path)
    data = pickle.dumps(mine)
    assert len(data) < 1000 and pickle.loads(data) is mine
    os.utime(path, ns=(0, 0))
    with pytest.raises(CheckpointError, match="changed since it was opened"):
        pickle.loads(data)


def test_the_bundled_smollm2_file_reads_as_gguf_reads_it():
    """~5 s: ``gguf.GGUFReader`` builds its views of 97k vocabulary items."""
    from hessviz.pretrained.checkpoint import bundled_file

    try:
        path = bundled_file("smollm2-135m")
    except CheckpointError as e:
        pytest.skip(str(e))
    assert assert_same_as_reader(path) == 272
