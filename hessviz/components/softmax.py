r"""Row softmax ``a = softmax(s)`` over the last dimension.

.. math::
    J = \operatorname{diag}(a) - a a^\top, \qquad
    Q(g) = \operatorname{diag}(w) - w a^\top - a w^\top,\quad w = a \odot (g - a^\top g).

``w = J^\top g`` is also the vector-Jacobian product.
"""

from __future__ import annotations

import torch
from torch import Tensor


def value(s: Tensor) -> Tensor:
    """``(..., n) -> (..., n)``."""
    return torch.softmax(s, dim=-1)


def jacobian(a: Tensor) -> Tensor:
    """``(..., n) -> (..., n, n)``: ``diag(a) - a aᵀ`` from the softmax output ``a``."""
    return torch.diag_embed(a) - a.unsqueeze(-1) * a.unsqueeze(-2)


def apply_jacobian(a: Tensor, M: Tensor) -> Tensor:
    """``J M`` for ``a (..., n)`` and ``M (..., n, k)`` -> ``(..., n, k)`` without forming ``J``."""
    return a.unsqueeze(-1) * (M - (a.unsqueeze(-2) @ M))


def vjp(a: Tensor, g: Tensor) -> Tensor:
    """``Jᵀ g = a ⊙ (g - aᵀg)``: ``(..., n), (..., n) -> (..., n)``."""
    return a * (g - (a * g).sum(-1, keepdim=True))


def contract_hessian(a: Tensor, g: Tensor) -> Tensor:
    """``Σ_i g_i ∇² a_i``: ``(..., n), (..., n) -> (..., n, n)``."""
    w = vjp(a, g)
    outer = w.unsqueeze(-1) * a.unsqueeze(-2)
    return torch.diag_embed(w) - outer - outer.transpose(-1, -2)
