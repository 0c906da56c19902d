r"""The four placements as short forward recipes over the components.

Each recipe returns a :class:`BlockTrace`: the attention (with its parameters and, in a
Pre-LN block with an affine ``ln1``, the parameters of its input), the token-wise rest of
the block from ``SA`` to ``Z`` as one :class:`~hessviz.chain.Stage` with its parameters,
and ``Z``. Every placement has the same shape

.. math::
    SA = \text{attention}(X_a), \qquad Z = T(SA),

where ``T`` is token-wise (a composition of LayerNorms, the residual FFN branch, and the
residual sums with the constant ``X``):

======== ================ ======================================
norm     ``X_a``          ``T``
======== ================ ======================================
post     X                ``ln2 ∘ (id + FFN) ∘ ln1`` (``ln1`` on ``X + SA``)
pre      ``ln1(X)``       ``id + FFN ∘ ln2`` (on ``Z_1 = X + SA``)
none     X                ``id + FFN``
======== ================ ======================================

``attention`` is ``Z = SA(X)`` alone (``T`` is the identity). Components receive their
weights by local name through :data:`hessviz.weights.WEIGHT_MAP`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from torch import Tensor

from hessviz.chain import Stage, compose_stages, residual_stage
from hessviz.config import BlockConfig
from hessviz.ops import activations, layernorm
from hessviz.ops.attention import MultiHeadAttention
from hessviz.ops.ffn import FeedForward
from hessviz.weights import component_weights


@dataclass(frozen=True)
class BlockTrace:
    """One forward pass: the attention, the token-wise map ``T: SA → Z`` (``None`` for the
    identity), and ``Z (L, d)``.

    The stage's per-token Jacobians cost ``O(L d³)`` to compose, so it is built from
    ``build_stage`` when first asked for: a forward pass (``hv.forward``) never builds it.
    """

    attention: MultiHeadAttention
    build_stage: Callable[[], Stage | None]
    Z: Tensor

    @cached_property
    def stage(self) -> Stage | None:
        return self.build_stage()


def _layernorm(cfg: BlockConfig, params: dict[str, Tensor], which: str, z: Tensor,
               where: str) -> tuple[Tensor, Callable[[], Stage]]:
    """``which(z)`` and a builder of its stage: ``γ ⊙ n + β`` when affine, ``n`` otherwise."""
    n, st = layernorm.value(z, cfg.ln_eps, where=where)
    w = component_weights(cfg, params, which)
    gamma, beta = w.get("gamma"), w.get("beta")
    out = n if gamma is None else n * gamma + beta
    return out, lambda: layernorm.stage(st, which, gamma, beta)


def attention(cfg: BlockConfig, params: dict[str, Tensor], Xa: Tensor,
              input_stage: Stage | None = None) -> MultiHeadAttention:
    """The block's attention on the input ``Xa (L, d)``; ``.output`` is ``SA(Xa)``."""
    return MultiHeadAttention(Xa, component_weights(cfg, params, "attention"), cfg.n_heads,
                              causal=cfg.causal, input_stage=input_stage)


def trace(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> BlockTrace:
    """Run the block of ``cfg`` on ``X (L, d)``; raises on a zero-variance LayerNorm row."""
    act = activations.get(cfg.activation)

    def attention_on(Xa: Tensor, input_stage: Stage | None = None) -> MultiHeadAttention:
        return attention(cfg, params, Xa, input_stage)

    def ffn_on(Y: Tensor) -> FeedForward:
        w = component_weights(cfg, params, "ffn")
        return FeedForward(Y, w["fc1.weight"], w["fc2.weight"], act, w.get("fc1.bias"), w.get("fc2.bias"))

    if cfg.norm == "attention":
        sa = attention_on(X)
        return BlockTrace(sa, lambda: None, sa.output)

    if cfg.norm == "post":        # Z1 = ln1(X + SA(X)),  Z = ln2(Z1 + FFN(Z1))
        sa = attention_on(X)
        Z1, ln1 = _layernorm(cfg, params, "ln1", X + sa.output, "first LayerNorm input X + SA(X)")
        ffn = ffn_on(Z1)
        Z, ln2 = _layernorm(cfg, params, "ln2", Z1 + ffn.output, "second LayerNorm input Z1 + FFN(Z1)")
        return BlockTrace(sa, lambda: compose_stages(compose_stages(ln1(), residual_stage(ffn.stage())),
                                                     ln2()), Z)

    if cfg.norm == "pre":         # Z1 = X + SA(ln1(X)),  Z = Z1 + FFN(ln2(Z1))
        Xa, ln1 = _layernorm(cfg, params, "ln1", X, "input X")
        sa = attention_on(Xa, ln1() if cfg.ln_affine else None)   # γ, β of ln1 move attention's input
        Z1 = X + sa.output
        Y, ln2 = _layernorm(cfg, params, "ln2", Z1, "second LayerNorm input Z1 = X + SA(ln1(X))")
        ffn = ffn_on(Y)
        return BlockTrace(sa, lambda: residual_stage(compose_stages(ln2(), ffn.stage())), Z1 + ffn.output)

    sa = attention_on(X)          # none: Z1 = X + SA(X),  Z = Z1 + FFN(Z1)
    Z1 = X + sa.output
    ffn = ffn_on(Z1)
    return BlockTrace(sa, lambda: residual_stage(ffn.stage()), Z1 + ffn.output)
