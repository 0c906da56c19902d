r"""The dense engine's forward pass: the placement recipe read as ``SA = attention(X_a)``, ``Z = T(SA)``.

:func:`record` runs the recipe of :data:`hessviz.placements.PLACEMENTS` for ``cfg.norm`` and
returns a :class:`BlockRecord`: the attention (with, in a Pre-LN block with an affine ``ln1``,
the parameters of its input), the token-wise rest of the block from ``SA`` to ``Z`` as one
:class:`~hessviz.chain.Stage` with its parameters, and ``Z``. Every placement has this shape

.. math::
    SA = \text{attention}(X_a), \qquad Z = T(SA),

where ``T`` is token-wise: each step after the attention is one more stage of ``T`` (a
LayerNorm, the FFN branch), a residual sum ``X + SA`` with the constant ``X`` leaves it
unchanged, and ``a + b`` with ``b`` a branch of ``a`` is the residual stage ``a ↦ a + b(a)``.
Operations receive their weights by local name through :data:`hessviz.weights.WEIGHT_MAP`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from torch import Tensor

from hessviz.chain import Stage, compose_stages, residual_stage
from hessviz.config import BlockConfig
from hessviz.errors import ConfigError
from hessviz.ops import activations, layernorm
from hessviz.ops.attention import MultiHeadAttention
from hessviz.ops.ffn import FeedForward
from hessviz.ops.gated import GatedFeedForward
from hessviz.placements import PLACEMENTS, Step, where
from hessviz.weights import component_weights


@dataclass(frozen=True)
class BlockRecord:
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
    """``which(z)`` and a builder of its stage: ``γ ⊙ n + β`` when affine, ``n`` otherwise (an RMSNorm
    when ``cfg.norm_type`` says so: no centring, no ``β``)."""
    n, st = layernorm.value(z, cfg.ln_eps, where=where, centre=cfg.norm_type == "layernorm")
    w = component_weights(cfg, params, which)
    gamma, beta = w.get("gamma"), w.get("beta")
    out = n if gamma is None else n * gamma if beta is None else n * gamma + beta
    return out, lambda: layernorm.stage(st, which, gamma, beta)


def attention(cfg: BlockConfig, params: dict[str, Tensor], Xa: Tensor,
              input_stage: Stage | None = None) -> MultiHeadAttention:
    """The block's attention on the input ``Xa (L, d)``; ``.output`` is ``SA(Xa)``."""
    return MultiHeadAttention(Xa, component_weights(cfg, params, "attention"), cfg.n_heads,
                              causal=cfg.causal, input_stage=input_stage)


@dataclass(frozen=True)
class _After:
    """A value after the attention: ``step`` (``None`` for the identity) maps ``base`` to it
    (``base`` ``None``: ``SA`` itself)."""

    value: Tensor
    base: str | None
    step: Callable[[], Stage] | None


def record(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> BlockRecord:
    """Run the block of ``cfg`` on ``X (L, d)``; raises on a zero-variance LayerNorm row."""
    recipe = PLACEMENTS[cfg.norm]
    act = activations.get(cfg.activation)
    before: dict[str, tuple[Tensor, Callable[[], Stage] | None]] = {"X": (X, None)}   # no SA in them
    after: dict[str, _After] = {}
    sa: MultiHeadAttention | None = None

    def path(name: str, start: str | None) -> list[Callable[[], Stage]]:
        """The stages from the value ``start`` (``None``: ``SA``) to ``name``, innermost first."""
        steps: list[Callable[[], Stage]] = []
        while name != start:
            v = after[name]
            if v.step is not None:
                steps.append(v.step)
            name = v.base
            if name is None and start is not None:
                raise ConfigError(f"the dense engine cannot read norm={cfg.norm!r}: a branch does not "
                                  f"start at {start}")
        return steps[::-1]

    def composed(steps: list[Callable[[], Stage]]) -> Callable[[], Stage | None]:
        def build() -> Stage | None:
            out = None
            for make in steps:
                out = make() if out is None else compose_stages(out, make())
            return out
        return build

    def ffn_on(Y: Tensor) -> FeedForward:
        w = component_weights(cfg, params, "ffn")
        args = (Y, w["fc1.weight"], w["fc2.weight"], act, w.get("fc1.bias"), w.get("fc2.bias"))
        if cfg.mlp == "gated":
            return GatedFeedForward(*args, W_G=w["gate.weight"], b_G=w.get("gate.bias"))
        return FeedForward(*args)

    for step in recipe:
        x = step.inputs[0]
        if step.op == "attention":
            Xa, input_stage = before[x]
            sa = attention(cfg, params, Xa, input_stage() if input_stage and cfg.ln_affine else None)
            after[step.out] = _After(sa.output, None, None)
        elif step.op == "norm" and x in before:                # before the attention: its input
            out, stage = _layernorm(cfg, params, step.which, before[x][0], where(recipe, step))
            before[step.out] = (out, stage)
        elif step.op == "norm":
            out, stage = _layernorm(cfg, params, step.which, after[x].value, where(recipe, step))
            after[step.out] = _After(out, x, stage)
        elif step.op == "ffn":
            f = ffn_on(after[x].value)
            after[step.out] = _After(f.output, x, f.stage)
        else:
            after[step.out] = _add(step, before, after, path, composed)
    if sa is None:
        raise ConfigError(f"the dense engine cannot read {cfg.norm!r}: its recipe has no attention")
    return BlockRecord(sa, composed(path(recipe[-1].out, None)), after[recipe[-1].out].value)


def _add(step: Step, before: dict, after: dict[str, _After], path, composed) -> _After:
    """``a + b``: the constant plus a value after the attention is that value (``X + SA``); a value
    plus a branch of it is the residual stage ``a ↦ a + branch(a)``."""
    a, b = step.inputs
    if a in before and b in after:
        return _After(before[a][0] + after[b].value, b, None)
    branch = composed(path(b, a))
    return _After(after[a].value + after[b].value, a, lambda: residual_stage(branch()))
