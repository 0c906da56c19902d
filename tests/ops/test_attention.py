"""Multi-head attention (:mod:`hessviz.ops.attention`): the dense face (:class:`MultiHeadAttention`: output,
each unit's Jacobian, every block of the functional term, over heads, grouped key/value heads, rotary
positions, QK-norm, LayerNorm parameters before it, and ``MODEL.md`` part 5's score scale, sliding window
and soft-capping) and the node face (:class:`AttentionCore`,
``[Q K V] ↦ O``), against a stock-torch attention by autograd, reverse over reverse."""

import math
from dataclasses import dataclass

import pytest
import torch

from hessviz.ops import layernorm
from hessviz.ops.attention import HEAD_AXES, MultiHeadAttention
from hessviz.ops.attention_core import AttentionCore
from hessviz.ops.rotary import Rotary
from tests.helpers import assert_close
from tests.ops import rope
from tests.ops.autograd import check_node, check_pieces, hessian, jacobians, randn

THETA = 100.0


@dataclass(frozen=True)
class Case:
    L: int = 3
    d: int = 4
    heads: int = 2
    kv_heads: int = 2
    d_k: int = 2
    d_v: int = 2
    causal: bool = False
    biases: bool = True
    out_proj: bool = True
    rotary: int = 0
    qk_eps: float | None = None
    input_ln: bool = False
    scale: float | None = None
    window: int | None = None
    softcap: float | None = None

    def __str__(self):
        flags = [k for k in ("causal", "biases", "out_proj", "input_ln") if getattr(self, k)]
        flags += [f"rope{self.rotary}"] * bool(self.rotary) + ["qknorm"] * (self.qk_eps is not None)
        flags += [f"{k}{getattr(self, k):g}" for k in ("scale", "window", "softcap") if getattr(self, k)]
        return f"L{self.L}d{self.d}H{self.heads}G{self.kv_heads}dk{self.d_k}dv{self.d_v}-" + "-".join(flags)


DENSE = [
    Case(heads=1, kv_heads=1, d_k=3, d_v=4, biases=False, out_proj=False),  # one head, no projection
    Case(causal=True),  # biases, output projection
    Case(L=4, heads=4, kv_heads=2, d_k=1, d_v=1),  # grouped key/value heads
    Case(d_k=4, rotary=2, causal=True),  # partial rotary: b_K acts
    Case(L=2, heads=2, kv_heads=1, d_k=2, rotary=2, qk_eps=1e-6, biases=False),  # Qwen3: QK-norm + rope
    Case(L=2, d=3, heads=1, kv_heads=1, d_k=2, d_v=3, input_ln=True),  # LayerNorm parameters before
    Case(L=5, causal=True, window=2, scale=0.8),  # a window shorter than the text
    Case(L=4, heads=4, kv_heads=2, d_k=1, d_v=1, softcap=1.5, scale=1.5),  # capped, GQA: b_K acts
    Case(L=5, d_k=4, rotary=4, causal=True, window=3, softcap=1.0, scale=1.2),  # rope, b_K acts, capped
    Case(L=4, heads=2, kv_heads=1, rotary=2, qk_eps=1e-6, biases=False, causal=True, window=2, softcap=0.5),
    Case(L=3, d=3, heads=1, kv_heads=1, d_k=2, d_v=3, input_ln=True, softcap=0.7, causal=True, window=2),
]
CORE = [
    Case(),
    Case(causal=True, heads=4, kv_heads=2, d_k=1, d_v=3),
    Case(L=5, d_k=4, rotary=4, causal=True),
    Case(L=1, heads=1, kv_heads=1, d_k=2, d_v=1),
    Case(L=5, causal=True, window=2, softcap=0.5, scale=2.5, heads=4, kv_heads=2, d_k=2, d_v=1),
    Case(L=4, d_k=4, rotary=4, softcap=3.0),
]


def weights(rng, c: Case) -> dict:
    w = {
        "query.weight": randn(rng, c.d, c.heads * c.d_k),
        "key.weight": randn(rng, c.d, c.kv_heads * c.d_k),
        "value.weight": randn(rng, c.d, c.kv_heads * c.d_v),
    }
    if c.biases:
        w |= {
            "query.bias": randn(rng, c.heads * c.d_k),
            "key.bias": randn(rng, c.kv_heads * c.d_k),
            "value.bias": randn(rng, c.kv_heads * c.d_v),
        }
    if c.qk_eps is not None:
        w |= {
            "query.norm": 1.0 + randn(rng, c.d_k, scale=0.3),
            "key.norm": 1.0 + randn(rng, c.d_k, scale=0.3),
        }
    if c.out_proj:
        w["out.weight"] = randn(rng, c.heads * c.d_v, c.d)
        if c.biases:
            w["out.bias"] = randn(rng, c.d)
    return w


