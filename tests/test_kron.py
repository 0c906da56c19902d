"""``kron.sandwich_into`` produces a block in slices of rows of about ``CHUNK_BYTES``; every
other test fits in one 4 MiB slice, so here the slice is made tiny and the multi-slice
result is checked against the dense sum and against the one-slice Hessian."""

from __future__ import annotations

import pytest
import torch

import hessviz as hv
from hessviz.ops import kron
from hessviz.ops.kron import LEFT, RIGHT, Factored, KronTerm

L, N_OUT = 5, 3


def _factored(g: torch.Generator, shape: tuple[int, int], kinds: tuple[str, ...]) -> Factored:
    n1, n2 = shape
    terms = []
    for kind in kinds:
        nv, nm = (n1, n2) if kind == LEFT else (n2, n1)
        terms.append(
            KronTerm(
                kind,
                torch.randn(L, nv, generator=g, dtype=torch.float64),
                torch.randn(L, N_OUT, nm, generator=g, dtype=torch.float64),
            )
        )
    return Factored(tuple(terms))


@pytest.fixture
def slices(monkeypatch):
    """CHUNK_BYTES of one byte (one block row per slice), counting the slices each term pair makes."""
    counts: list[tuple[int, int]] = []
    rows = kron._TermPair.rows

    def counted(self, start, stop):
        counts.append((start, stop))
        return rows(self, start, stop)

    monkeypatch.setattr(kron, "CHUNK_BYTES", 1)
    monkeypatch.setattr(kron._TermPair, "rows", counted)
    return counts


def test_sandwich_into_many_slices_matches_the_dense_sum(slices):
    g = torch.Generator().manual_seed(0)
    Ja = _factored(g, (4, 3), (LEFT, RIGHT))
    Jb = _factored(g, (2, 5), (RIGHT, LEFT))
    N = torch.randn(L, N_OUT, N_OUT, generator=g, dtype=torch.float64)
    out = torch.empty(12, 10, dtype=torch.float64)
    mirror = torch.empty(10, 12, dtype=torch.float64)
    kron.sandwich_into(out.view(4, 3, 2, 5), [(Ja, N, Jb), (Ja, None, Jb)], mirror.view(2, 5, 4, 3))
    A, B = Ja.dense(), Jb.dense()  # (L, n_out, P_a), (L, n_out, P_b)
    expected = torch.einsum("toa,top,tpb->ab", A, N, B) + torch.einsum("toa,tob->ab", A, B)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(mirror, out.T)  # the mirror is a copy, not a recomputation
    assert sorted(set(slices)) == [(i, i + 1) for i in range(4)]  # one slice per row α of W_a (4 rows)


def test_hessian_is_the_same_in_one_slice_or_many(slices):
    cfg = hv.BlockConfig(seq_len=4, d_model=6, d_k=3, d_ff=8, norm="post", activation="gelu")
    params = hv.init_params(cfg, seed=3)
    X, Y = hv.sample_inputs(cfg, seed=3, input_norm=2.0)
    many = hv.hessian(cfg, params, X, Y).full.clone()
    assert any(start > 0 for start, _ in slices)  # blocks were built in more than one slice
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kron, "CHUNK_BYTES", 1 << 22)
        one = hv.hessian(cfg, params, X, Y).full
    torch.testing.assert_close(many, one, rtol=1e-13, atol=1e-15)
