"""Rotary positions (:mod:`hessviz.ops.rotary`): the rotation, its adjoint, the matrices ``P_t``, the
relative ``P_t P_rᵀ`` and the frequency basis, against Hugging Face's ``rotate_half`` form.
The rotation has no node of its own: the attention core applies it (:mod:`tests.ops.test_attention`)."""

import pytest
import torch

from hessviz.ops import rotary
from tests.helpers import assert_close
from tests.ops import rope
from tests.ops.autograd import randn, vjp

CASES = [(5, 4, 4, 10000.0), (4, 6, 4, 100.0), (3, 2, 2, 10.0), (6, 8, 2, 500.0)]
"""``(L, d_k, r, θ)``: full and partial rotary widths."""


@pytest.mark.parametrize("L, dk, r, theta", CASES)
def test_rotation_and_its_adjoint(rng, rtol, L, dk, r, theta):
    like = torch.zeros(1)
    rot = rotary.Rotary(L, dk, r, theta, like)
    u = randn(rng, 2, L, dk)
    assert_close(rot.apply(u), rope.rotate(u, r, theta), rtol, "rot_t(u)")
    v = randn(rng, 2, L, dk)
    (expected,) = vjp(lambda t: rope.rotate(t, r, theta), [u], v)
    assert_close(rot.apply_T(v), expected, rtol, "rot_tᵀ(v)")
    P = rot.matrices
    assert_close(torch.einsum("hld,lde->hle", u, P), rot.apply(u), rtol, "u P_t")
    eye = torch.eye(dk).expand(L, dk, dk)
    assert_close(P @ P.transpose(-1, -2), eye, rtol, "P_t orthogonal", atol=1e-15)
    assert_close(rot.relative, P[:, None] @ P[None].transpose(-1, -2), rtol, "P_t P_rᵀ")
    basis = sum(phi[:, None, None] * B for phi, B in rot.basis)
    assert_close(basis, P, rtol, "Σ_k φ_k(t) B_k")
    assert len(rot.basis) == r + (r < dk)


def test_for_config():
    like = torch.zeros(1)
    assert rotary.for_config(4, 4, 0, 10000.0, like) is None
    assert isinstance(rotary.for_config(4, 4, 2, 10000.0, like), rotary.Rotary)


def test_tables_in_the_dtype_of_like():
    c, s = rotary.tables(3, 4, 2, 10.0, torch.zeros(1, dtype=torch.float32))
    assert c.dtype == s.dtype == torch.float32 and torch.all(c[:, 2:] == 1) and torch.all(s[:, 2:] == 0)
