r"""The block as a tape of nodes: the recipe of :mod:`hessviz.block.placements` (which the dense
engine reads too), one group of nodes per step.

A step ``attention`` is ``SA(x) = O(x) W_O + b_O`` (or ``O(x)`` without ``out_proj``), three
nodes: the fused projection ``x [W_Q W_K W_V] + [b_Q b_K b_V]``, the core ``O`` and the output
projection; a step ``ffn`` is ``Linear``, the activation, ``Linear``; ``norm`` and ``add`` are one
node each.

``FFN(z) = φ(z W_1 + b_1) W_2 + b_2``; with ``mlp="gated"`` the step ``ffn`` is the fused
projection ``z [W_G W_1] + [b_G b_1]``, :class:`~hessviz.ops.gated.GatedUnit` and ``Linear``.
Weights that the config does not have (biases, ``W_O``, γ/β) are simply absent from the tape. A
stack of ``N`` blocks is the recipe read ``N`` times, layer ``i`` on the output of layer ``i − 1``
with its own weights ``l{i}.W_Q …``; the tape then differentiates the whole stack exactly,
cross-layer blocks included.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.block.placements import PLACEMENTS, Step, where
from hessviz.block.weights import GLOBAL_NAME
from hessviz.losses import CustomLoss, Loss, block_loss
from hessviz.ops import activations, rotary
from hessviz.ops.attention_core import chain
from hessviz.ops.base import Node
from hessviz.ops.gated import GatedUnit
from hessviz.ops.layernorm import LayerNorm
from hessviz.ops.linear import Linear
from hessviz.ops.qknorm import QKNorm
from hessviz.ops.residual import Residual
from hessviz.ops.tokens import Tokens
from hessviz.products.tape import LayerSpan, StepNodes, Tape


class _Builder:
    """Appends nodes and evaluates them, so the recipe below reads like a forward pass.

    ``prefix`` (``"l1."`` in a stack) is put in front of every value and parameter name the
    recipe writes, so each layer has its own values and reads its own weights; ``cfg``, ``recipe``
    and ``tokens`` are those of the block being appended (:func:`_block`)."""

    def __init__(
        self, params: dict[str, Tensor], X: Tensor, fused: dict[tuple[str, ...], Tensor] | None = None
    ):
        self.params, self.values, self.nodes = params, {"X": X}, []
        self.prefix = ""
        self.fused = {} if fused is None else fused
        """weight names -> their concatenation ``[W_Q W_K W_V]`` (shared between builds)."""
        self.cfg: BlockConfig
        self.recipe: tuple[Step, ...] = ()
        self.wanted: Tensor | None = None
        """the tokens of the output that are wanted (``None``: all)"""
        self.tokens: Tensor | None = None
        """the tokens the next step reads: ``wanted`` once the attention is on the tape, else all"""

    def p(self, name: str) -> tuple[str, Tensor] | None:
        name = self.prefix + name
        return (name, self.params[name]) if name in self.params else None

    def add(self, node: Node) -> str:
        self.nodes.append(node)
        self.values[node.output] = node.y
        return node.output

    def linear_node(self, out: str, x: str, xv: Tensor, weights: list[str], biases: list[str]) -> Linear:
        """``x W + b`` named ``out`` (prefixed already), the weights by their unprefixed names."""
        named = [self.p(w) for w in weights]
        key = tuple(n for n, _ in named)
        if len(named) > 1 and key not in self.fused and xv.device.type != "cpu":  # the CPU's: Linear.W
            self.fused[key] = torch.cat([w for _, w in named], dim=1)
        return Linear(out, x, xv, named, [self.p(b) for b in biases], self.fused.get(key))

    def linear(self, out: str, x: str, weights: list[str], biases: list[str]) -> str:
        return self.add(self.linear_node(self.prefix + out, x, self.values[x], weights, biases))


StepRule = Callable[[_Builder, Step, list[str]], str]
"""How a step of the recipe goes onto the tape: ``(builder, step, its inputs' tape values) ->`` the
tape value of its output."""


def _attention(b: _Builder, step: Step, x: list[str]) -> str:
    """``SA(x)``: the nodes of :func:`~hessviz.ops.attention_core.chain`, the weights by the block's
    names. With ``b.wanted`` the core's output is cut to those tokens (a :class:`Tokens` node) before
    the output projection, the step's output has those tokens alone, and so do the values every
    later step reads."""
    cfg, pre, out = b.cfg, b.prefix, step.out
    X = b.values[x[0]]

    def linear(name: str, inp: str, xv: Tensor, weights: list[str], biases: list[str]) -> Node:
        to_global = lambda locals_: [GLOBAL_NAME["attention", k] for k in locals_]  # noqa: E731
        return b.linear_node(name, inp, xv, to_global(weights), to_global(biases))

    def qk_norm(name: str, qkv: Node) -> Node:
        gammas = (b.p("q_norm_gamma"), b.p("k_norm_gamma"))
        shape = (cfg.n_heads, cfg.kv_heads, cfg.d_k, cfg.value_width, cfg.ln_eps)
        return QKNorm(name, qkv.output, qkv.y, *shape, gammas, where=pre + "attention")

    def cut(core: Node) -> Node:
        return Tokens(pre + ("O[tokens]" if cfg.out_proj else out), core.output, core.y, b.wanted)

    core = "O" if cfg.out_proj else out + "[all]" * (b.wanted is not None)
    nodes = chain(
        x[0],
        X,
        linear,
        cfg.n_heads,
        cfg.kv_heads,
        cfg.d_k,
        cfg.value_width,
        cfg.causal,
        rotary.for_config(X.shape[0], cfg.d_k, cfg.rotary_width, cfg.rope_theta, X),
        qk_norm if cfg.qk_norm else None,
        cfg.out_proj,
        (pre + "QKV", pre + "QKVn", pre + core, pre + out),
        None if b.wanted is None else cut,
        scale=cfg.score_scale,
        window=cfg.window,
        softcap=cfg.softcap,
    )
    for node in nodes:
        b.add(node)
    b.tokens = b.wanted  # every later step reads the wanted tokens alone
    return nodes[-1].output


def _ffn(b: _Builder, step: Step, x: list[str]) -> str:
    """``FFN(x)``: ``Linear``, the activation, ``Linear``; gated: the fused projection ``[W_G W_1]``,
    :class:`GatedUnit`, ``Linear``."""
    act = activations.get(b.cfg.activation)
    if b.cfg.mlp == "gated":
        uh = b.linear("U", x[0], ["W_G", "W_1"], ["b_G", "b_1"])
        a = b.add(GatedUnit(b.prefix + "act", uh, b.values[uh], act))
    else:
        h = b.linear("U", x[0], ["W_1"], ["b_1"])
        a = b.add(act(b.prefix + "act", h, b.values[h]))
    return b.linear(step.out, a, ["W_2"], ["b_2"])


def _norm(b: _Builder, step: Step, x: list[str]) -> str:
    """``ln(x)``: a LayerNorm, or an RMSNorm (``cfg.norm_type``), with the weights ``{which}_gamma``,
    ``{which}_beta`` when the block has them."""
    return b.add(
        LayerNorm(
            b.prefix + step.out,
            x[0],
            b.values[x[0]],
            b.cfg.ln_eps,
            b.p(f"{step.which}_gamma"),
            b.p(f"{step.which}_beta"),
            where=b.prefix + where(b.recipe, step),
            centre=b.cfg.norm_type == "layernorm",
        )
    )


def _add(b: _Builder, step: Step, x: list[str]) -> str:
    """``a + b``: a :class:`Residual` node."""
    return b.add(Residual(b.prefix + step.out, x[0], x[1], b.values[x[0]], b.values[x[1]]))


STEP_RULES: dict[str, StepRule] = {"attention": _attention, "ffn": _ffn, "norm": _norm, "add": _add}
"""A step's ``op`` -> how it goes onto the tape (:data:`hessviz.block.placements.PLACEMENTS` names the
ops); the dense engine's table of the same ops is :data:`hessviz.dense.record.FOLD_RULES`."""


