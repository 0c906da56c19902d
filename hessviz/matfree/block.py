r"""The block as a tape of nodes: the same recipe the dense engine follows, read once.

Placements (MODEL.md parts 1 and 2), with ``SA(x) = O(x) W_O + b_O`` (or ``O(x)`` without
``out_proj``) and ``O`` the multi-head attention core over ``x [W_Q W_K W_V] + [b_Q b_K b_V]``:

======== ==================================== ==========================================
norm     ``Z1``                               ``Z``
======== ==================================== ==========================================
post     ``ln1(X + SA(X))``                   ``ln2(Z1 + FFN(Z1))``
pre      ``X + SA(ln1(X))``                   ``Z1 + FFN(ln2(Z1))``
none     ``X + SA(X)``                        ``Z1 + FFN(Z1)``
attention —                                   ``SA(X)``
======== ==================================== ==========================================

``FFN(z) = φ(z W_1 + b_1) W_2 + b_2``. Weights that the config does not have (biases,
``W_O``, γ/β) are simply absent from the tape.
"""

from __future__ import annotations

from torch import Tensor

from hessviz import losses
from hessviz.config import BlockConfig
from hessviz.matfree.attention import Attention
from hessviz.matfree.elementwise import Elementwise
from hessviz.matfree.layernorm import LayerNorm
from hessviz.matfree.linear import Linear
from hessviz.matfree.residual import Residual
from hessviz.matfree.tape import Node, Tape


def loss_hvp(kind: str, Z: Tensor):
    """``Ż (k, L, d) ↦ ∇²_Z ℓ · Ż``: ``2Ż/(Ld)`` (mse), ``(p⊙Ż − p (pᵀŻ))/L`` per token (ce)."""
    L, d = Z.shape
    if kind == "mse":
        return lambda dZ: dZ * (2.0 / (L * d))
    p = Z.softmax(-1)
    return lambda dZ: (p * dZ - p * (p * dZ).sum(-1, keepdim=True)) / L


class _Builder:
    """Appends nodes and evaluates them, so the recipe below reads like a forward pass."""

    def __init__(self, params: dict[str, Tensor], X: Tensor):
        self.params, self.values, self.nodes = params, {"X": X}, []

    def p(self, name: str) -> tuple[str, Tensor] | None:
        return (name, self.params[name]) if name in self.params else None

    def add(self, node: Node) -> str:
        self.nodes.append(node)
        self.values[node.output] = node.y
        return node.output

    def linear(self, out: str, x: str, weights: list[str], biases: list[str]) -> str:
        return self.add(Linear(out, x, self.values[x], [self.p(w) for w in weights],
                               [self.p(b) for b in biases]))

    def layernorm(self, out: str, x: str, prefix: str, eps: float) -> str:
        return self.add(LayerNorm(out, x, self.values[x], eps, self.p(f"{prefix}_gamma"),
                                  self.p(f"{prefix}_beta"), where=f"{prefix} input"))

    def residual(self, out: str, a: str, b: str) -> str:
        return self.add(Residual(out, a, b, self.values[a], self.values[b]))


def build(cfg: BlockConfig, params: dict[str, Tensor], X: Tensor, Y: Tensor) -> Tape:
    """Run the forward pass of ``cfg`` and the first-order reverse sweep once."""
    b = _Builder(params, X)
    eps, norm = cfg.ln_eps, cfg.norm

    def self_attention(x: str) -> str:
        qkv = b.linear("QKV", x, ["W_Q", "W_K", "W_V"], ["b_Q", "b_K", "b_V"])
        o = b.add(Attention("O", qkv, b.values[qkv], cfg.n_heads, cfg.d_k, cfg.value_width, cfg.causal))
        return b.linear("SA", o, ["W_O"], ["b_O"]) if cfg.out_proj else o

    def ffn(z: str) -> str:
        h = b.linear("U", z, ["W_1"], ["b_1"])
        a = b.add(Elementwise("act", h, b.values[h], cfg.activation))
        return b.linear("F", a, ["W_2"], ["b_2"])

    if norm == "attention":
        Z = self_attention("X")
    elif norm == "post":
        z1 = b.layernorm("Z1", b.residual("R1", "X", self_attention("X")), "ln1", eps)
        Z = b.layernorm("Z", b.residual("R2", z1, ffn(z1)), "ln2", eps)
    elif norm == "pre":
        z1 = b.residual("Z1", "X", self_attention(b.layernorm("X_ln", "X", "ln1", eps)))
        Z = b.residual("Z", z1, ffn(b.layernorm("Z1_ln", z1, "ln2", eps)))
    else:
        z1 = b.residual("Z1", "X", self_attention("X"))
        Z = b.residual("Z", z1, ffn(z1))
    Zv = b.values[Z]
    return Tape(b.nodes, b.values, Z, losses.gradient(cfg.loss, Zv, Y), loss_hvp(cfg.loss, Zv))
