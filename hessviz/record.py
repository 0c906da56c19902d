r"""The dense engine's forward pass: the placement recipe read as ``SA = attention(X_a)``,
``Z = T(SA) + B(X)``.

:func:`record` runs the recipe of :data:`hessviz.placements.PLACEMENTS` for ``cfg.norm`` and
returns a :class:`BlockRecord`: the attention (with, in a Pre-LN or parallel block with an
affine ``ln1``, the parameters of its input), the token-wise rest of the block from ``SA`` to
``Z`` as one :class:`~hessviz.chain.Stage` with its parameters, the token-wise branch ``B`` on
the block's input (``parallel``: ``FFN(ln2(X))``; absent elsewhere) and ``Z``. Every placement
has this shape

.. math::
    SA = \text{attention}(X_a), \qquad Z = T(SA) + B(X),

where ``T`` and ``B`` are token-wise: each step after the attention is one more stage of ``T``
(a norm, the FFN branch), a residual sum ``X + SA`` with the constant ``X`` leaves it
unchanged, and ``a + b`` with ``b`` a branch of ``a`` is the residual stage ``a ↦ a + b(a)``.
Steps on ``X`` that the attention does not read compose ``B``, which the recipe's last step
adds (so nothing maps ``B``'s output further). Operations receive their weights by local name
through :data:`hessviz.weights.WEIGHT_MAP`.

The block's input ``X`` is a constant of the block, and ``θ_B`` (``ln2``'s ``γ, β`` and the
feed-forward weights of a parallel block) enter ``Z`` only through ``B``, while every other
weight enters only through ``T(SA)``: every second derivative of ``Z`` between ``θ_B`` and
another weight is exactly zero, and those pairs meet only through the loss curvature,
``Σ_t J^{a⊤}_t J_{T,t}^⊤ N^Z_t J^{B}_t`` (:mod:`hessviz.assembly`). In a stack, where ``X`` is the
previous layer's output, the cross terms through ``X`` (``∂²B/∂X ∂θ_B`` included) are the
stack engine's (:mod:`hessviz.stack`), from the node face.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from torch import Tensor

from hessviz.chain import Stage, compose_stages, residual_stage
from hessviz.config import BlockConfig
from hessviz.errors import ConfigError
from hessviz.ops import activations, layernorm, rotary
from hessviz.ops.attention import MultiHeadAttention
from hessviz.ops.ffn import FeedForward
from hessviz.ops.gated import GatedFeedForward
from hessviz.placements import PLACEMENTS, Step, where
from hessviz.weights import component_weights


@dataclass(frozen=True)
class BlockRecord:
    """One forward pass: the attention, the token-wise map ``T: SA → Z`` (``None`` for the
    identity), ``Z (L, d)`` and the token-wise branch ``B`` on ``X`` added to ``T(SA)``
    (``None``: none).

    The stages' per-token Jacobians cost ``O(L d³)`` to compose, so they are built from
    ``build_stage`` and ``build_branch`` when first asked for: a forward pass (``hv.forward``)
    never builds them.
    """

    attention: MultiHeadAttention
    build_stage: Callable[[], Stage | None]
    Z: Tensor
    build_branch: Callable[[], Stage | None] | None = None

    @cached_property
    def stage(self) -> Stage | None:
        return self.build_stage()

    @cached_property
    def branch(self) -> Stage | None:
        """``B``: ``Z = T(SA) + B(X)``; its ``jacobians`` are ``∂Z/∂θ_B``, its ``functional`` the
        second derivatives of ``gᵀZ`` in ``θ_B`` (its input ``X`` is a constant)."""
        return None if self.build_branch is None else self.build_branch()


def _layernorm(
    cfg: BlockConfig, params: dict[str, Tensor], which: str, z: Tensor, where: str
) -> tuple[Tensor, Callable[[], Stage]]:
    """``which(z)`` and a builder of its stage: ``γ ⊙ n + β`` when affine, ``n`` otherwise (an RMSNorm
    when ``cfg.norm_type`` says so: no centring, no ``β``)."""
    n, st = layernorm.value(z, cfg.ln_eps, where=where, centre=cfg.norm_type == "layernorm")
    w = component_weights(cfg, params, which)
    gamma, beta = w.get("gamma"), w.get("beta")
    out = n if gamma is None else n * gamma if beta is None else n * gamma + beta
    return out, lambda: layernorm.stage(st, which, gamma, beta)


def attention(
    cfg: BlockConfig, params: dict[str, Tensor], Xa: Tensor, input_stage: Stage | None = None
) -> MultiHeadAttention:
    """The block's attention on the input ``Xa (L, d)``; ``.output`` is ``SA(Xa)``."""
    rot = rotary.for_config(Xa.shape[0], cfg.d_k, cfg.rotary_width, cfg.rope_theta, Xa)
    return MultiHeadAttention(
        Xa,
        component_weights(cfg, params, "attention"),
        cfg.n_heads,
        causal=cfg.causal,
        input_stage=input_stage,
        kv_heads=cfg.kv_heads,
        rotary=rot,
        qk_eps=cfg.ln_eps if cfg.qk_norm else None,
    )


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
    before: dict[str, tuple[Tensor, list[Callable[[], Stage]]]] = {"X": (X, [])}  # on X: no SA in them
    after: dict[str, _After] = {}
    sa: MultiHeadAttention | None = None
    branch: Callable[[], Stage | None] | None = None

    def path(name: str, start: str | None) -> list[Callable[[], Stage]]:
        """The stages from the value ``start`` (``None``: ``SA``) to ``name``, innermost first."""
        steps: list[Callable[[], Stage]] = []
        while name != start:
            v = after[name]
            if v.step is not None:
                steps.append(v.step)
            name = v.base
            if name is None and start is not None:
                raise ConfigError(
                    f"the dense engine cannot read norm={cfg.norm!r}: a branch does not start at {start}"
                )
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
            Xa, steps = before[x]
            sa = attention(cfg, params, Xa, composed(steps)() if steps and cfg.ln_affine else None)
            after[step.out] = _After(sa.output, None, None)
        elif step.op == "norm" and x in before:  # on X: attention's input, or the branch B
            out, stage = _layernorm(cfg, params, step.which, before[x][0], where(recipe, step))
            before[step.out] = (out, before[x][1] + [stage])
        elif step.op == "ffn" and x in before:  # on X beside the attention: the branch B
            f = ffn_on(before[x][0])
            before[step.out] = (f.output, before[x][1] + [f.stage])
        elif step.op == "norm":
            out, stage = _layernorm(cfg, params, step.which, after[x].value, where(recipe, step))
            after[step.out] = _After(out, x, stage)
        elif step.op == "ffn":
            f = ffn_on(after[x].value)
            after[step.out] = _After(f.output, x, f.stage)
        elif (on_x := _branch_on_x(step, before, after)) is not None:  # T(SA) + B(X)
            if step is not recipe[-1] or branch is not None:
                raise ConfigError(
                    f"the dense engine cannot read norm={cfg.norm!r}: a branch on X must "
                    "be added once, by the last step"
                )
            a, b = on_x
            branch = composed(before[b][1])
            after[step.out] = _After(after[a].value + before[b][0], a, None)
        else:
            after[step.out] = _add(step, before, after, path, composed)
    if sa is None:
        raise ConfigError(f"the dense engine cannot read {cfg.norm!r}: its recipe has no attention")
    return BlockRecord(sa, composed(path(recipe[-1].out, None)), after[recipe[-1].out].value, branch)


def _branch_on_x(step: Step, before: dict, after: dict[str, _After]) -> tuple[str, str] | None:
    """``(a, b)`` when ``step`` is ``a + b`` (either order) with ``a`` after the attention and ``b``
    a parameterised value on ``X`` (a branch ``B(X)``); ``None`` otherwise."""
    if step.op != "add":
        return None
    for a, b in (step.inputs, step.inputs[::-1]):
        if a in after and b in before and before[b][1]:
            return a, b
    return None


def _add(step: Step, before: dict, after: dict[str, _After], path, composed) -> _After:
    """``a + b``: the constant plus a value after the attention is that value (``X + SA``); a value
    plus a branch of it is the residual stage ``a ↦ a + branch(a)``."""
    a, b = step.inputs
    if a in before and b in after:
        return _After(before[a][0] + after[b].value, b, None)
    branch = composed(path(b, a))
    return _After(after[a].value + after[b].value, a, lambda: residual_stage(branch()))