def _block(
    b: _Builder, cfg: BlockConfig, X: str, tokens: Tensor | None = None
) -> tuple[str, tuple[StepNodes, ...]]:
    """Append one block's nodes on the input value ``X``, step by step of its recipe
    (:data:`hessviz.block.placements.PLACEMENTS`, each step by its rule in :data:`STEP_RULES`): the
    name of its output, and the nodes of each step.

    ``tokens``: only these tokens of the output are wanted. Every step after the attention is
    token-wise, so from the attention core's output on each value a later step reads is cut to
    those tokens (a :class:`~hessviz.ops.tokens.Tokens` node, once per value) and the rest of the block
    runs on them alone; the output has ``len(tokens)`` tokens."""
    b.cfg, b.recipe, b.wanted, b.tokens = cfg, PLACEMENTS[cfg.norm], tokens, None
    names = {"X": X}  # recipe value -> tape value
    short: set[str] = set()  # tape values already cut to `tokens`
    cut: dict[str, str] = {}

    def read(value: str) -> str:
        """The tape value of a recipe value for a step after the attention: its tokens alone."""
        t = names[value]
        if tokens is None or t in short:
            return t
        if t not in cut:
            cut[t] = b.add(Tokens(t + "[tokens]", t, b.values[t], tokens))
        return cut[t]

    steps: list[StepNodes] = []
    for step in b.recipe:
        first = len(b.nodes)
        x = [read(i) if b.tokens is not None else names[i] for i in step.inputs]
        names[step.out] = STEP_RULES[step.op](b, step, x)
        steps.append(StepNodes(step, tuple(x), names[step.out], tuple(b.nodes[first:])))
        if b.tokens is not None:
            short.add(names[step.out])
    return names[b.recipe[-1].out], tuple(steps)


