"""Row softmax (:mod:`hessviz.ops.softmax`), dense face: value, Jacobian, VJP, contracted second
derivative, and its factored form's sandwich. (Its node rules live in the attention core,
:mod:`tests.ops.test_attention`.)"""

import pytest
import torch

from hessviz.ops import softmax
from tests.helpers import assert_close
from tests.ops.autograd import hessian, jacobians, per_token, randn

SHAPES = [(7,), (3, 5), (2, 3, 4)]


def row_blocks(J, batch):
    """The per-row blocks ``(batch, n, n)`` of a full derivative over ``batch`` rows of ``n``."""
    n = J.shape[-1]
    return per_token(J.reshape(batch, n, batch, n))


@pytest.mark.parametrize("shape", SHAPES)
def test_dense_face(rng, rtol, shape):
    s, g = randn(rng, *shape, scale=2.0), randn(rng, *shape)
    a = softmax.value(s)
    assert_close(a, torch.softmax(s, -1), rtol, "value")
    n, batch = shape[-1], s.numel() // shape[-1]
    f = lambda t: torch.softmax(t, -1)  # noqa: E731
    J = row_blocks(jacobians(f, [s])[0], batch).reshape(*shape, n)
    assert_close(softmax.jacobian(a), J, rtol, "J")
    assert_close(softmax.vjp(a, g), (J.transpose(-1, -2) @ g[..., None])[..., 0], rtol, "Jᵀg")
    vj, centred = softmax.vjp_centered(a, g)
    assert_close(vj, softmax.vjp(a, g), rtol, "vjp_centered")
    assert_close(centred, g - (a * g).sum(-1, keepdim=True), rtol, "g − aᵀg")
    M = randn(rng, *shape, 3)
    assert_close(softmax.apply_jacobian(a, M), J @ M, rtol, "J M")
    Q = row_blocks(hessian(f, [s], g)[0][0], batch).reshape(*shape, n)
    assert_close(softmax.contract_hessian(a, g), Q, rtol, "Q(g)")
    factored = softmax.contract_hessian_factored(a, g)
    Ma, Mb = randn(rng, *shape, 2), randn(rng, *shape, 4)
    assert_close(factored.sandwich(Ma, Mb), Ma.transpose(-1, -2) @ Q @ Mb, rtol, "Maᵀ Q(g) Mb")


def test_causal_mask(rng, rtol):
    s = randn(rng, 4, 4)
    a = softmax.value(s, causal=True)
    assert torch.count_nonzero(a.triu(1)) == 0
    assert_close(
        a,
        torch.softmax(s.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), -torch.inf), -1),
        rtol,
        "causal softmax",
    )


@pytest.mark.parametrize("window", [1, 2, 3, 9])
def test_sliding_window_mask(rng, rtol, window):
    """With a window row ``t`` sees ``t − window < s ≤ t``; a window as long as the text is the causal
    mask; a window needs the causal mask."""
    L = 6
    s = randn(rng, L, L)
    a = softmax.value(s, causal=True, window=window)
    t, r = torch.arange(L)[:, None], torch.arange(L)[None, :]
    seen = (r <= t) & (r > t - window)
    assert torch.equal(a != 0, seen)
    assert_close(a, torch.softmax(s.masked_fill(~seen, -torch.inf), -1), rtol, f"window {window}")
    if window >= L:
        assert softmax.mask(L, True, window).equal(softmax.mask(L, True))
    with pytest.raises(ValueError, match="causal"):
        softmax.value(s, causal=False, window=window)
