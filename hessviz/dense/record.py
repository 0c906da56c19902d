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
from hessviz.block.weights import component_weights
from hessviz.dense.chain import compose_stages, residual_stage
from hessviz.errors import ConfigError
from hessviz.ops import activations, layernorm, rotary
from hessviz.ops.attention import MultiHeadAttention
from hessviz.ops.base import Node, Stage
from hessviz.ops.ffn import FeedForward
from hessviz.ops.gated import GatedFeedForward
from hessviz.products.block import forward_nodes
from hessviz.products.tape import LayerSpan, StepNodes


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


def attention(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    Xa: Tensor,
    ran: tuple[Node, ...] | None = None,
    input_stage: Stage | None = None,
) -> MultiHeadAttention:
    """The block's attention on its input ``Xa (L, d)``; ``.output`` is ``SA(Xa)``. ``ran``: the nodes a
    tape ran for it on ``Xa`` (the projection, QK-norm, the core, the output projection), whose forward
    values it reads; without them it runs those nodes itself. ``input_stage``: the parameterised
    token-wise map that made ``Xa`` (an affine ``ln1``)."""
    return MultiHeadAttention(
        Xa,
        component_weights(cfg, params, "attention"),
        cfg.n_heads,
        causal=cfg.causal,
        input_stage=input_stage,
        kv_heads=cfg.kv_heads,
        rotary=rotary.for_config(Xa.shape[0], cfg.d_k, cfg.rotary_width, cfg.rope_theta, Xa),
        qk_eps=cfg.ln_eps if cfg.qk_norm else None,
        ran=ran,
        scale=cfg.score_scale,
        window=cfg.window,
        softcap=cfg.softcap,
    )


@dataclass(frozen=True)
class _After:
    """A value after the attention: ``step`` (``None`` for the identity) maps ``base`` to it
    (``base`` ``None``: ``SA`` itself)."""

    base: str | None
    step: Callable[[], Stage] | None


def record(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor) -> BlockRecord:
    """Run the block of ``cfg`` on ``X (L, d)`` (its nodes, :func:`~hessviz.products.block.forward_nodes`)
    and fold them; raises on a zero-variance LayerNorm row."""
    values, _, layers = forward_nodes(cfg, params, X)
    return fold(cfg, params, values, layers[0])


class _Fold:
    """The state of :func:`fold` over the tape values of one block: ``before`` (values on ``X`` that
    the attention does not feed: the stages from ``X`` to each), ``after`` (values after the
    attention), the attention and the branch ``B``."""

    def __init__(
        self, cfg: BlockConfig, params: dict[str, Tensor], values: dict[str, Tensor], span: LayerSpan
    ):
        self.cfg, self.params, self.values = cfg, params, values
        self.before: dict[str, list[Callable[[], Stage]]] = {span.input: []}
        self.after: dict[str, _After] = {}
        self.sa: MultiHeadAttention | None = None
        self.branch: Callable[[], Stage | None] | None = None
        self.last = span.steps[-1]

    def refuse(self, why: str) -> ConfigError:
        return ConfigError(f"the dense engine cannot read norm={self.cfg.norm!r}: {why}")

    def path(self, name: str, start: str | None) -> list[Callable[[], Stage]]:
        """The stages from the value ``start`` (``None``: ``SA``) to ``name``, innermost first."""
        steps: list[Callable[[], Stage]] = []
        while name != start:
            v = self.after[name]
            if v.step is not None:
                steps.append(v.step)
            name = v.base
            if name is None and start is not None:
                raise self.refuse(f"a branch does not start at {start}")
        return steps[::-1]

    def token_wise(self, done: StepNodes, stage: Callable[[], Stage]) -> None:
        """A token-wise step: a stage of ``B`` (or of the attention's input) on ``X``, else of ``T``."""
        x = done.inputs[0]
        if x in self.before:
            self.before[done.output] = self.before[x] + [stage]
        else:
            self.after[done.output] = _After(x, stage)

    def attention(self, done: StepNodes) -> None:
        x = done.inputs[0]
        steps = self.before[x]
        input_stage = _composed(steps)() if steps and self.cfg.ln_affine else None
        self.sa = attention(self.cfg, self.params, self.values[x], done.nodes, input_stage)
        self.after[done.output] = _After(None, None)

    def norm(self, done: StepNodes) -> None:
        which, node = done.step.which, done.nodes[-1]
        w = component_weights(self.cfg, self.params, which)
        self.token_wise(done, lambda: layernorm.stage(node.state, which, w.get("gamma"), w.get("beta")))

    def ffn(self, done: StepNodes) -> None:
        self.token_wise(done, _ffn(self.cfg, self.params, self.values[done.inputs[0]], done.nodes).stage)

    def add(self, done: StepNodes) -> None:
        """``y = a + b``: the constant plus a value after the attention is that value (``X + SA``); a
        value after the attention plus a parameterised value on ``X`` is ``T(SA) + B(X)`` (once, by the
        last step); a value plus a branch of it is the residual stage ``a ↦ a + branch(a)``."""
        a, b = done.inputs
        if a in self.before and not self.before[a] and b in self.after:
            self.after[done.output] = _After(b, None)
            return
        for s, t in (done.inputs, done.inputs[::-1]):
            if s in self.after and t in self.before and self.before[t]:  # T(SA) + B(X)
                if done is not self.last or self.branch is not None:
                    raise self.refuse("a branch on X must be added once, by the last step")
                self.branch = _composed(self.before[t])
                self.after[done.output] = _After(s, None)
                return
        branch = _composed(self.path(b, a))
        self.after[done.output] = _After(a, lambda: residual_stage(branch()))


FOLD_RULES: dict[str, Callable[[_Fold, StepNodes], None]] = {
    "attention": _Fold.attention,
    "norm": _Fold.norm,
    "ffn": _Fold.ffn,
    "add": _Fold.add,
}
"""A step's ``op`` -> how the fold reads the nodes it appended (the tape's table of the same ops is
:data:`hessviz.products.block.STEP_RULES`)."""


def _composed(steps: list[Callable[[], Stage]]) -> Callable[[], Stage | None]:
    def build() -> Stage | None:
        out = None
        for make in steps:
            out = make() if out is None else compose_stages(out, make())
        return out

    return build


def fold(
    cfg: BlockConfig, params: dict[str, Tensor], values: dict[str, Tensor], span: LayerSpan
) -> BlockRecord:
    """The dense engine's reading of one block that a tape ran (``span``, its values in ``values``;
    ``params`` by the block's own names): step by step, by its rule in :data:`FOLD_RULES`, the nodes
    each step appended and the tape values it read and wrote become the attention, a stage of ``T`` or
    of the branch ``B``. Nothing is computed twice: every forward value is the tape's, and the stages'
    Jacobians are built when first asked for."""
    f = _Fold(cfg, params, values, span)
    for done in span.steps:
        FOLD_RULES[done.step.op](f, done)
    if f.sa is None:
        raise f.refuse("its recipe has no attention")
    out = f.last.output
    return BlockRecord(f.sa, _composed(f.path(out, None)), values[out], f.branch)
