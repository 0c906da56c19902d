"""The residual sum ``y = x + b(x)`` around a token-wise branch ``b``.

Its Jacobian is ``I + ∂b/∂x``; the identity path is linear, so the second derivative
is the branch's own: ``Q_y(g) = Q_b(g)``.
"""

from __future__ import annotations

from hessviz.components.base import TokenMap, eye


def residual(branch: TokenMap) -> TokenMap:
    """``x ↦ x + b(x)`` from the branch's derivatives."""
    return TokenMap(branch.jac + eye(branch.jac.shape[-1], branch.jac), branch.contract)
