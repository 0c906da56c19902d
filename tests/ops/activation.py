"""The check shared by the activation files: ``φ``, ``φ'``, ``φ''`` against stock torch by autograd."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from hessviz.ops.elementwise import Elementwise
from tests.helpers import assert_close


def check_derivatives(
    act: type[Elementwise], stock: Callable[[Tensor], Tensor], u: Tensor, rtol: float
) -> None:
    """``f``, ``df``, ``d2f`` of ``act`` against ``stock`` and its first two derivatives (reverse over
    reverse, elementwise); a ``hessian_is_zero`` activation must have ``d2f`` zero."""
    x = u.detach().clone().requires_grad_(True)
    y = stock(x)
    (d1,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    d2 = torch.autograd.grad(d1.sum(), x, allow_unused=True)[0] if d1.requires_grad else None
    assert_close(act.f(u), y.detach(), rtol, f"{act.name} value")
    assert_close(act.df(u), d1.detach(), rtol, f"{act.name}'")
    assert_close(act.d2f(u), torch.zeros_like(u) if d2 is None else d2, rtol, f"{act.name}''", atol=1e-15)
    if act.hessian_is_zero:
        assert torch.count_nonzero(act.d2f(u)) == 0
