r"""The dense engine's reading of a block: the nodes a tape ran, folded as ``SA = attention(X_a)``,
``Z = T(SA) + B(X)``.

There is one forward pass and one reading of the recipe: :func:`hessviz.products.block.build` runs
the steps of :data:`hessviz.block.placements.PLACEMENTS` as nodes and records, per layer, the nodes each
step appended (:class:`~hessviz.products.tape.StepNodes`). :func:`fold` walks those steps and turns
their nodes into the dense faces of the same operations, seeded with the values the nodes hold (the
attention reads the core's ``Q``, ``K``, ``V`` and ``A``; a norm its state; the feed-forward branch its
hidden units): nothing is computed twice. It returns a :class:`BlockRecord`: the attention (with, in
a Pre-LN or parallel block with an affine ``ln1``, the parameters of its input), the token-wise rest
of the block from ``SA`` to ``Z`` as one :class:`~hessviz.ops.base.Stage` with its parameters, the
token-wise branch ``B`` on the block's input (``parallel``: ``FFN(ln2(X))``; absent elsewhere) and
``Z``. :func:`record` is the fold of a block run on its own. Every placement
has this shape

.. math::
    SA = \text{attention}(X_a), \qquad Z = T(SA) + B(X),

where ``T`` and ``B`` are token-wise: each step after the attention is one more stage of ``T``
(a norm, the FFN branch), a residual sum ``X + SA`` with the constant ``X`` leaves it
unchanged, and ``a + b`` with ``b`` a branch of ``a`` is the residual stage ``a ↦ a + b(a)``.
Steps on ``X`` that the attention does not read compose ``B``, which the recipe's last step
adds (so nothing maps ``B``'s output further). Operations receive their weights by local name
through :data:`hessviz.block.weights.WEIGHT_MAP`.

The block's input ``X`` is a constant of the block, and ``θ_B`` (``ln2``'s ``γ, β`` and the
feed-forward weights of a parallel block) enter ``Z`` only through ``B``, while every other
weight enters only through ``T(SA)``: every second derivative of ``Z`` between ``θ_B`` and
another weight is exactly zero, and those pairs meet only through the loss curvature,
``Σ_t J^{a⊤}_t J_{T,t}^⊤ N^Z_t J^{B}_t`` (:mod:`hessviz.dense.assembly`). In a stack, where ``X`` is the
previous layer's output, the cross terms through ``X`` (``∂²B/∂X ∂θ_B`` included) are the
stack engine's (:mod:`hessviz.dense.stack`), from the node face.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.block.placements import Step
from hessviz.block.weights import component_weights
from hessviz.dense.chain import compose_stages, residual_stage
from hessviz.errors import ConfigError
from hessviz.ops import activations, layernorm, rotary
from hessviz.ops.attention import AttentionCore, MultiHeadAttention
from hessviz.ops.base import Node, Stage
from hessviz.ops.ffn import FeedForward
from hessviz.ops.gated import GatedFeedForward
from hessviz.ops.layernorm import LayerNorm
from hessviz.products.block import forward_nodes
from hessviz.products.tape import LayerSpan


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
    cfg: BlockConfig, params: dict[str, Tensor], which: str, node: LayerNorm
) -> Callable[[], Stage]:
    """A builder of the stage of the norm the tape ran as ``node``: ``γ ⊙ n + β`` when affine, ``n``
    otherwise (an RMSNorm when ``cfg.norm_type`` says so: no centring, no ``β``)."""
    w = component_weights(cfg, params, which)
    return lambda: layernorm.stage(node.state, which, w.get("gamma"), w.get("beta"))


def _ffn(cfg: BlockConfig, params: dict[str, Tensor], Y: Tensor, nodes: tuple[Node, ...]) -> FeedForward:
    """The feed-forward branch on ``Y`` that the tape ran as ``Linear``, the activation (or the gated
    unit), ``Linear``: its dense face, seeded with the values the nodes hold."""
    up, unit, down = nodes
    w = component_weights(cfg, params, "ffn")
    args = (
        Y,
        w["fc1.weight"],
        w["fc2.weight"],
        activations.get(cfg.activation),
        w.get("fc1.bias"),
        w.get("fc2.bias"),
    )
    if cfg.mlp == "gated":
        f = GatedFeedForward(*args, W_G=w["gate.weight"], b_G=w.get("gate.bias"))
        U = up.y.chunk(2, dim=-1)[0]
        return f.seeded(
            U=U, gate=unit.p, psi=unit.psi, H=unit.h, psi_h=unit.psi_h, hidden=unit.y, output=down.y
        )
    return FeedForward(*args).seeded(H=up.y, hidden=unit.y, output=down.y)


def attention(cfg: BlockConfig, params: dict[str, Tensor], Xa: Tensor) -> MultiHeadAttention:
    """The block's attention on any input ``Xa (L, d)`` (not a tape's), computing its own forward
    values; ``.output`` is ``SA(Xa)``."""
    rot = rotary.for_config(Xa.shape[0], cfg.d_k, cfg.rotary_width, cfg.rope_theta, Xa)
    return MultiHeadAttention(
        Xa,
        component_weights(cfg, params, "attention"),
        cfg.n_heads,
        causal=cfg.causal,
        kv_heads=cfg.kv_heads,
        rotary=rot,
        qk_eps=cfg.ln_eps if cfg.qk_norm else None,
        scale=cfg.score_scale,
        window=cfg.window,
        softcap=cfg.softcap,
    )


def _attention(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    Xa: Tensor,
    nodes: tuple[Node, ...],
    input_stage: Stage | None,
) -> MultiHeadAttention:
    """The block's attention on its input ``Xa (L, d)``, reading the forward values of the core the
    tape ran (``nodes``: the projection, QK-norm, the core, the output projection)."""
    core = next(n for n in nodes if isinstance(n, AttentionCore))
    return MultiHeadAttention(
        Xa,
        component_weights(cfg, params, "attention"),
        cfg.n_heads,
        causal=cfg.causal,
        input_stage=input_stage,
        kv_heads=cfg.kv_heads,
        rotary=core.rotary,
        qk_eps=cfg.ln_eps if cfg.qk_norm else None,
        core=core,
        scale=cfg.score_scale,
        window=cfg.window,
        softcap=cfg.softcap,
    )


@dataclass(frozen=True)
class _After:
    """A value after the attention: ``step`` (``None`` for the identity) maps ``base`` to it
    (``base`` ``None``: ``SA`` itself)."""

    value: Tensor
    base: str | None
    step: Callable[[], Stage] | None


def record(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> BlockRecord:
    """Run the block of ``cfg`` on ``X (L, d)`` (its nodes, :func:`~hessviz.products.block.forward_nodes`)
    and fold them; raises on a zero-variance LayerNorm row."""
    values, _, layers = forward_nodes(cfg, params, X)
    return fold(cfg, params, values, layers[0])


def fold(
    cfg: BlockConfig, params: dict[str, Tensor], values: dict[str, Tensor], span: LayerSpan
) -> BlockRecord:
    """The dense engine's reading of one block that a tape ran (``span``, its values in ``values``;
    ``params`` by the block's own names): step by step, the nodes each step appended become the
    attention, a stage of ``T`` or of the branch ``B``. Nothing is computed twice: every forward value
    is the tape's, and the stages' Jacobians are built when first asked for."""
    before: dict[str, tuple[Tensor, list[Callable[[], Stage]]]] = {
        "X": (values[span.input], [])
    }  # no SA in them
    after: dict[str, _After] = {}
    sa: MultiHeadAttention | None = None
    branch: Callable[[], Stage | None] | None = None
    last = span.steps[-1].step

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

    for done in span.steps:
        step, x, y = done.step, done.step.inputs[0], values[done.output]
        if step.op == "attention":
            Xa, steps = before[x]
            input_stage = composed(steps)() if steps and cfg.ln_affine else None
            sa = _attention(cfg, params, Xa, done.nodes, input_stage)
            after[step.out] = _After(y, None, None)
        elif step.op == "norm" and x in before:  # on X: attention's input, or the branch B
            before[step.out] = (y, before[x][1] + [_layernorm(cfg, params, step.which, done.nodes[-1])])
        elif step.op == "ffn" and x in before:  # on X beside the attention: the branch B
            before[step.out] = (y, before[x][1] + [_ffn(cfg, params, before[x][0], done.nodes).stage])
        elif step.op == "norm":
            after[step.out] = _After(y, x, _layernorm(cfg, params, step.which, done.nodes[-1]))
        elif step.op == "ffn":
            after[step.out] = _After(y, x, _ffn(cfg, params, after[x].value, done.nodes).stage)
        elif (on_x := _branch_on_x(step, before, after)) is not None:  # T(SA) + B(X)
            if step is not last or branch is not None:
                raise ConfigError(
                    f"the dense engine cannot read norm={cfg.norm!r}: a branch on X must "
                    "be added once, by the last step"
                )
            a, b = on_x
            branch = composed(before[b][1])
            after[step.out] = _After(y, a, None)
        else:
            after[step.out] = _add(step, y, before, after, path, composed)
    if sa is None:
        raise ConfigError(f"the dense engine cannot read {cfg.norm!r}: its recipe has no attention")
    return BlockRecord(sa, composed(path(last.out, None)), after[last.out].value, branch)


def _branch_on_x(step: Step, before: dict, after: dict[str, _After]) -> tuple[str, str] | None:
    """``(a, b)`` when ``step`` is ``a + b`` (either order) with ``a`` after the attention and ``b``
    a parameterised value on ``X`` (a branch ``B(X)``); ``None`` otherwise."""
    if step.op != "add":
        return None
    for a, b in (step.inputs, step.inputs[::-1]):
        if a in after and b in before and before[b][1]:
            return a, b
    return None


def _add(step: Step, y: Tensor, before: dict, after: dict[str, _After], path, composed) -> _After:
    """``y = a + b``: the constant plus a value after the attention is that value (``X + SA``); a
    value plus a branch of it is the residual stage ``a ↦ a + branch(a)``."""
    a, b = step.inputs
    if a in before and b in after:
        return _After(y, b, None)
    branch = composed(path(b, a))
    return _After(y, a, lambda: residual_stage(branch()))
