"""The loss objects of :mod:`hessviz.losses` against autograd: value, gradient, token curvature and
its product, for ``MSE``, ``CrossEntropy``, ``CustomLoss``, ``NextToken`` and ``Classifier``; the one
string-to-object map; and the runnable example of ``docs/losses.md``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hessviz as hv
from hessviz.errors import ConfigError, InputError
from hessviz.losses import LMHead, Loss, block_loss
from hessviz.losses.next_token import PRODUCT_COLUMNS

L, D, V, C = 5, 4, 9, 3
F64 = torch.float64
TOL = 1e-11


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    err = float((a - b).abs().max())
    assert err <= TOL * max(1.0, float(b.abs().max())), f"{what}: max error {err:.3g}"


def check_against_autograd(loss: Loss, f, Z: torch.Tensor) -> None:
    """``loss`` (at ``Z``) against ``f``, the same loss in torch ops: value, ``∇_Z``, the product with
    three random directions, ``N`` dense, and (token-wise) its blocks and its zeros off them. ``N`` by
    reverse over reverse."""
    n = Z.numel()
    _close(loss.value, f(Z), "value")
    _close(loss.grad, torch.func.grad(f)(Z), "gradient")
    H = torch.func.jacrev(torch.func.grad(f))(Z).reshape(n, n)
    dZ = torch.randn(3, *Z.shape, generator=_gen(9), dtype=F64)
    _close(loss.product(dZ).reshape(3, n), dZ.reshape(3, n) @ H, "product")
    _close(loss.dense_hessian(), H, "dense curvature")
    if loss.token_wise:
        H4 = H.reshape(*Z.shape, *Z.shape)
        blocks = torch.stack([H4[t, :, t, :] for t in range(Z.shape[0])])
        _close(loss.token_curvature(), blocks, "token curvature")
        _close(torch.block_diag(*blocks), H, "no coupling between tokens")


def point(seed: int = 0) -> torch.Tensor:
    return torch.randn(L, D, generator=_gen(seed), dtype=F64)


def test_mse_and_cross_entropy_match_autograd():
    Z = point()
    Y = torch.randn(L, D, generator=_gen(1), dtype=F64)
    check_against_autograd(hv.MSE(Y).at(Z), lambda z: ((z - Y) ** 2).mean(), Z)
    y = torch.randint(0, D, (L,), generator=_gen(2))
    check_against_autograd(hv.CrossEntropy(y).at(Z), lambda z: F.cross_entropy(z, y), Z)


def test_custom_loss_is_its_gradient_and_curvature():
    """Dense, token-wise and callable forms: the product is ``N Ż`` and the reference's second-order
    model has gradient ``g`` and Hessian ``N`` at the point."""
    Z, g = point(), point(3)
    A = torch.randn(L * D, L * D, generator=_gen(4), dtype=F64)
    N = A @ A.T
    blocks = torch.stack([N[t * D : (t + 1) * D, t * D : (t + 1) * D] for t in range(L)])
    for hess in (N, blocks, lambda dZ: (dZ.reshape(dZ.shape[0], -1) @ N).reshape(dZ.shape)):
        loss = hv.CustomLoss(g, hess).at(Z)
        dense = N if not isinstance(hess, torch.Tensor) or hess.ndim == 2 else torch.block_diag(*blocks)
        assert loss.token_wise == (isinstance(hess, torch.Tensor) and hess.ndim == 3)
        dZ = torch.randn(2, L, D, generator=_gen(5), dtype=F64)
        _close(loss.product(dZ).reshape(2, -1), dZ.reshape(2, -1) @ dense, "product")
        _close(torch.func.grad(loss.reference_value)(Z), g, "model gradient")
        H = torch.func.hessian(loss.reference_value)(Z).reshape(L * D, L * D)
        _close(H, dense, "model curvature")
    with pytest.raises(InputError, match="no value"):
        _ = hv.CustomLoss(g, N).value
    with pytest.raises(ValueError, match="couples tokens"):
        hv.CustomLoss(g, N).token_curvature()


def _head(norm_type: str | None, vocab: int = V) -> LMHead:
    gen = _gen(6)
    gamma = 1 + 0.3 * torch.randn(D, generator=gen, dtype=F64)
    beta = 0.2 * torch.randn(D, generator=gen, dtype=F64)
    E = torch.randn(vocab, D, generator=gen, dtype=F64)
    if norm_type is None:
        return LMHead(None, None, 0.0, E)
    return LMHead(gamma, beta if norm_type == "layernorm" else None, 1e-5, E, norm_type)


def _final_norm(head: LMHead, z: torch.Tensor) -> torch.Tensor:
    """The head's final norm in plain torch ops (not ``F.layer_norm``: its weighted Hessian is wrong
    in torch 2.13)."""
    if head.gamma is None:
        return z
    c = z - z.mean(-1, keepdim=True) if head.norm_type == "layernorm" else z
    h = head.gamma * c / torch.sqrt((c * c).mean(-1, keepdim=True) + head.eps)
    return h if head.beta is None else h + head.beta


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm", None])
def test_next_token_and_last_token_match_autograd(norm_type):
    Z, head = point(7), _head(norm_type)
    ids = torch.randint(0, V, (L,), generator=_gen(8))

    def next_token(z):
        return F.cross_entropy(_final_norm(head, z[:-1]) @ head.embedding.T, ids[1:])

    check_against_autograd(hv.NextToken(Z, ids, head, chunk=2), next_token, Z)
    last = hv.NextToken(Z, head=head, target=4)

    def last_token(z):
        return F.cross_entropy(_final_norm(head, z[-1:]) @ head.embedding.T, torch.tensor([4]))

    check_against_autograd(last, last_token, Z)
    assert last.token_curvature()[:-1].abs().max() == 0 and last.grad[:-1].abs().max() == 0
    moved = hv.NextToken(Z, ids, head).at(point(9))
    _close(moved.value, next_token(point(9)), "the same loss at another point")


@pytest.mark.parametrize("pooling", ["cls", "mean", "last"])
def test_classifier_at_one_sequence_matches_autograd(pooling):
    Z, norm = point(10), _head("layernorm", vocab=0)
    gen = _gen(11)
    W = torch.randn(D, C, generator=gen, dtype=F64)
    b = 0.1 * torch.randn(C, generator=gen, dtype=F64)
    head = hv.Classifier(W, b, [2, 1], pooling)
    w = {
        "cls": torch.eye(L, dtype=F64)[0],
        "last": torch.eye(L, dtype=F64)[-1],
        "mean": torch.full((L,), 1.0 / L, dtype=F64),
    }[pooling]

    def f(z):
        return F.cross_entropy((w @ _final_norm(norm, z) @ W + b)[None], torch.tensor([1]))

    loss = head.at(Z, index=1, norm=norm)
    assert loss.token_wise == (pooling != "mean")
    check_against_autograd(loss, f, Z)
    with pytest.raises(InputError, match="index"):
        head.at(Z, index=2)


def test_strings_become_objects_in_one_place():
    Y = point(12)
    assert isinstance(block_loss("mse", Y), hv.MSE) and isinstance(
        block_loss("ce", Y[:, 0].long()), hv.CrossEntropy
    )
    custom = hv.CustomLoss(Y, torch.eye(L * D, dtype=F64))
    assert block_loss("mse", custom) is custom  # a loss object passes through
    with pytest.raises(ConfigError, match="loss must be one of"):
        block_loss("l1", Y)
    with pytest.raises(InputError, match="no point yet"):
        _ = hv.MSE(Y).value


def test_the_chunk_is_sized_for_one_product_sweep():
    from hessviz.products.operator import BATCH

    assert PRODUCT_COLUMNS == BATCH
