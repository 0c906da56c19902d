r"""Multi-head self-attention with optional biases, output projection and causal mask.

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
derivatives, along ``∂X/∂θ``, of the closed-form gradients above (:meth:`_tangents`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from hessviz.chain import Stage
from hessviz.components import score, softmax
from hessviz.components.base import eye, ones
from hessviz.contributions import Dense, Diagonal, Piece, Ref, Sandwich
from hessviz.kron import LEFT, RIGHT, Factored, KronTerm

HEAD_AXES = {"query.weight": 1, "query.bias": 1, "key.weight": 1, "key.bias": 1,
             "value.weight": 1, "value.bias": 1, "out.weight": 0}
"""The headed local parameters and where their heads lie: ``1`` column blocks, ``0`` row blocks."""

LOCALS = ("query.weight", "query.bias", "key.weight", "key.bias", "value.weight", "value.bias",
          "out.weight", "out.bias")
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
    W_O: Tensor | None

    @cached_property
    def O(self) -> Tensor:  # noqa: E743 (the papers' name for the head output A V)
        return self.A @ self.V

    @cached_property
    def M(self) -> Tensor:
        """``V W_O``: the values in the output space, ``(L, d)``."""
        return self.V if self.W_O is None else self.V @ self.W_O

    def through_softmax(self, M: Tensor) -> Tensor:
        """``Mᵀ Σ_t`` per token for ``M (L, n)``: ``(L, n, L)``."""
        L = self.A.shape[0]
        return softmax.apply_jacobian(self.A, M.expand(L, L, M.shape[-1])).transpose(-1, -2)

    @cached_property
    def MtSigma(self) -> Tensor:
        return self.through_softmax(self.M)

    @cached_property
    def score_jacobian(self) -> dict[str, Factored]:
        """``∂S_t/∂θ`` for the score-side parameters, output size ``L`` per token."""
        return score.jacobian(self.X, self.Q, self.K)


class MultiHeadAttention:
    """Forward values of the attention on ``X (L, d)`` and its derivatives.

    ``weights``: local name -> tensor (biases and ``out.weight`` optional); ``input_stage``:
    the token-wise map that produced ``X`` from a weight-free input, when it has parameters.
    """

    def __init__(self, X: Tensor, weights: dict[str, Tensor], n_heads: int, *, causal: bool = False,
                 name: str = "attention", input_stage: Stage | None = None):
        self.X, self.weights, self.n_heads, self.causal, self.name = X, weights, n_heads, causal, name
        self.input_stage = input_stage
        self.out_proj = "out.weight" in weights
        self.split = {k: split_heads(k, w, n_heads) for k, w in weights.items() if k in HEAD_AXES}
        self.d_k = self.split["query.weight"].shape[-1]
        self.scale = 1.0 / math.sqrt(self.d_k)

    # ---- forward ---------------------------------------------------------------------
    def _project(self, kind: str) -> Tensor:
        """``X W + b`` for every head, ``(H, L, width)``."""
        out = self.X @ self.split[f"{kind}.weight"]
        bias = self.split.get(f"{kind}.bias")
        return out if bias is None else out + bias

    @cached_property
    def A(self) -> Tensor:
        """``(H, L, L)`` attention weights."""
        S = (self._project("query") @ self._project("key").transpose(-1, -2)) * self.scale
        return softmax.value(S, self.causal)

    @cached_property
    def heads(self) -> list[_Head]:
        Q, K, V = self._project("query"), self._project("key"), self._project("value")
        W_O = self.split.get("out.weight")
        return [_Head(self.X, Q[h], K[h], V[h], self.A[h], None if W_O is None else W_O[h])
                for h in range(self.n_heads)]

    @cached_property
    def output(self) -> Tensor:
        """``SA (L, d)``."""
        if not self.out_proj:
            return self.heads[0].O
        out = sum(head.O @ head.W_O for head in self.heads)
        bias = self.weights.get("out.bias")
        return out if bias is None else out + bias

    # ---- parameter units -------------------------------------------------------------
    @cached_property
    def units(self) -> tuple[Ref, ...]:
        """Every parameter unit, in θ order within the attention (input parameters first)."""
        refs: list[Ref] = list(self.input_stage.jacobians) if self.input_stage else []
        for local in LOCALS:
            if local in self.weights:
                heads = range(self.n_heads) if local in HEAD_AXES else (None,)
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
        if local == "out.bias":
            return Factored((KronTerm(LEFT, ones(L, self.X), self._output_eye()),))
        if local == "key.bias":
            return None
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
        for h in sorted({r[2] for r in refs if r[0] == self.name and r[2] is not None}):
            pieces += self._head_functional(h, g, wanted)
        inputs = [r for r in refs if r[0] != self.name]
        if inputs:
            pieces += self._input_functional(g, inputs, [r for r in refs if r[0] == self.name])
        return [p for p in pieces if p.a in wanted and p.b in wanted]

    def _head_functional(self, h: int, g: Tensor, wanted: set[Ref]) -> list[Piece]:
        head, name = self.heads[h], self.name
        d, dk = self.X.shape[1], self.d_k
        ref = {local: (name, local, h) for local in HEAD_AXES}
        gO = g if head.W_O is None else g @ head.W_O.T                 # (L, d_v)
        C = softmax.contract_hessian_factored(head.A, gO @ head.V.T)   # softmax curvature, (a, w)
        gS = C.w                                                       # ∂/∂S = Σ_t G^A_t, (L, L)
        JS = head.score_jacobian
        side = [k for k in SCORE_SIDE if ref[k] in wanted and k in self.weights]
        pieces: list[Piece] = [Sandwich(ref[a], ref[b], JS[a], C, JS[b])
                               for i, a in enumerate(side) for b in side[i:]]
        if "key.weight" in side:                                      # the bilinear score
            if "query.weight" in side:
                pieces.append(Diagonal(ref["query.weight"], ref["key.weight"], (1, 3),
                                       score.contract_mixed(self.X, gS, dk)[:, :, None].expand(d, d, dk)))
            if "query.bias" in side:                                   # the same with x_t = 1
                XgS = (gS @ self.X).sum(0) * self.scale                # (1ᵀ G^S X)/√d_k
                pieces.append(Diagonal(ref["query.bias"], ref["key.weight"], (1, 3),
                                       XgS[None, :, None].expand(1, d, dk)))
        L = self.X.shape[0]
        if ref["value.weight"] in wanted and side:                    # the product A V
            XtSigma = head.through_softmax(self.X)                     # (L, d, L)
            gO_eye = Factored((KronTerm(RIGHT, gO, eye(d, g, L)),))    # [i, (i', m)] = δ_ii' g^O_t[m]
            pieces += [Sandwich(ref[p], ref["value.weight"], JS[p].lmul(XtSigma), None, gO_eye)
                       for p in side]
        if head.W_O is not None and ref["out.weight"] in wanted:       # the product O W_O
            dv = head.W_O.shape[0]
            pieces.append(Diagonal(ref["value.weight"], ref["out.weight"], (1, 2),
                                   ((head.A @ self.X).T @ g)[:, :, None].expand(d, d, dv)))
            if "value.bias" in self.weights:
                pieces.append(Diagonal(ref["value.bias"], ref["out.weight"], (1, 2),
                                       g.sum(0)[None, :, None].expand(1, d, dv)))
            if side:
                VtSigma = head.through_softmax(head.V)                 # (L, d_v, L)
                g_eye = Factored((KronTerm(RIGHT, g, eye(dv, g, L)),))  # [α, (α', β)] = δ_αα' g_t[β]
                pieces += [Sandwich(ref[p], ref["out.weight"], JS[p].lmul(VtSigma), None, g_eye)
                           for p in side]
        return pieces

    def input_gradient(self, g: Tensor) -> Tensor:
        """``∂(Σ_t g_tᵀ SA_t)/∂X``, ``(L, d)``: ``Σ_h (G^S K W_Qᵀ + G^{S⊤} Q W_Kᵀ)/√d_k + Aᵀ g^O W_Vᵀ``."""
        total = 0
        WQ, WK, WV = self.split["query.weight"], self.split["key.weight"], self.split["value.weight"]
        for h, head in enumerate(self.heads):
            gO = g if head.W_O is None else g @ head.W_O.T
            gS = softmax.vjp(head.A, gO @ head.V.T) * self.scale
            total = total + (gS @ head.K) @ WQ[h].T + (gS.T @ head.Q) @ WK[h].T + (head.A.T @ gO) @ WV[h].T
        return total

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
            out[r] = Factored.per_token(dSA[start:start + len(D)].permute(1, 2, 0), one)
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
            dX = tangent["input"][rows[a]]                              # (n_a, L, d)
            for b in inputs[i:]:
                block = torch.einsum("nsi,msi->nm", dX, self._directions[b])
                pieces.append(Dense(a, b, block[None, :, None, :]))
            for u in units:
                if u in tangent:
                    pieces.append(Dense(a, u, tangent[u][rows[a]].unsqueeze(0)))
        pieces += self.input_stage.functional(self.input_gradient(g))
        return pieces

    def _tangents(self, g: Tensor | None, D: Tensor) -> dict:
        r"""Directional derivatives along input directions ``D (n, L, d)``, per head:
        ``δQ = D W_Q``, ``δK``, ``δV`` alike, ``δS = (δQ Kᵀ + Q δKᵀ)/√d_k``,
        ``δA = a ⊙ (δS − aᵀδS)``, ``δO = δA V + A δV``; ``"output"``: ``δSA (n, L, d)``.

        With ``g`` (held fixed) also the derivatives of the closed-form gradients:
        ``δG^A = g^O δVᵀ``, ``δG^S = δA ⊙ (G^A − aᵀG^A) + A ⊙ (δG^A − (δA⊙G^A + A⊙δG^A)1)``,
        then ``δ∇W_Q = (Dᵀ G^S K + Xᵀ δG^S K + Xᵀ G^S δK)/√d_k`` and the like for every
        unit (``b_K``, ``b_V``, ``b_O`` have constant gradients), and ``"input"``: ``δ∇X``.
        """
        s, X, name = self.scale, self.X, self.name
        WQ, WK, WV = self.split["query.weight"], self.split["key.weight"], self.split["value.weight"]
        out: dict = {"output": 0, "input": 0}
        Dt = D.transpose(-1, -2)
        for h, head in enumerate(self.heads):
            A, Q, K, V = head.A, head.Q, head.K, head.V
            dQ, dK, dV = D @ WQ[h], D @ WK[h], D @ WV[h]
            dA = softmax.vjp(A, (dQ @ K.T + Q @ dK.transpose(-1, -2)) * s)
            dO = dA @ V + A @ dV
            out["output"] = out["output"] + (dO if head.W_O is None else dO @ head.W_O)
            if g is None:
                continue
            gO = g if head.W_O is None else g @ head.W_O.T
            gA, dgA = gO @ V.T, gO @ dV.transpose(-1, -2)
            r = (A * gA).sum(-1, keepdim=True)
            gS = A * (gA - r)
            dgS = dA * (gA - r) + A * (dgA - (dA * gA + A * dgA).sum(-1, keepdim=True))
            dgS_K, gS_dK = dgS @ K, gS @ dK                            # δ(G^S K) = both
            dgSt_Q, gSt_dQ = dgS.transpose(-1, -2) @ Q, gS.T @ dQ
            grads = {
                "query.weight": s * (Dt @ (gS @ K) + X.T @ (dgS_K + gS_dK)),
                "query.bias": s * (dgS_K + gS_dK).sum(-2, keepdim=True),
                "key.weight": s * (Dt @ (gS.T @ Q) + X.T @ (dgSt_Q + gSt_dQ)),
                "value.weight": (dA @ X + A @ D).transpose(-1, -2) @ gO,
                "out.weight": dO.transpose(-1, -2) @ g,
            }
            out |= {(name, k, h): v for k, v in grads.items() if k in self.weights}
            out["input"] = (out["input"] + s * ((dgS_K + gS_dK) @ WQ[h].T + (dgSt_Q + gSt_dQ) @ WK[h].T)
                            + (dA.transpose(-1, -2) @ gO) @ WV[h].T)
        return out
