r"""The four placements as short forward recipes over the components.

Each recipe returns a :class:`BlockTrace`: the output ``Z`` and what the chain rule
needs. Every placement has the same shape

.. math::
    SA = \text{attention}(X_a), \quad Z_1 = T_1(X + SA), \quad
    R = Z_1 + \text{FFN}(\text{pre}(Z_1)), \quad Z = \text{post}(R),

where the attention input ``X_a`` never depends on the weights, and ``T_1``, ``pre`` and
``post`` are each a LayerNorm or the identity:

======== ========== ======= ======= ========
norm     ``X_a``    ``T_1`` pre     post
======== ========== ======= ======= ========
post     X          LN      id      LN
pre      LN(X)      id      LN      id
none     X          id      id      id
======== ========== ======= ======= ========

``attention`` is ``Z = SA(X)`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from torch import Tensor

from hessviz.chain import compose
from hessviz.components import activation, layernorm
from hessviz.components.attention import SelfAttention
from hessviz.components.base import TokenMap, identity
from hessviz.components.ffn import FeedForward
from hessviz.components.residual import residual
from hessviz.config import BlockConfig


@dataclass(frozen=True)
class BlockTrace:
    """One forward pass with its token-wise maps.

    ``sa_to_z1``: ``SA → Z_1``; ``pre``: ``Z_1 → Y`` (the FFN input); ``post``: ``R → Z``.
    For ``attention`` there is no FFN and every map is the identity.
    """

    attention: SelfAttention
    ffn: FeedForward | None
    Z: Tensor
    sa_to_z1: TokenMap
    pre: TokenMap
    post: TokenMap

    @cached_property
    def sa_to_r(self) -> TokenMap:
        """``SA → R = Z_1 + f(pre(Z_1))``: the residual around the FFN branch."""
        if self.ffn is None:
            return self.sa_to_z1
        branch = compose(self.pre, self.ffn.input_map)
        return compose(self.sa_to_z1, residual(branch))

    @cached_property
    def sa_to_y(self) -> Tensor:
        """``∂Y/∂SA``, ``(L, d, d)``, Y the FFN input."""
        return self.pre.jac @ self.sa_to_z1.jac

    @cached_property
    def sa_to_z(self) -> Tensor:
        """``∂Z/∂SA``, ``(L, d, d)``."""
        return self.post.jac @ self.sa_to_r.jac


def trace(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> BlockTrace:
    """Run the block of ``cfg`` on ``X (L, d)``; raises on a zero-variance LayerNorm row."""
    eps = cfg.ln_eps
    act = activation.get(cfg.activation)
    L, d = X.shape
    same = identity(L, d, X)

    def attention_on(Xa: Tensor) -> SelfAttention:
        return SelfAttention(Xa, params["W_Q"], params["W_K"], params["W_V"])

    def ffn_on(Y: Tensor) -> FeedForward:
        return FeedForward(Y, params["W_1"], params["W_2"], act)

    if cfg.norm == "attention":
        sa = attention_on(X)
        return BlockTrace(sa, None, sa.output, same, same, same)

    if cfg.norm == "post":        # Z1 = LN(X + SA(X)),  Z = LN(Z1 + FFN(Z1))
        sa = attention_on(X)
        Z1, ln1 = layernorm.value(X + sa.output, eps, where="first LayerNorm input X + SA(X)")
        ffn = ffn_on(Z1)
        Z, ln2 = layernorm.value(Z1 + ffn.output, eps, where="second LayerNorm input Z1 + FFN(Z1)")
        return BlockTrace(sa, ffn, Z, layernorm.token_map(ln1), same, layernorm.token_map(ln2))

    if cfg.norm == "pre":         # Z1 = X + SA(LN(X)),  Z = Z1 + FFN(LN(Z1))
        Xa, _ = layernorm.value(X, eps, where="input X")
        sa = attention_on(Xa)
        Z1 = X + sa.output
        Y, ln2 = layernorm.value(Z1, eps, where="second LayerNorm input Z1 = X + SA(LN(X))")
        ffn = ffn_on(Y)
        return BlockTrace(sa, ffn, Z1 + ffn.output, same, layernorm.token_map(ln2), same)

    sa = attention_on(X)          # none: Z1 = X + SA(X),  Z = Z1 + FFN(Z1)
    Z1 = X + sa.output
    ffn = ffn_on(Z1)
    return BlockTrace(sa, ffn, Z1 + ffn.output, same, same, same)
