"""The batched products (:mod:`hessviz.ops.batched`) against their einsum definitions, writing in place."""

import pytest
import torch

from hessviz.ops import batched as bt
from tests.helpers import assert_close
from tests.ops.autograd import randn


@pytest.mark.parametrize("k", [1, 3])
def test_tangent_times(rng, rtol, k):
    A, b = randn(rng, k, 4, 5), randn(rng, 5, 2)
    assert_close(bt.tangent_times(A, b), torch.einsum("kln,nm->klm", A, b), rtol, "A_j b")


@pytest.mark.parametrize("k", [1, 3])
def test_primal_times_heads(rng, rtol, k):
    X, Y = randn(rng, 2, 4, 5), randn(rng, k, 2, 5, 3)
    assert_close(bt.primal_times_heads(X, Y), torch.einsum("hab,khbw->khaw", X, Y), rtol, "X Y_j")
    Y1 = randn(rng, 2, 5, 3)  # unbatched: a plain product
    assert_close(bt.primal_times_heads(X, Y1), X @ Y1, rtol, "X Y")


def test_add_primal_times_in_place_on_a_column_block(rng, rtol):
    out, a, B = randn(rng, 3, 4, 6), randn(rng, 4, 5), randn(rng, 3, 5, 2)
    expected = out.clone()
    expected[..., 2:4] += torch.einsum("ln,knm->klm", a, B)
    block = out[..., 2:4]
    assert bt.add_primal_times_(block, a, B) is block
    assert_close(out, expected, rtol, "out_j += a B_j into columns 2:4")


def test_add_primal_times_T(rng, rtol):
    out, a, B = randn(rng, 3, 4, 5), randn(rng, 4, 2), randn(rng, 3, 5, 2)
    expected = out + torch.einsum("lm,knm->kln", a, B)
    assert_close(bt.add_primal_times_T_(out, a, B), expected, rtol, "out_j += a B_jᵀ")


@pytest.mark.parametrize("pairs", ["one primal", "one tangent", "primal and tangent", "skip none"])
def test_stacked_T_times(rng, rtol, pairs):
    k, L = 2, 4
    x, dx = randn(rng, L, 3), randn(rng, k, L, 3)
    gy, dgy = randn(rng, L, 5), randn(rng, k, L, 5)
    left, right = {
        "one primal": ([x], [dgy]),
        "one tangent": ([dx], [gy]),
        "primal and tangent": ([x, dx], [dgy, gy]),
        "skip none": ([x, None], [dgy, gy]),
    }[pairs]
    expected = sum(
        torch.einsum(
            "kla,klb->kab",
            lf if lf.dim() == 3 else lf.expand(k, L, -1),
            r if r.dim() == 3 else r.expand(k, L, -1),
        )
        for lf, r in zip(left, right)
        if lf is not None and r is not None
    )
    out = torch.empty(k, 3, 5)
    assert bt.stacked_T_times(left, right, k, out) is out
    assert_close(out, expected, rtol, f"Σ_i left_iᵀ right_i ({pairs})")


def _columns_last(rng, k: int, n: int, m: int) -> torch.Tensor:
    """Tangents ``(k, n, m)`` that are views of a C-contiguous ``(n·m, k)`` block (columns last)."""
    block = randn(rng, n * m, k)
    B = block.T.reshape(k, n, m)
    assert B.data_ptr() == block.data_ptr() and bt.columns_last(B)
    return B


def test_columns_last_products_match_the_loop(rng, rtol):
    """Tangents with the columns last: ``a Ẇ_j`` as one GEMM over ``[Ẇ_1 … Ẇ_k]`` and ``a Ẇ_jᵀ`` as one
    batched GEMM, read in place, into a column block of ``out``; the same as column by column."""
    k, L, n, m = 3, 4, 5, 2
    B = _columns_last(rng, k, n, m)
    assert not bt.columns_last(B.contiguous()) and not bt.columns_last(B[:1])
    out, a = randn(rng, k, L, 6), randn(rng, L, n)
    expected = out.clone()
    expected[..., 2:4] += torch.einsum("ln,knm->klm", a, B)
    bt.add_primal_times_(out[..., 2:4], a, B)
    assert_close(out, expected, rtol, "out_j += a Ẇ_j, columns last")
    wide = randn(rng, L, 4)
    outT = randn(rng, k, L, n)
    expected = outT + torch.einsum("lm,knm->kln", wide[:, 1:3], B)
    assert_close(
        bt.add_primal_times_T_(outT, wide[:, 1:3], B), expected, rtol, "out_j += a Ẇ_jᵀ, columns last"
    )


@pytest.mark.parametrize("rows", [1, 16, bt.K_BLOCK_ROWS, bt.K_BLOCK_ROWS + 1])
@pytest.mark.parametrize("n", [bt.K_BLOCK - 1, bt.K_BLOCK + 1, 3 * bt.K_BLOCK + 5])
def test_rows_times_is_one_product_into_a_column_block(rows, n):
    """``a W`` in blocks of the weight's rows (few activation rows) or one GEMM: the same product, to
    round-off, written into a column block of a wider tensor and nowhere else."""
    g = torch.Generator().manual_seed(rows + n)
    a = torch.randn(rows, n, generator=g, dtype=torch.float64)
    W = torch.randn(n, 7, generator=g, dtype=torch.float64)
    wide = torch.full((rows, 12), 5.0, dtype=torch.float64)
    got = bt.rows_times(a, W, wide[:, 3:10])
    assert got.data_ptr() == wide[:, 3:10].data_ptr()
    assert torch.allclose(wide[:, 3:10], a @ W, rtol=1e-14, atol=1e-13)
    assert (wide[:, :3] == 5).all() and (wide[:, 10:] == 5).all()