def core(c: Case, qkv, gq=None, gk=None):
    """``[Q K V] ↦ O`` in stock torch: heads, QK-norm, rope, grouped heads repeated, mask, softmax."""
    q, k, v = torch.split(qkv, (c.heads * c.d_k, c.kv_heads * c.d_k, c.kv_heads * c.d_v), -1)
    q, k, v = (
        t.unflatten(-1, (n, -1)).transpose(0, 1) for t, n in ((q, c.heads), (k, c.kv_heads), (v, c.kv_heads))
    )
    if gq is not None:
        q, k = (g * t / torch.sqrt((t * t).mean(-1, keepdim=True) + c.qk_eps) for t, g in ((q, gq), (k, gk)))
    if c.rotary:
        q, k = rope.rotate(q, c.rotary, THETA), rope.rotate(k, c.rotary, THETA)
    k, v = (t.repeat_interleave(c.heads // c.kv_heads, 0) for t in (k, v))
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(c.d_k) if c.scale is None else c.scale)
    if c.softcap is not None:
        s = c.softcap * torch.tanh(s / c.softcap)
    if c.causal:
        t, r = torch.arange(c.L)[:, None], torch.arange(c.L)[None, :]
        hidden = (r > t) | (r <= t - c.window) if c.window is not None else r > t  # t − w < s ≤ t
        s = s.masked_fill(hidden, -torch.inf)
    return (torch.softmax(s, -1) @ v).transpose(0, 1).flatten(-2)


def attention(c: Case, X, w: dict):
    kinds = ("query", "key", "value")
    qkv = torch.cat([X @ w[f"{k}.weight"] + w.get(f"{k}.bias", 0.0) for k in kinds], -1)
    O = core(c, qkv, w.get("query.norm"), w.get("key.norm"))
    return O @ w["out.weight"] + w.get("out.bias", 0.0) if c.out_proj else O


def unit(w: dict, ref, count) -> torch.Tensor:
    """The entries of one parameter unit: a head's columns (rows of ``out.weight``), or the whole."""
    _, local, h = ref
    if h is None:
        return w[local]
    axis = HEAD_AXES[local] - 2 if w[local].dim() == 2 else -1
    width = w[local].shape[axis] // count(local)
    return w[local].narrow(axis, h * width, width)


def joined(units: dict) -> dict:
    """The whole weights from their units (the inverse of :func:`unit`)."""
    parts: dict = {}
    for (_, local, _), t in units.items():
        parts.setdefault(local, []).append(t)
    return {k: torch.cat(v, HEAD_AXES[k] - 2 if v[0].dim() == 2 else -1) for k, v in parts.items()}


@pytest.mark.parametrize("c", DENSE, ids=str)
def test_dense_face(rng, rtol, c):
    w = weights(rng, c)
    Z = randn(rng, c.L, c.d, scale=1.5)
    ln = {"gamma": 1.0 + randn(rng, c.d, scale=0.3), "beta": randn(rng, c.d, scale=0.3)} if c.input_ln else {}
    stage = None
    if ln:
        n, st = layernorm.value(Z, 1e-5)
        X, stage = n * ln["gamma"] + ln["beta"], layernorm.stage(st, "ln1", ln["gamma"], ln["beta"])
    else:
        X = Z
    rot = Rotary(c.L, c.d_k, c.rotary, THETA, X) if c.rotary else None
    mha = MultiHeadAttention(
        X,
        w,
        c.heads,
        causal=c.causal,
        input_stage=stage,
        kv_heads=c.kv_heads,
        rotary=rot,
        qk_eps=c.qk_eps,
        scale=c.scale,
        window=c.window,
        softcap=c.softcap,
    )
    units = {r: (ln[r[1]] if r[0] == "ln1" else unit(w, r, mha.count)) for r in mha.units}
    assert set(joined({r: t for r, t in units.items() if r[0] != "ln1"})) == set(w)

    def f(*values):
        named = dict(zip(units, values))
        inputs = {r[1]: t for r, t in named.items() if r[0] == "ln1"}
        x = torch.nn.functional.layer_norm(Z, (c.d,), inputs["gamma"], inputs["beta"], 1e-5) if inputs else Z
        return attention(c, x, joined({r: t for r, t in named.items() if r[0] != "ln1"}))

    values = list(units.values())
    assert_close(mha.output, f(*values), rtol, "SA")
    for r, J in zip(units, jacobians(f, values)):
        got = mha.jacobian(r)
        ref = J.reshape(c.L, c.d, -1)
        if got is None:
            assert float(ref.abs().max()) < 1e-13, f"∂SA/∂{r} is not zero"  # b_K: the softmax ignores it
        else:
            assert_close(got.dense(), ref, rtol, f"∂SA/∂{r}")
    g = randn(rng, c.L, c.d)
    check_pieces(mha.functional(g, tuple(units)), units, hessian(f, values, g), rtol, str(c))


@pytest.mark.parametrize("c", CORE, ids=str)
def test_node_face(rng, rtol, c):
    qkv = randn(rng, c.L, (c.heads + c.kv_heads) * c.d_k + c.kv_heads * c.d_v, scale=1.5)
    rot = Rotary(c.L, c.d_k, c.rotary, THETA, qkv) if c.rotary else None
    node = AttentionCore(
        "O",
        "QKV",
        qkv,
        c.heads,
        c.d_k,
        c.d_v,
        c.causal,
        c.kv_heads,
        rot,
        scale=c.scale,
        window=c.window,
        softcap=c.softcap,
    )
    check_node(node, lambda t: core(c, t), [qkv], [], rng, rtol, k=3, what=str(c))
