"""``kron.sandwich_into`` produces a block in slices of rows of about ``CHUNK_BYTES``; every
other test fits in one 4 MiB slice, so here the slice is made tiny and the multi-slice
result is checked against the dense sum and against the one-slice Hessian."""

from __future__ import annotations

import pytest
import torch

import hessviz as hv
from hessviz.ops import kron
from hessviz.ops.kron import LEFT, RIGHT, Factored, KronTerm
from hessviz.ops.softcap import CappedCurvature
from hessviz.ops.softmax import contract_hessian_factored

L, N_OUT = 5, 5  # two terms on each side stay Kronecker pairs (2² < N_OUT: Factored.packed)


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

    def counting(rows):
        def counted(self, start, stop):
            counts.append((start, stop))
            return rows(self, start, stop)

        return counted

    monkeypatch.setattr(kron, "CHUNK_BYTES", 1)
    for pair in (kron._TermPair, kron._WholePair):
        monkeypatch.setattr(pair, "rows", counting(pair.rows))
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


def _written(J: Factored) -> Factored:
    """The same Jacobian kept written out."""
    return Factored.from_dense(J.dense().reshape(L, N_OUT, *J.shape))


def _middles(g: torch.Generator) -> dict[str, tuple[object, torch.Tensor | None]]:
    """Each kind of middle with its dense ``(L, N_OUT, N_OUT)`` form (``None``: the identity)."""
    a = torch.softmax(torch.randn(L, N_OUT, generator=g, dtype=torch.float64), -1)
    Q = contract_hessian_factored(a, torch.randn(L, N_OUT, generator=g, dtype=torch.float64))
    d1, e = (torch.randn(L, N_OUT, generator=g, dtype=torch.float64) for _ in range(2))
    capped = CappedCurvature(Q, d1, e)
    N = torch.randn(L, N_OUT, N_OUT, generator=g, dtype=torch.float64)
    return {
        "tensor": (N, N),
        "identity": (None, None),
        "softmax": (Q, Q.dense()),
        "capped": (capped, capped.dense()),
    }


@pytest.mark.parametrize("middle", ["tensor", "identity", "softmax", "capped"])
@pytest.mark.parametrize("forms", [(True, True), (True, False), (False, True)])
def test_written_out_jacobians_match_the_dense_sum(slices, middle, forms):
    """A written-out Jacobian (``Factored.whole``) against another (one GEMM of inner dimension
    ``L·n_out``) or against Kronecker terms (one left term of a ``(1, n1·n2)`` weight), in slices of
    rows, into strided views of a larger matrix (a head inside a whole weight) and their mirror."""
    g = torch.Generator().manual_seed(1)
    Ja = _factored(g, (4, 3), (LEFT, RIGHT))
    Jb = _factored(g, (2, 5), (RIGHT, LEFT))
    N, dense_N = _middles(g)[middle]
    wa, wb = forms
    Ja_, Jb_ = _written(Ja) if wa else Ja, _written(Jb) if wb else Jb
    big = torch.zeros(4, 5, 2, 7, dtype=torch.float64)  # the block sits in columns 1..3 and 1..5
    mirror = torch.zeros(2, 7, 4, 5, dtype=torch.float64)
    out_view, mirror_view = big[:, 1:4, :, 1:6], mirror[:, 1:6, :, 1:4]
    kron.sandwich_into(out_view, [(Ja_, N, Jb_), (Ja_, None, Jb_)], mirror_view)
    A, B = Ja.dense(), Jb.dense()
    middle_term = (
        torch.einsum("toa,tob->ab", A, B)
        if dense_N is None
        else torch.einsum("toa,top,tpb->ab", A, dense_N, B)
    )
    expected = middle_term + torch.einsum("toa,tob->ab", A, B)
    torch.testing.assert_close(out_view.reshape(12, 10), expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(mirror_view.reshape(10, 12), out_view.reshape(12, 10).T)
    assert big[:, 0].abs().sum() == 0 and big[:, 4].abs().sum() == 0 and big[..., 0].abs().sum() == 0
    assert sorted(set(slices)) == [(i, i + 1) for i in range(4)]


def test_packed_writes_out_many_terms_only():
    """``Factored.packed``: ``k`` terms are written out once ``k² ≥ n_out`` (or ``k > min(n1, n2)``),
    and the written-out Jacobian is the same matrix."""
    g = torch.Generator().manual_seed(2)
    few = _factored(g, (4, 3), (LEFT, RIGHT))  # 2² < N_OUT = 5
    many = _factored(g, (4, 3), (LEFT, RIGHT, LEFT))  # 3² ≥ 5
    assert few.packed is few and few.packed.whole is None
    assert many.packed.whole is not None and many.packed is many.packed  # written out once
    torch.testing.assert_close(many.packed.dense(), many.dense(), rtol=0, atol=0)
    M = torch.randn(L, 2, N_OUT, generator=g, dtype=torch.float64)
    torch.testing.assert_close(many.packed.lmul(M).dense(), many.lmul(M).dense(), rtol=1e-13, atol=1e-13)