def _forward(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    read: Tensor | None,
    fused: dict[tuple[str, ...], Tensor] | None = None,
) -> tuple[_Builder, str, list[LayerSpan]]:
    """The forward pass of every layer as nodes: ``(builder, name of Z, the layers' spans)``;
    ``fused``: concatenated weights to share with other builds (:class:`_Builder`)."""
    b = _Builder(params, X, fused)
    x, layers = "X", []
    for layer in range(cfg.n_layers):
        b.prefix = f"l{layer}." if cfg.is_stack else ""
        first = len(b.nodes)
        out, steps = _block(b, cfg.layer(layer), x, read if layer == cfg.n_layers - 1 else None)
        layers.append(LayerSpan(x, out, first, len(b.nodes), steps))
        x = out
    return b, x, layers


def layer_nodes(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    layer: int,
    fused: dict[tuple[str, ...], Tensor] | None = None,
) -> tuple[list[Node], dict[str, Tensor], str]:
    """Layer ``layer`` of the stack ``cfg`` alone as nodes on its input ``X (L, d)``, the value
    named ``"X"``: ``(nodes, values by name, name of its output)``, the nodes those of the same
    layer in :func:`build` (same names, same weights). A checkpointed sweep rebuilds a layer from
    its input with it (:mod:`hessviz.products.checkpoint`)."""
    b = _Builder(params, X, fused)
    b.prefix = f"l{layer}." if cfg.is_stack else ""
    out, _ = _block(b, cfg.layer(layer), "X")
    return b.nodes, b.values, out


def forward_nodes(
    cfg: BlockConfig, params: dict[str, Tensor], X: Tensor
) -> tuple[dict[str, Tensor], str, list[LayerSpan]]:
    """The forward pass alone, as nodes (no loss, no reverse sweep): the values by name, the name of
    ``Z`` and each layer's span with its steps (:func:`hessviz.dense.record.fold` reads them)."""
    b, x, layers = _forward(cfg, params, X, None)
    return b.values, x, layers


def build_at_output(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    loss_at: Callable[[Tensor], CustomLoss],
    fused: dict[tuple[str, ...], Tensor] | None = None,
) -> tuple[Tape, CustomLoss]:
    """:func:`build` for a loss made from ``Z`` itself (a whole model's objective): one forward
    pass gives ``Z``, ``loss_at(Z)`` the :class:`CustomLoss`, and the same nodes the tape.
    ``fused``: a dict shared by the builds of a batch's sequences, so that each concatenated
    weight (``[W_Q W_K W_V]``) exists once, not once per sequence."""
    b, x, layers = _forward(cfg, params, X, None, fused)
    Y = loss_at(b.values[x])
    return Tape(b.nodes, b.values, x, Y.grad, Y.product, layers=layers), Y


def build(
    cfg: BlockConfig,
    params: dict[str, Tensor],
    X: Tensor,
    Y: Tensor | Loss | None,
    only_read_tokens: bool = False,
) -> Tape:
    """Run the forward pass of ``cfg`` (every layer of a stack) and the first-order reverse sweep once.

    Layer ``i`` of a stack names its values and reads its weights with the prefix ``l{i}.``;
    ``Tape.layers`` records each layer's input, output and nodes.

    ``Y`` is the target of ``cfg.loss`` or a :class:`~hessviz.losses.Loss`
    (:func:`~hessviz.losses.block_loss`).
    ``only_read_tokens=True``, for the products alone: when the loss reads some tokens only
    (:attr:`CustomLoss.read_tokens`), the last layer runs on those tokens after its attention
    (:func:`_block`) and the tape's ``Z`` is theirs, under the loss :meth:`CustomLoss.restricted`
    to them: the same products and gradients, exactly. The dense engines need every token's ``Z``
    and take the tape built without."""
    loss = None if Y is None else block_loss(cfg.loss, Y)
    read = loss.read_tokens if only_read_tokens and loss is not None else None
    b, x, layers = _forward(cfg, params, X, read)
    Zv = b.values[x]
    if read is not None:
        loss = loss.restricted(read)
    if loss is None:  # the model alone (Jacobians): no loss to seed
        return Tape(b.nodes, b.values, x, torch.zeros_like(Zv), torch.zeros_like, layers=layers)
    at = loss.at(Zv)
    return Tape(b.nodes, b.values, x, at.grad, at.product, layers=layers)
