"""LayerNorm and RMSNorm (:mod:`hessviz.ops.layernorm`): both faces, every affine variant, with and
without ε, against ``F.layer_norm`` (and RMSNorm written out) by autograd, reverse over reverse."""

import pytest
import torch

from hessviz.errors import InputError
from hessviz.ops import layernorm
from hessviz.ops.layernorm import LayerNorm, RMSNorm
from tests.helpers import assert_close
from tests.ops.autograd import check_node, check_stage, hessian, jacobians, per_token, randn

CASES = [  # (norm, eps, affine, (L, d), input scale)
    ("layernorm", 0.0, "gamma, beta", (4, 5), 3.0),
    ("layernorm", 1e-2, "gamma", (3, 4), 1.0),
    ("layernorm", 1e-5, "none", (2, 6), 0.1),
    ("rmsnorm", 0.0, "gamma", (4, 5), 3.0),
    ("rmsnorm", 1e-2, "none", (1, 3), 1.0),
]
IDS = [f"{c[0]}-eps{c[1]:g}-{c[2].replace(', ', '+')}-L{c[3][0]}d{c[3][1]}" for c in CASES]


def reference(norm, eps, d):
    """``f(z, *affine)`` in stock torch."""

    def f(z, gamma=None, beta=None):
        if norm == "layernorm":
            return torch.nn.functional.layer_norm(z, (d,), gamma, beta, eps)
        y = z / torch.sqrt((z * z).mean(-1, keepdim=True) + eps)
        return y if gamma is None else gamma * y

    return f


def draw(rng, case):
    norm, eps, affine, (L, d), scale = case
    z = randn(rng, L, d, scale=scale)
    params = {name: 1.0 + randn(rng, d, scale=0.5) for name in ("gamma", "beta") if name in affine}
    return z, params, reference(norm, eps, d), norm == "layernorm"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_rows(rng, rtol, case):
    """The functions on rows: value, Jacobian, ``J M``, VJP and ``Q(g)``."""
    z, _, f, centre = draw(rng, case)
    L, d = z.shape
    y, st = layernorm.value(z, case[1], centre=centre)
    assert_close(y, f(z), rtol, "value")
    J = per_token(jacobians(f, [z])[0])
    assert_close(layernorm.jacobian(st), J, rtol, "J")
    M, g = randn(rng, L, d, 3), randn(rng, L, d)
    assert_close(layernorm.apply_jacobian(st, M), J @ M, rtol, "J M")
    assert_close(layernorm.vjp(st, g), (J.transpose(-1, -2) @ g[..., None])[..., 0], rtol, "Jᵀg")
    Q = per_token(hessian(f, [z], g)[0][0])
    assert_close(layernorm.contract_hessian(st, g), Q, rtol, "Q(g)")
    tmap = layernorm.token_map(st)
    assert_close(tmap.contract(g), Q, rtol, "token map Q(g)")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_stage(rng, rtol, case):
    z, params, f, centre = draw(rng, case)
    _, st = layernorm.value(z, case[1], centre=centre)
    stage = layernorm.stage(st, "ln", params.get("gamma"), params.get("beta"))
    refs = {("ln", k, None): v for k, v in params.items()}
    check_stage(stage, f, z, refs, rng, rtol, what=case[0])


NODE_CASES = [
    pytest.param(c, m, id=f"{i}-{m}")
    for c, i in zip(CASES, IDS)
    for m in ("x", "p", "xp")
    if c[2] != "none" or m == "x"
]
"""Along the input, the parameters, or both (a norm without parameters: the input only)."""


@pytest.mark.parametrize("case, moving", NODE_CASES)
def test_node(rng, rtol, case, moving):
    z, params, f, centre = draw(rng, case)
    gamma = ("gamma", params["gamma"]) if "gamma" in params else None
    beta = ("beta", params["beta"]) if "beta" in params else None
    node = (
        LayerNorm("y", "z", z, case[1], gamma, beta, "test", centre=True)
        if centre
        else RMSNorm("y", "z", z, case[1], gamma, "test")
    )
    check_node(node, f, [z], list(params.values()), rng, rtol, moving=moving, what=case[0])


@pytest.mark.parametrize(
    "centre, rows, message",
    [(True, [1.0, 1.0, 1.0], "zero variance"), (False, [0.0, 0.0, 0.0], "only zeros")],
)
def test_refuses_a_flat_row_without_eps(centre, rows, message):
    z = torch.tensor([[1.0, 2.0, 4.0], rows])
    with pytest.raises(InputError, match=rf"ln_eps = 0 but the test input has {message} in row\(s\) \[1\]"):
        layernorm.value(z, 0.0, where="test input", centre=centre)
    y, _ = layernorm.value(z, 1e-5, centre=centre)  # with ε it is defined (and zero)
    assert torch.equal(y[1], torch.zeros(3))
