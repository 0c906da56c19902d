"""``hessviz.matfree.sketch``: the Gram-matrix (SVQB) basis of a sketch and Hutch++ from one batched
product call, against Householder QR and the projected Hutch++ estimator written out densely."""

from __future__ import annotations

import torch

from hessviz.matfree.probes import rademacher
from hessviz.matfree.sketch import hutchpp, orthonormal_rows


def test_orthonormal_rows_of_ill_conditioned_rank_deficient_and_zero_sketches():
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(6, 500, generator=gen, dtype=torch.float64)
    Y = torch.diag(torch.logspace(0, -7, 6, dtype=torch.float64)) @ A  # κ(Y Yᵀ) ≈ 1e14: two passes
    Q = orthonormal_rows(Y)
    assert Q.shape == (6, 500)
    torch.testing.assert_close(Q @ Q.T, torch.eye(6, dtype=torch.float64), rtol=0, atol=1e-13)
    assert float((Y - (Y @ Q.T) @ Q).abs().max()) <= 1e-13 * float(Y.abs().max())  # rows(Y) ⊆ span(Q)
    low = torch.randn(6, 2, generator=gen, dtype=torch.float64) @ A[:2]  # rank 2
    out = torch.full((6, 500), float("nan"), dtype=torch.float64)
    Q2 = orthonormal_rows(low, out=out)
    assert Q2.shape == (2, 500) and Q2.data_ptr() == out.data_ptr()
    assert float((low - (low @ Q2.T) @ Q2).abs().max()) <= 1e-13 * float(low.abs().max())
    assert orthonormal_rows(torch.zeros(3, 50, dtype=torch.float64)).shape == (0, 50)


def test_hutchpp_equals_the_projected_estimator_with_householder_qr():
    """The same draws (``S`` then ``G`` from the generator) through the textbook Hutch++ (Householder
    QR, probes projected by ``I − QQᵀ``) give the same estimate to round-off; a rank-2 ``H`` is exact."""
    gen = torch.Generator().manual_seed(1)
    n = 300
    B = torch.randn(n, n, generator=gen, dtype=torch.float64)
    H = B @ torch.diag(torch.logspace(2, -3, n, dtype=torch.float64)) @ B.T / n
    calls = []

    def ops(V):
        calls.append(V.shape[0])
        return V @ H

    like = H[:0]
    got, stderr = hutchpp(ops, n, 30, torch.Generator().manual_seed(5), like)
    assert calls == [10, 20] and stderr > 0
    g = torch.Generator().manual_seed(5)
    S, G = rademacher(n, 10, g, like), rademacher(n, 10, g, like)
    Q, _ = torch.linalg.qr((S @ H).T)
    G = G - (G @ Q) @ Q.T
    ref = float(torch.trace(Q.T @ H @ Q) + ((G @ H) * G).sum(1).mean())
    assert abs(got - ref) <= 1e-12 * abs(ref)
    u = torch.randn(2, n, generator=gen, dtype=torch.float64)
    low = u.T @ torch.diag(torch.tensor([3.0, -1.0], dtype=torch.float64)) @ u
    exact, spread = hutchpp(lambda V: V @ low, n, 30, torch.Generator().manual_seed(0), like)
    assert abs(exact - float(torch.trace(low))) <= 1e-12 * float(torch.trace(low).abs())
    assert spread <= 1e-12 * float(torch.trace(low).abs())
