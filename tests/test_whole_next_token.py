"""The chunked next-token objective (hessviz.losses.next_token) against itself in one chunk, its
curvature built as token-wise blocks: value, gradient and curvature products, for a
LayerNorm, an RMSNorm and a norm-less head, at chunk sizes that do not divide the token count."""

from __future__ import annotations

import pytest
import torch

from hessviz.errors import InputError
from hessviz.losses import next_token as nt

L, D, V = 11, 6, 37


def head(kind: str, dtype=torch.float64) -> nt.LMHead:
    g = torch.Generator().manual_seed(3)
    gamma = 1 + 0.3 * torch.randn(D, generator=g, dtype=torch.float64)
    beta = 0.2 * torch.randn(D, generator=g, dtype=torch.float64)
    E = torch.randn(V, D, generator=g, dtype=torch.float64)
    if kind == "none":
        return nt.LMHead(None, None, 0.0, E.to(dtype))
    return nt.LMHead(
        gamma.to(dtype), beta.to(dtype) if kind == "layernorm" else None, 1e-5, E.to(dtype), kind
    )


def inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(4)
    Z = torch.randn(L, D, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (L,), generator=g)
    dZ = torch.randn(3, L, D, generator=g, dtype=torch.float64)
    return Z.to(dtype), ids, dZ.to(dtype)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "none"])
@pytest.mark.parametrize("chunk", [1, 3, 4, 10, 64])
@pytest.mark.parametrize("keep", [True, False])
def test_chunked_is_the_unchunked_objective_in_float64(kind, chunk, keep, monkeypatch):
    """``keep``: the softmax kept from the point for the products (small ``L' V``), or recomputed
    with the logits in each product (``KEEP_PROBABILITIES = 0``): the same numbers either way."""
    if not keep:
        monkeypatch.setattr(nt, "KEEP_PROBABILITIES", 0)
    Z, ids, dZ = inputs()
    ref = nt.NextToken(Z, ids, head(kind))
    blocks = ref.token_curvature()
    got = nt.NextToken(Z, ids, head(kind), chunk=chunk)
    assert abs(float(got.value - ref.value)) <= 1e-14 * abs(float(ref.value))
    assert rel(got.grad, ref.grad) <= 1e-14
    want = torch.einsum("tij,ktj->kti", blocks, dZ)
    assert rel(got.product(dZ), want) <= 1e-13
    assert got.product(dZ)[:, -1].abs().max() == 0  # the last position has no target
    assert rel(got.token_curvature(), blocks) <= 1e-13  # the token-wise form of small widths
    assert (got.kept is not None) == keep


@pytest.mark.parametrize("block", [7, 4])
@pytest.mark.parametrize("wide_rows", [1, 10_000])
def test_vocabulary_blocks_are_the_whole_vocabulary(block, wide_rows, monkeypatch):
    """A product with ``p`` kept runs ``E`` in blocks of rows (the last one narrower when the
    vocabulary is not a multiple of the block): the same numbers as the token-wise blocks."""
    monkeypatch.setattr(nt, "VOCAB_BLOCK", block)
    monkeypatch.setattr(nt, "VOCAB_BLOCK_WIDE", block + 3)
    monkeypatch.setattr(nt, "WIDE_ROWS", wide_rows)
    Z, ids, dZ = inputs()
    got = nt.NextToken(Z, ids, head("rmsnorm"), chunk=4)
    assert got.kept is not None and got.E.shape[0] % block and got.E.shape[0] % (block + 3)
    want = torch.einsum("tij,ktj->kti", got.token_curvature(), dZ)
    assert rel(got.product(dZ), want) <= 1e-13


def test_float32_is_exact_to_its_floor():
    Z, ids, dZ = inputs()
    ref = nt.NextToken(Z, ids, head("layernorm"), chunk=4)  # float64: the exact numbers
    got = nt.NextToken(Z.float(), ids, head("layernorm", torch.float32), chunk=3)
    eps = torch.finfo(torch.float32).eps
    assert abs(float(got.value) - float(ref.value)) <= 10 * eps * abs(float(ref.value))
    assert rel(got.grad.double(), ref.grad) <= 50 * eps
    assert rel(got.product(dZ.float()).double(), ref.product(dZ)) <= 50 * eps


def test_default_chunk_follows_the_memory_guard():
    from hessviz.runtime import memory

    memory.set_memory_limit("64MiB")
    try:
        c = nt.default_chunk(50257, torch.float32, "cpu")
        assert c >= 1 and (2 * 8 + 3) * c * 50257 * 4 <= (64 << 20) // nt.CHUNK_SHARE
        memory.set_memory_limit("1KiB")
        assert nt.default_chunk(50257, torch.float32, "cpu") == 1
    finally:
        memory.set_memory_limit(None)


def test_bad_chunk_and_ids_are_named():
    Z, ids, _ = inputs()
    with pytest.raises(InputError, match="chunk"):
        nt.NextToken(Z, ids, head("layernorm"), chunk=0)
    with pytest.raises(InputError, match="ids"):
        nt.NextToken(Z, ids[:3], head("layernorm"))
