r"""Multi-head self-attention with optional biases, output projection and causal mask: both faces.

Dense face (:class:`MultiHeadAttention`, the projections, score, softmax and values fused).

Local parameter names (the block's weight table maps them to ``W_Q``, ``b_Q``, …):
``query.weight (d, H·d_k)``, ``query.bias (H·d_k,)``, ``key.weight``, ``key.bias``,
``value.weight (d, H·d_v)``, ``value.bias``, ``out.weight (H·d_v, d)``, ``out.bias (d,)``.
Head ``h`` owns columns ``h·d_k … (h+1)·d_k − 1`` (rows of ``out.weight``); a parameter
unit is one head of a headed weight, or a whole unheaded one.

Per head, on the input ``X (L, d)``: ``Q = X W_Q + b_Q``, ``K``, ``V`` alike,
``S = Q Kᵀ/√d_k`` (``−∞`` above the diagonal when causal), ``A = softmax_row(S)``,
``O = A V``; ``SA = Σ_h O_h W_O^h + b_O`` (without the projection ``SA = O``, one head).
With ``a_t`` the row of ``A``, ``Σ_t = diag(a_t) − a_t a_tᵀ`` and ``M = V W_O`` (the values
seen in the output space), per output token ``t``:

.. math::
    \frac{∂SA_t}{∂W_O^h} = o_t ⊗ I_d,\quad
    \frac{∂SA_t}{∂W_V^h} = (a_t X) ⊗ W_O^{h\top},\quad
    \frac{∂SA_t}{∂b_V^h} = W_O^{h\top},\quad
    \frac{∂SA_t}{∂W_Q^h} = x_t ⊗ \frac{M^\top Σ_t K}{\sqrt{d_k}},\quad
    \frac{∂SA_t}{∂W_K^h}[o,(i,m)] = \frac{(M^\top Σ_t X)[o, i]\, q_t[m]}{\sqrt{d_k}},

and ``∂SA/∂b_K = 0``: ``b_K`` shifts every score of row ``t`` by ``q_t·b_K/√d_k``, which the
softmax ignores; every Hessian entry of ``b_K`` is exactly zero.

The second derivative of ``Σ_t g_tᵀ SA_t`` (the functional term), with ``g^O = g W_Oᵀ``,
``G^A = g^O Vᵀ`` and ``G^S = Σ_t G^A_t`` (row by row), is head-diagonal and has four sources:

* the softmax, contracted with ``G^A_t``: ``J_Sᵀ Q_softmax(a_t, G^A_t) J_S``;
* the bilinear score: ``(Xᵀ G^S X)/√d_k ⊗ I`` for ``(W_Q, W_K)``, ``(1ᵀ G^S X)/√d_k ⊗ I``
  for ``(b_Q, W_K)``;
* the product ``A V``: ``∂u_t/∂W_{Q,K}`` (``u_t = a_t X``) paired with ``I ⊗ g^O_t`` for
  ``W_V``; nothing for ``b_V`` (the rows of ``A`` sum to one);
* the product ``O W_O``: ``(Σ_t (a_tX)ᵀ g_t) ⊗ δ`` for ``(W_V, W_O)``, ``(1ᵀ g) ⊗ δ`` for
  ``(b_V, W_O)``, and ``∂o_t/∂W_{Q,K}`` paired with ``I ⊗ g_t`` for the score side.

When the input itself depends on parameters (the affine ``ln1`` of a Pre-LN block,
``X = γ ⊙ n + β``), those are *input parameters*: their Jacobian is attention's input
Jacobian applied to ``∂X/∂θ``, and their second derivatives are the directional
derivatives, along ``∂X/∂θ``, of the gradients above: the node face's adjoint tangent
(:meth:`MultiHeadAttention._tangents`), the same rules the product engine runs.

Grouped-query heads, rotary positions, QK-norm (``MODEL.md`` part 3). With ``G`` key/value heads
query head ``h`` reads key/value head ``h // (H/G)``: the key/value units are indexed by ``g < G``;
a unit's Jacobian is the sum of those through the query heads that read it, and each query head's
functional pieces are written against the units it reads, so a shared head's blocks collect every
reader's curvature (the assembler sums pieces of one pair). Rotary positions are a fixed orthogonal
map per position on ``q`` and ``k`` (:mod:`~hessviz.ops.rotary`): the score stays bilinear, and
the rotation folds into its factors (:func:`~hessviz.ops.score.rotary_jacobian`,
:func:`~hessviz.ops.score.rotary_mixed`); ``b_K`` then acts. QK-norm
(:mod:`~hessviz.ops.qknorm`) is not bilinear: with it the attention's own units are read from the
node rules below (a tangent sweep along each unit's entries gives its Jacobian, the adjoint tangent
its functional blocks), exactly, at the cost of one batched sweep per unit.

Score scale, sliding window, soft-capping (``MODEL.md`` part 5). ``1/√d_k`` is ``c = attn_scale`` where
one is given; a ``window`` widens the causal mask (masked entries have ``A = 0``, so no rule changes);
``softcap`` puts ``S = c_s·tanh(S₀/c_s)`` between the bilinear score ``S₀`` and the mask
(:mod:`~hessviz.ops.softcap`): its ``y'`` multiplies the softmax side (``Mᵀ Σ_t diag(y'_t)``), the
score-side curvature is :class:`~hessviz.ops.softcap.CappedCurvature` and the bilinear term is
contracted with ``∂/∂S₀ = y' ⊙ ∂/∂S``; ``b_K`` then acts (its row shift passes the cap unevenly).

Node face: :mod:`hessviz.ops.attention_core` (:class:`~hessviz.ops.attention_core.AttentionCore`,
the core ``[Q K V] ↦ O``, and :func:`~hessviz.ops.attention_core.chain`, the nodes of the whole
attention). The dense face reads its forward values (``Q``, ``K``, ``V``, ``A``, ``O``, ``SA``) from
those nodes: the forward is written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from hessviz.ops import score, softmax
from hessviz.ops.attention_core import AttentionCore, chain
from hessviz.ops.base import Along, Node, Stage, eye, ones
from hessviz.ops.contributions import Dense, Diagonal, Piece, Ref, Sandwich
from hessviz.ops.kron import LEFT, RIGHT, Factored, KronTerm
from hessviz.ops.linear import Linear
from hessviz.ops.qknorm import QKNorm
from hessviz.ops.rotary import Rotary
from hessviz.ops.softcap import CappedCurvature, Softcap

HEAD_AXES = {
    "query.weight": 1,
    "query.bias": 1,
    "key.weight": 1,
    "key.bias": 1,
    "value.weight": 1,
    "value.bias": 1,
    "out.weight": 0,
}
"""The headed local parameters and where their heads lie: ``1`` column blocks, ``0`` row blocks."""

LOCALS = (
    "query.weight",
    "query.bias",
    "query.norm",
    "key.weight",
    "key.bias",
    "key.norm",
    "value.weight",
    "value.bias",
    "out.weight",
    "out.bias",
)
SCORE_SIDE = ("query.weight", "query.bias", "key.weight")
"""The parameters that act through the scores (``key.bias`` does not act at all)."""


def split_heads(local: str, w: Tensor, n_heads: int) -> Tensor:
    """``(H, rows, cols)``: head ``h`` of a headed parameter (a vector is one row)."""
    if w.dim() == 1:
        w = w.unsqueeze(0)
    rows, cols = w.shape
    if HEAD_AXES[local] == 0:
        return w.view(n_heads, rows // n_heads, cols)
    return w.view(rows, n_heads, cols // n_heads).transpose(0, 1)


@dataclass
class _Head:
    """Forward values of one head, and the per-token factors its derivatives share."""

    X: Tensor
    Q: Tensor
    K: Tensor
    V: Tensor
    A: Tensor
    O: Tensor  # noqa: E741 (the papers' name for the head output A V)
    W_O: Tensor | None
    rotary: Rotary | None = None
    key_bias: bool = False
    """``Q``, ``K`` are the rotated rows when ``rotary``; ``key_bias``: ``b_K`` acts (it does with rope
    and with soft-capping)."""
    scale: float | None = None
    """The factor on ``q·k`` (``None``: ``1/√d_k``)."""
    cap: Softcap | None = None
    """Soft-capping at this head's raw scores: ``y'``, ``y''`` enter the score side."""

    @cached_property
    def M(self) -> Tensor:
        """``V W_O``: the values in the output space, ``(L, d)``."""
        return self.V if self.W_O is None else self.V @ self.W_O

    def through_softmax(self, M: Tensor) -> Tensor:
        """``Mᵀ Σ_t`` per token for ``M (L, n)``: ``(L, n, L)``."""
        L = self.A.shape[0]
        out = softmax.apply_jacobian(self.A, M.expand(L, L, M.shape[-1])).transpose(-1, -2)
        return out if self.cap is None else out * self.cap.d1.unsqueeze(-2)  # Mᵀ Σ_t diag(y'_t)

    @cached_property
    def MtSigma(self) -> Tensor:
        return self.through_softmax(self.M)

    @cached_property
    def score_jacobian(self) -> dict[str, Factored]:
        """``∂S_t/∂θ`` for the score-side parameters, output size ``L`` per token."""
        if self.rotary is not None:
            return score.rotary_jacobian(self.X, self.Q, self.K, self.rotary, self.key_bias, self.scale)
        return score.jacobian(self.X, self.Q, self.K, self.scale, self.key_bias)


class MultiHeadAttention:
    """Forward values of the attention on ``X (L, d)`` and its derivatives.

    ``weights``: local name -> tensor (biases and ``out.weight`` optional); ``input_stage``:
    the token-wise map that produced ``X`` from a weight-free input, when it has parameters.
    ``kv_heads`` (``G``, default ``n_heads``): the key/value heads, query head ``h`` reading
    ``h // (n_heads/G)``, whose units collect the terms of every query head that reads them;
    ``rotary``: the rotary positions applied to each head's ``q`` and ``k``; ``scale``, ``window``,
    ``softcap``: the score's factor, the sliding window and the soft-cap (``MODEL.md`` part 5).
    """

    def __init__(
        self,
        X: Tensor,
        weights: dict[str, Tensor],
        n_heads: int,
        *,
        causal: bool = False,
        name: str = "attention",
        input_stage: Stage | None = None,
        kv_heads: int | None = None,
        rotary: Rotary | None = None,
        qk_eps: float | None = None,
        ran: Sequence[Node] | None = None,
        scale: float | None = None,
        window: int | None = None,
        softcap: float | None = None,
    ):
        self.X, self.weights, self.n_heads, self.causal, self.name = X, weights, n_heads, causal, name
        self.window, self.softcap = window, softcap
        self._ran = None if ran is None else tuple(ran)
        """The nodes a tape ran for this attention on the same input (:func:`hessviz.dense.record.fold`):
        their values are read, not computed a second time."""
        self.input_stage = input_stage
        self.kv_heads = n_heads if kv_heads is None else kv_heads
        self.group = n_heads // self.kv_heads
        self.rotary = rotary
        self.qk_eps = qk_eps
        """QK-norm's ε (``None``: no QK-norm). With it every derivative of the attention's own units
        is read from the node face's rules (:meth:`_node_jacobian`, :meth:`_node_functional`)."""
        self.out_proj = "out.weight" in weights
        self.split = {k: split_heads(k, w, self.count(k)) for k, w in weights.items() if k in HEAD_AXES}
        self.d_k = self.split["query.weight"].shape[-1]
        self.scale = score.factor(self.d_k, scale)
        acts = (rotary is not None or softcap is not None) and "key.bias" in weights  # b_K no longer cancels
        self.score_side = SCORE_SIDE + (("key.bias",) if acts else ())

    def count(self, local: str) -> int:
        """Heads of a headed local parameter: the key/value ones have ``kv_heads``."""
        return self.kv_heads if local.startswith(("key.", "value.")) else self.n_heads

    def head_refs(self, h: int) -> dict[str, Ref]:
        """The units query head ``h`` reads, by local name (its key/value head for ``key.*``, ``value.*``)."""
        return {
            local: (self.name, local, h if self.count(local) == self.n_heads else h // self.group)
            for local in HEAD_AXES
        }

    # ---- forward: read from the nodes ---------------------------------------------------
    @cached_property
    def ran(self) -> tuple[Node, ...]:
        """The attention's nodes (:func:`~hessviz.ops.attention_core.chain`) whose forward values the
        dense face reads: the tape's, when it ran this attention, else :attr:`_nodes`."""
        return self._ran if self._ran is not None else self._nodes

    @cached_property
    def core(self) -> AttentionCore:
        """The core among :attr:`ran`: ``Q``, ``K``, ``V`` (each key/value head repeated for its
        readers), ``A`` and ``O``."""
        return next(n for n in self.ran if isinstance(n, AttentionCore))

    @cached_property
    def A(self) -> Tensor:
        """``(H, L, L)`` attention weights."""
        return self.core.A

    @cached_property
    def heads(self) -> list[_Head]:
        """One per query head ``h``, with the key/value head ``h // group`` it reads."""
        c, W_O = self.core, self.split.get("out.weight")
        O = c.y.unflatten(-1, (self.n_heads, -1)).transpose(0, 1)  # (H, L, d_v)
        key_bias, cap = "key.bias" in self.score_side, c.cap
        return [
            _Head(
                self.X,
                c.Q[h],
                c.K[h],
                c.V[h],
                c.A[h],
                O[h],
                None if W_O is None else W_O[h],
                self.rotary,
                key_bias,
                self.scale,
                None if cap is None else Softcap(cap.y[h], cap.d1[h], cap.d2[h]),
            )
            for h in range(self.n_heads)
        ]

    @property
    def output(self) -> Tensor:
        """``SA (L, d)``."""
        return self.ran[-1].y

    # ---- parameter units -------------------------------------------------------------
    @cached_property
    def units(self) -> tuple[Ref, ...]:
        """Every parameter unit, in θ order within the attention (input parameters first)."""
        refs: list[Ref] = list(self.input_stage.jacobians) if self.input_stage else []
        for local in LOCALS:
            if local in self.weights:
                heads = range(self.count(local)) if local in HEAD_AXES else (None,)
                refs += [(self.name, local, h) for h in heads]
        return tuple(refs)

    def _output_eye(self) -> Tensor:
        return eye(self.X.shape[1], self.X, self.X.shape[0])

    def jacobian(self, ref: Ref) -> Factored | None:
        """``∂SA_t/∂θ`` of one unit, factored, output size ``d``; ``None`` where it is zero."""
        if ref[0] != self.name:
            return self._input_jacobians[ref]
        _, local, h = ref
        L = self.X.shape[0]
        if self.qk_eps is not None:
            return self._node_jacobian(ref)
        if local == "out.bias":
            return Factored((KronTerm(LEFT, ones(L, self.X), self._output_eye()),))
        if local == "key.bias" and local not in self.score_side:
            return None
        if self.count(local) != self.n_heads:  # a key/value head: its readers
            readers = [self._head_jacobian(local, q) for q in range(h * self.group, (h + 1) * self.group)]
            return (readers[0] if len(readers) == 1 else sum(readers[1:], readers[0])).compact()
        return self._head_jacobian(local, h).compact()

    def _head_jacobian(self, local: str, h: int) -> Factored:
        """The part of ``∂SA_t/∂θ`` that passes through query head ``h``."""
        L = self.X.shape[0]
        head = self.heads[h]
        if local == "out.weight":
            return Factored((KronTerm(LEFT, head.O, self._output_eye()),))
        if local in ("value.weight", "value.bias"):
            WOt = self._output_eye() if head.W_O is None else head.W_O.T.expand(L, -1, -1)
            vec = head.A @ self.X if local == "value.weight" else ones(L, self.X)
            return Factored((KronTerm(LEFT, vec, WOt),))
        return head.score_jacobian[local].lmul(head.MtSigma)

    # ---- second derivatives ------------------------------------------------------------
    def functional(self, g: Tensor, refs: tuple[Ref, ...]) -> list[Piece]:
        """Pieces of ``Σ_t g_tᵀ ∇²SA_t`` whose two units are both in ``refs``, ``g (L, d)``."""
        wanted = set(refs)
        pieces: list[Piece] = []
        if self.qk_eps is not None:
            pieces += self._node_functional(g, [r for r in refs if r[0] == self.name])
        else:
            for h in range(self.n_heads):
                if wanted.intersection(self.head_refs(h).values()):
                    pieces += self._head_functional(h, g, wanted)
        inputs = [r for r in refs if r[0] != self.name]
        if inputs:
            pieces += self._input_functional(g, inputs, [r for r in refs if r[0] == self.name])
        return [p for p in pieces if p.a in wanted and p.b in wanted]

    def _head_functional(self, h: int, g: Tensor, wanted: set[Ref]) -> list[Piece]:
        head = self.heads[h]
        d, dk = self.X.shape[1], self.d_k
        ref = self.head_refs(h)
        gO = g if head.W_O is None else g @ head.W_O.T  # (L, d_v)
        C = softmax.contract_hessian_factored(head.A, gO @ head.V.T)  # softmax curvature, (a, w)
        gS = C.w  # ∂/∂S = Σ_t G^A_t, (L, L)
        if head.cap is not None:  # through the cap: y' on each side, y'' ⊙ ∂/∂S on the diagonal
            C = CappedCurvature(C, head.cap.d1, gS * head.cap.d2)
            gS = head.cap.adjoint(gS)  # ∂/∂S₀
        JS = head.score_jacobian
        side = [k for k in self.score_side if ref[k] in wanted and k in self.weights]
        pieces: list[Piece] = [
            Sandwich(ref[a], ref[b], JS[a], C, JS[b]) for i, a in enumerate(side) for b in side[i:]
        ]
        if self.rotary is not None:  # the bilinear score, rotated
            ones_ = ones(self.X.shape[0], self.X)
            inputs = {"query.weight": self.X, "query.bias": ones_, "key.weight": self.X, "key.bias": ones_}
            pieces += [
                Dense(
                    ref[a], ref[b], score.rotary_mixed(inputs[a], inputs[b], gS, self.rotary, dk, self.scale)
                )
                for a in side
                if a.startswith("query.")
                for b in side
                if b.startswith("key.")
            ]
        elif (
            "key.bias" in side
        ):  # capped: b_K acts, its row shift ∂S₀_tr/∂b_K = c q_t (rows of S̄₀ need not sum to 0)
            rows = gS.sum(-1)  # Σ_r ∂/∂S₀_tr
            values = {"query.weight": self.X.T @ rows, "query.bias": rows.sum()[None]}
            pieces += [
                Diagonal(
                    ref[a], ref["key.bias"], (1, 3), (self.scale * values[a])[:, None, None].expand(-1, 1, dk)
                )
                for a in side
                if a.startswith("query.")
            ]
        if self.rotary is None and "key.weight" in side:  # the bilinear score
            if "query.weight" in side:
                pieces.append(
                    Diagonal(
                        ref["query.weight"],
                        ref["key.weight"],
                        (1, 3),
                        score.contract_mixed(self.X, gS, dk, self.scale)[:, :, None].expand(d, d, dk),
                    )
                )
            if "query.bias" in side:  # the same with x_t = 1
                XgS = (gS @ self.X).sum(0) * self.scale  # (1ᵀ G^S X)/√d_k
                pieces.append(
                    Diagonal(
                        ref["query.bias"], ref["key.weight"], (1, 3), XgS[None, :, None].expand(1, d, dk)
                    )
                )
        L = self.X.shape[0]
        if ref["value.weight"] in wanted and side:  # the product A V
            XtSigma = head.through_softmax(self.X)  # (L, d, L)
            gO_eye = Factored((KronTerm(RIGHT, gO, eye(d, g, L)),))  # [i, (i', m)] = δ_ii' g^O_t[m]
            pieces += [Sandwich(ref[p], ref["value.weight"], JS[p].lmul(XtSigma), None, gO_eye) for p in side]
        if head.W_O is not None and ref["out.weight"] in wanted:  # the product O W_O
            dv = head.W_O.shape[0]
            pieces.append(
                Diagonal(
                    ref["value.weight"],
                    ref["out.weight"],
                    (1, 2),
                    ((head.A @ self.X).T @ g)[:, :, None].expand(d, d, dv),
                )
            )
            if "value.bias" in self.weights:
                pieces.append(
                    Diagonal(
                        ref["value.bias"], ref["out.weight"], (1, 2), g.sum(0)[None, :, None].expand(1, d, dv)
                    )
                )
            if side:
                VtSigma = head.through_softmax(head.V)  # (L, d_v, L)
                g_eye = Factored((KronTerm(RIGHT, g, eye(dv, g, L)),))  # [α, (α', β)] = δ_αα' g_t[β]
                pieces += [
                    Sandwich(ref[p], ref["out.weight"], JS[p].lmul(VtSigma), None, g_eye) for p in side
                ]
        return pieces

    # ---- input parameters ----------------------------------------------------------------
    @cached_property
    def _directions(self) -> dict[Ref, Tensor]:
        """Each input parameter's ``∂X/∂θ`` as directions ``(n_θ, L, d)``."""
        if self.input_stage is None:
            return {}
        return {r: J.dense().permute(2, 0, 1) for r, J in self.input_stage.jacobians.items()}

    @cached_property
    def _input_jacobians(self) -> dict[Ref, Factored]:
        """``∂SA_t/∂θ = Σ_s ∂SA_t/∂X_s ∂X_s/∂θ`` per input parameter, dense per token."""
        if not self._directions:
            return {}
        dSA = self._tangents(None, torch.cat(list(self._directions.values())))["output"]
        out, start, one = {}, 0, ones(self.X.shape[0], self.X)
        for r, D in self._directions.items():
            out[r] = Factored.per_token(dSA[start : start + len(D)].permute(1, 2, 0), one)
            start += len(D)
        return out

    def _input_functional(self, g: Tensor, inputs: list[Ref], units: list[Ref]) -> list[Piece]:
        """Second derivatives of ``Σ_t g_tᵀ SA_t`` between input parameters and anything:
        directional derivatives of the closed-form gradients along ``∂X/∂θ``."""
        D = torch.cat([self._directions[r] for r in inputs])
        tangent = self._tangents(g, D)
        pieces: list[Piece] = []
        rows, start = {}, 0
        for r in inputs:
            rows[r] = slice(start, start + len(self._directions[r]))
            start += len(self._directions[r])
        for i, a in enumerate(inputs):
            dX = tangent["input"][rows[a]]  # (n_a, L, d)
            for b in inputs[i:]:
                block = torch.einsum("nsi,msi->nm", dX, self._directions[b])
                pieces.append(Dense(a, b, block[None, :, None, :]))
            for u in units:
                if u in tangent:
                    pieces.append(Dense(a, u, tangent[u][rows[a]].unsqueeze(0)))
        pieces += self.input_stage.functional(tangent["gradient"])
        return pieces

    @cached_property
    def _nodes(self) -> tuple[Node, ...]:
        """The attention as nodes with the local parameter names (:func:`~hessviz.ops.attention_core.chain`:
        ``[Q K V]`` projection, QK-norm when there is one, the core, the output projection when there is
        one): its forward, and the node rules of :meth:`_tangents`."""
        w = self.weights

        def linear(out: str, x: str, xv: Tensor, weights: list[str], biases: list[str]) -> Node:
            return Linear(
                out, x, xv, [(k, w[k]) for k in weights], [(k, w[k]) if k in w else None for k in biases]
            )

        def qk_norm(out: str, qkv: Node) -> Node:
            norms = (("query.norm", w["query.norm"]), ("key.norm", w["key.norm"]))
            d_v = self.split["value.weight"].shape[-1]
            args = (self.n_heads, self.kv_heads, self.d_k, d_v, self.qk_eps, norms, self.name)
            return QKNorm(out, qkv.output, qkv.y, *args)

        return tuple(
            chain(
                "X",
                self.X,
                linear,
                self.n_heads,
                self.kv_heads,
                self.d_k,
                self.split["value.weight"].shape[-1],
                self.causal,
                self.rotary,
                None if self.qk_eps is None else qk_norm,
                self.out_proj,
                scale=self.scale,
                window=self.window,
                softcap=self.softcap,
            )
        )

    def _tangents(self, g: Tensor | None, D: Tensor | None, dp: dict[str, Tensor] | None = None) -> dict:
        r"""Directional derivatives along input directions ``D (n, L, d)`` and weight directions ``dp``
        (local name -> ``(n, *shape)``) by the node face's rules: ``"output"``: ``δSA (n, L, d)`` (the
        tangent sweep). With ``g (L, d)`` at ``SA`` (held fixed) also, from the adjoint at ``g`` and its
        tangent (second-order parts on): ``"gradient"``: ``∂(Σ_t g_tᵀ SA_t)/∂X (L, d)``, ``"input"``:
        its derivative ``δ∇X (n, L, d)``, and per unit the derivative of its gradient,
        ``(n, rows, cols)``. Along ``X`` alone, ``b_V``, ``b_O`` (and ``b_K`` without rotary positions
        or QK-norm) have gradients that do not depend on ``X``: left out."""
        dp = dp or {}
        weight_tangents = lambda node: [dp.get(n) for n in node.params]  # noqa: E731
        inputs, t = [], D
        for node in self._nodes:
            inputs.append(t)
            t = node.tangent([t], weight_tangents(node))
        result: dict = {"output": t}
        if g is None:
            return result
        g_x = g
        for node in reversed(self._nodes):  # first-order adjoints at g
            g_x = node.adjoint(g_x)[0][0]
        dg, whole = None, {}
        for node, t_in in zip(reversed(self._nodes), reversed(inputs)):
            dgx, dgp = node.adjoint_tangent(Along(dg, [t_in], weight_tangents(node)))
            dg = dgx[0]
            whole.update(zip(node.params, dgp))
        result |= {"gradient": g_x, "input": dg}
        along_x = ("query.weight", "query.bias", "key.weight", "value.weight", "out.weight") + tuple(
            k for k in self.score_side if k == "key.bias"
        )
        for local in LOCALS if dp or self.qk_eps is not None else along_x:
            t = whole.get(local) if local in self.weights else None
            if t is None:
                continue
            t = t.unsqueeze(-2) if t.dim() == 2 else t  # a bias (n, H w) is one row
            if local not in HEAD_AXES:
                result[(self.name, local, None)] = t
                continue
            width = t.shape[HEAD_AXES[local] - 2] // self.count(local)  # column blocks, W_O row blocks
            for h in range(self.count(local)):
                cut = slice(h * width, (h + 1) * width)
                result[(self.name, local, h)] = t[..., cut] if HEAD_AXES[local] == 1 else t[..., cut, :]
        return result

    # ---- the node-rule mode (QK-norm) ------------------------------------------------------
    def _unit_directions(self, ref: Ref) -> dict[str, Tensor]:
        """One direction per entry of the unit ``ref``: ``{local: (n, *shape)}``, the identity on the
        unit's entries inside its whole weight, zero elsewhere."""
        _, local, h = ref
        w = self.weights[local]
        whole = w.unsqueeze(0) if w.dim() == 1 else w  # a vector is one row
        if h is None:
            cut = whole
        elif HEAD_AXES[local] == 1:
            width = whole.shape[1] // self.count(local)
            cut = whole[:, h * width : (h + 1) * width]
        else:
            width = whole.shape[0] // self.count(local)
            cut = whole[h * width : (h + 1) * width]
        n = cut.numel()
        D = w.new_zeros(n, *whole.shape)
        view = (
            D[:, :, h * width : (h + 1) * width]
            if h is not None and HEAD_AXES[local] == 1
            else D[:, h * width : (h + 1) * width]
            if h is not None
            else D
        )
        view.copy_(torch.eye(n, dtype=w.dtype, device=w.device).view(n, *cut.shape))
        return {local: D.view(n, *w.shape)}

    def _unit_shape(self, ref: Ref) -> tuple[int, int]:
        w = self.weights[ref[1]]
        rows, cols = (1, w.shape[0]) if w.dim() == 1 else tuple(w.shape)
        if ref[2] is None:
            return rows, cols
        return (
            (rows, cols // self.count(ref[1]))
            if HEAD_AXES[ref[1]] == 1
            else (rows // self.count(ref[1]), cols)
        )

    def _node_jacobian(self, ref: Ref) -> Factored:
        """``∂SA_t/∂θ`` of one unit from the tangent sweep along each of its entries."""
        dSA = self._tangents(None, None, self._unit_directions(ref))["output"]  # (n, L, d)
        L, d = dSA.shape[1:]
        return Factored.from_dense(dSA.permute(1, 2, 0).reshape(L, d, *self._unit_shape(ref)))

    def _node_functional(self, g: Tensor, units: list[Ref]) -> list[Piece]:
        """Every block of ``Σ_t g_tᵀ ∇²SA_t`` between two of the attention's own ``units``: the
        derivative of each unit's gradient along the entries of another, by the adjoint tangent."""
        pieces: list[Piece] = []
        for i, a in enumerate(units):
            tangent = self._tangents(g, None, self._unit_directions(a))
            for b in units[i:]:
                if b in tangent:
                    values = tangent[b].reshape(*self._unit_shape(a), *tangent[b].shape[1:])
                    pieces.append(Dense(a, b, values))
        return pieces
