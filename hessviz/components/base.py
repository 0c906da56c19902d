"""A token-wise map and its derivatives, the currency of the chain rule.

A token-wise map sends each token's vector ``x_t (n_in)`` to ``y_t (n_out)`` on its own
(LayerNorm, the feed-forward branch, a residual sum). For the chain rule it is enough
to know, per token,

* ``jac``: the Jacobian ``∂y_t/∂x_t``, a tensor ``(L, n_out, n_in)``;
* ``contract(g)``: the second derivative contracted with an upstream gradient
  ``g (L, n_out)``: ``Σ_i g_{t,i} ∇²_{x_t} y_{t,i}``, a tensor ``(L, n_in, n_in)``,
  or ``None`` for a map that is linear in its input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TokenMap:
    jac: Tensor
    contract: Callable[[Tensor], Tensor] | None = None

    def vjp(self, g: Tensor) -> Tensor:
        """``Jᵀ g``: ``(L, n_out) -> (L, n_in)``."""
        return torch.einsum("toi,to->ti", self.jac, g)


def identity(L: int, n: int, like: Tensor) -> TokenMap:
    """The identity map on ``n``-vectors, for ``L`` tokens."""
    eye = torch.eye(n, dtype=like.dtype, device=like.device)
    return TokenMap(eye.expand(L, n, n))
