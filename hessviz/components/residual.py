"""The residual sum ``y = x + b(x)`` around a token-wise branch ``b``.

Its Jacobian is ``I + ∂b/∂x``; the identity path is linear, so the second derivative
is the branch's own: ``Q_y(g) = Q_b(g)``.
"""

from __future__ import annotations

import torch

from hessviz.components.base import TokenMap


def residual(branch: TokenMap) -> TokenMap:
    """``x ↦ x + b(x)`` from the branch's derivatives."""
    n = branch.jac.shape[-1]
    eye = torch.eye(n, dtype=branch.jac.dtype, device=branch.jac.device)
    return TokenMap(branch.jac + eye, branch.contract)
