"""Final-logit soft-capping inside the next-token objective (Gemma 2's ``final_logit_softcapping``,
``MODEL.md`` part 5): ``logits = c·tanh(s/c)``, its value, gradient, products and token-wise curvature
against autograd (reverse over reverse) in float64, in chunks of any size, with logits far beyond the cap
(tanh saturated) and without a final norm; and a bad cap refused by name."""

from __future__ import annotations

import pytest
import torch

from hessviz.errors import InputError
from hessviz.losses import LMHead, NextToken

L, D, V = 6, 5, 11


def _setup(cap: float, scale: float, norm: bool):
    g = torch.Generator().manual_seed(3)
    Z = torch.randn(L, D, generator=g, dtype=torch.float64)
    E = scale * torch.randn(V, D, generator=g, dtype=torch.float64)
    gamma = 1 + 0.1 * torch.randn(D, generator=g, dtype=torch.float64) if norm else None
    ids = torch.randint(0, V, (L,), generator=g)
    return Z, ids, LMHead(gamma, None, 1e-6, E, "rmsnorm", softcap=cap)


def _reference(Z: torch.Tensor, ids: torch.Tensor, head: LMHead) -> torch.Tensor:
    h = Z if head.gamma is None else Z * torch.rsqrt(Z.pow(2).mean(-1, keepdim=True) + head.eps) * head.gamma
    s = h[:-1] @ head.embedding.T
    s = head.softcap * torch.tanh(s / head.softcap)
    return torch.nn.functional.cross_entropy(s, ids[1:])


@pytest.mark.parametrize("cap, scale, norm", [(1.5, 1.0, True), (0.7, 30.0, True), (2.0, 3.0, False)])
@pytest.mark.parametrize("chunk", [1, 4, None])
def test_value_gradient_products_and_blocks_match_autograd(cap, scale, norm, chunk):
    Z, ids, head = _setup(cap, scale, norm)
    loss = NextToken(Z, ids, head, chunk=chunk)
    Zr = Z.clone().requires_grad_(True)
    value = _reference(Zr, ids, head)
    (grad,) = torch.autograd.grad(value, Zr, create_graph=True)
    assert abs(float(loss.value - value.detach())) <= 1e-14 * float(value.detach())
    assert torch.allclose(loss.grad, grad, rtol=0, atol=1e-14 * float(grad.abs().max()))
    dZ = torch.randn(3, L, D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    expected = torch.stack([torch.autograd.grad(grad, Zr, d, retain_graph=True)[0] for d in dZ])
    got = loss.product(dZ)
    assert float((got - expected).norm() / expected.norm()) <= 1e-12
    blocks = loss.token_curvature()
    assert float((torch.einsum("tij,ktj->kti", blocks, dZ) - expected).norm() / expected.norm()) <= 1e-12


def test_without_a_cap_nothing_changes():
    Z, ids, head = _setup(1.0, 1.0, True)
    plain = LMHead(head.gamma, None, head.eps, head.embedding, "rmsnorm")
    loss = NextToken(Z, ids, plain)
    Zr = Z.clone().requires_grad_(True)
    h = Zr * torch.rsqrt(Zr.pow(2).mean(-1, keepdim=True) + head.eps) * head.gamma
    value = torch.nn.functional.cross_entropy(h[:-1] @ head.embedding.T, ids[1:])
    assert abs(float(loss.value - value.detach())) <= 1e-14 * float(value.detach())


@pytest.mark.parametrize("cap", [0.0, -1.0, float("inf"), float("nan"), True, "30"])
def test_a_bad_cap_is_refused(cap):
    Z, ids, head = _setup(1.0, 1.0, True)
    bad = LMHead(head.gamma, None, head.eps, head.embedding, "rmsnorm", softcap=cap)
    with pytest.raises(InputError, match="head.softcap"):
        NextToken(Z, ids, bad)
