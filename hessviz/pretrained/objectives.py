r"""Real models' own objectives in the last hidden states ``Z (L, d)``: value, gradient, Hessian.

Each function returns an :class:`Objective` with the value, ``grad (L, d)`` and the Hessian in
``Z``, closed form (no autograd): token-wise ``(L, d, d)`` when the loss is a sum over tokens,
dense ``(L·d, L·d)`` in ``vec_r`` order of ``Z`` (row ``t·d + j`` is feature ``j`` of token
``t``) when it couples them. That is what ``hv.CustomLoss(grad_Z, hess_Z)`` takes.

**Sentence similarity** (all-MiniLM-L6-v2's training objective), :func:`cosine_loss`: with the
mean-pooled embedding ``m = (1/L) Σ_t Z_t``, the other sentence's embedding ``e`` fixed,
``u = m/‖m‖``, ``ê = e/‖e‖`` and ``c = uᵀê``:

.. math::
    ℓ = 1 − c,\qquad ∇_m ℓ = −\frac{ê − c\,u}{‖m‖},\qquad
    ∇^2_m ℓ = \frac{u ê^⊤ + ê u^⊤ + c\,(I − 3 u u^⊤)}{‖m‖^2},

and through the pooling ``∇_{Z_t} ℓ = ∇_m ℓ / L`` for every token, ``∇^2_Z ℓ = (1 1ᵀ ⊗ ∇^2_m ℓ) / L²``
(dense: every pair of tokens is coupled).

**Next-token loss through the LM head** (the family's final norm and its unembedding ``E (V, d)``,
tied to the token embedding or not: GPT-2's ``ln_f`` and ``wte``, Llama's RMSNorm ``norm`` and
``lm_head``, GPT-NeoX's ``final_layer_norm`` and ``embed_out``, OPT's ``final_layer_norm``),
:func:`next_token_loss`, :class:`hessviz.losses.NextToken` at ``Z``: per position ``t`` with target
``y_t``, ``n = LN(Z_t)`` (``c/σ``; RMSNorm: ``Z_t/rms``, no centring, ``β = 0``), ``h = γ ⊙ n + β``,
``s = E h``, ``p = softmax(s)``, ``r = Eᵀ(p − e_{y_t})``:

.. math::
    ℓ_t = −\log p_{y_t},\qquad ∇_{Z_t} ℓ_t = J_n (γ ⊙ r),\qquad
    ∇^2_{Z_t} ℓ_t = J_n\, \mathrm{diag}(γ)\, E^⊤(\mathrm{diag}\,p − p p^⊤) E\, \mathrm{diag}(γ)\, J_n
                   + \textstyle\sum_k (γ ⊙ r)_k ∇^2 n_k,

with the norm's ``J_n`` and ``Σ_k g_k ∇² n_k`` of :mod:`hessviz.ops.layernorm` (which computes both
LayerNorm and RMSNorm). Without a final norm (OPT with ``do_layer_norm_before = false``) ``n = Z_t``,
``J_n = I`` and the second term is 0.
Positions ``0 … L−2`` predict the next token of the text and the loss is their mean, as
``GPT2LMHeadModel(labels=ids)``; the last position has no target (its Hessian block is 0).
The ``Eᵀ diag(p) E`` term costs ``O(V d²)`` per token, built once when :attr:`Objective.hess` is first read.

**Last token only**, :func:`last_token_loss`: the same cross-entropy at the last position alone,
for a target the caller names (the token after the text); every other token's blocks are 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from hessviz.errors import InputError
from hessviz.losses import CustomLoss, LMHead, Loss, NextToken
from hessviz.losses.next_token import check_Z


@dataclass(frozen=True)
class Objective(Loss):
    """A loss at ``Z``, built there: its value, ``grad (L, d)`` and Hessian (token-wise or dense).

    :meth:`product` applies the Hessian, ``Ż (k, L, d) ↦ N Ż (k, L, d)``, without forming it (the
    dense Hessian of a pooled loss is ``(L·d)²``: 1.2 GB at 32 tokens of MiniLM); ``hess`` is
    built on first use. :meth:`custom_loss` is what ``hv.hessian(…, loss=…)`` takes.
    """

    name: str
    value: Tensor
    grad: Tensor
    build: Callable[[], Tensor] = field(repr=False)
    apply: Callable[[Tensor], Tensor] = field(repr=False)
    token_wise: bool = True

    @cached_property
    def hess(self) -> Tensor:
        """``(L, d, d)`` token-wise, or ``(L·d, L·d)`` dense in ``vec_r`` order."""
        return self.build()

    def at(self, Z: Tensor) -> Objective:
        """Built at its point: itself."""
        return self

    def token_curvature(self) -> Tensor:
        if not self.token_wise:
            raise ValueError(f"the {self.name} objective couples tokens: it has no (L, d, d) form")
        return self.hess

    def product(self, dZ: Tensor) -> Tensor:
        return self.apply(dZ)

    def dense_hessian(self) -> Tensor:
        """``(L·d, L·d)``: the token-wise blocks put on the diagonal, or the dense Hessian as is."""
        return torch.block_diag(*self.hess) if self.token_wise else self.hess

    def custom_loss(self, blocks: bool = True) -> CustomLoss:
        """``hv.CustomLoss``: token-wise blocks as a tensor, a coupling Hessian as its product.
        ``blocks=False`` hands over the product even where blocks exist: a gradient needs no
        curvature, and a few product columns through a large head (``O(L V d)`` each) cost less than
        building the blocks (``O(L V d²)``, SmolLM2's 49,152 × 576² per token)."""
        return CustomLoss(self.grad, self.hess if self.token_wise and blocks else self.product)


def mean_pooled(Z: Tensor) -> Tensor:
    """``(d,)``: the sentence embedding of sentence-transformers' mean pooling (no padding)."""
    return check_Z(Z).mean(0)


def cosine_loss(Z: Tensor, other: Tensor) -> Objective:
    """``1 − cos(mean_pooled(Z), other)``; ``other (d,)`` is the fixed embedding of the other sentence."""
    Z = check_Z(Z)
    L, d = Z.shape
    if not isinstance(other, Tensor) or other.shape != (d,) or not bool(other.norm() > 0):
        raise InputError(f"other must be a non-zero ({d},) embedding, got {getattr(other, 'shape', other)}")
    m = Z.mean(0)
    r = m.norm()
    if not bool(r > 0):
        raise InputError("Z's mean-pooled embedding is zero: the cosine is not differentiable there")
    u, e = m / r, (other / other.norm()).to(Z)
    c = u @ e
    grad_m = -(e - c * u) / r
    hess_m = (
        torch.outer(u, e)
        + torch.outer(e, u)
        + c * (torch.eye(d, dtype=Z.dtype, device=Z.device) - 3.0 * torch.outer(u, u))
    ) / r**2

    def build() -> Tensor:
        return torch.kron(torch.ones(L, L, dtype=Z.dtype, device=Z.device), hess_m) / L**2

    def product(V: Tensor) -> Tensor:  # (k, L, d): every token gets H_m Σ_t V_t / L²
        return (V.sum(1) @ hess_m / L**2).unsqueeze(1).expand_as(V)

    return Objective("cosine", 1.0 - c, grad_m.expand(L, d) / L, build, product, token_wise=False)


def _token_wise(name: str, loss: NextToken) -> Objective:
    """``loss`` with its ``(L, d, d)`` blocks handed over (built on first use), whatever its width."""
    return Objective(name, loss.value, loss.grad, loss.token_curvature, loss.product)


def next_token_loss(Z: Tensor, ids: Sequence[int] | Tensor, head: LMHead) -> Objective:
    """Mean cross-entropy of positions ``0 … L−2`` predicting ``ids[1:]`` (``ids``: the text's ``L`` ids)."""
    return _token_wise("next-token", NextToken(Z, ids, head))


def last_token_loss(Z: Tensor, target: int, head: LMHead) -> Objective:
    """Cross-entropy of the last position predicting ``target``: ``−log p_L(target)``."""
    return _token_wise("last-token", NextToken.last_token(Z, target, head))


def lm_head(source: str | os.PathLike, dtype: torch.dtype = torch.float64) -> LMHead:
    """The next-token head of the decoder checkpoint ``source``: its final norm (LayerNorm or
    RMSNorm, ``None`` where it has none) and its unembedding (the token embedding when tied);
    :class:`~hessviz.errors.CheckpointError` for an encoder (BERT), whose head is not read."""
    from hessviz.pretrained.load import _open

    fam = _open(source)
    h, shapes = fam.head(), fam.head_shapes()
    fam.ckpt.require(shapes)
    w = fam.ckpt.read(list(shapes), dtype)
    return LMHead(
        None if h.gamma is None else w[h.gamma] + h.shift,
        None if h.beta is None else w[h.beta],
        fam.block.ln_eps,
        w[h.unembedding],
        h.norm_type,
        softcap=h.softcap,
    )


def sentence_embedding(source: str | os.PathLike, text: str, dtype: torch.dtype = torch.float64) -> Tensor:
    """``(d,)``: the mean-pooled last hidden state of ``text`` (the other sentence of :func:`cosine_loss`)."""
    from hessviz.pretrained.load import hidden_states

    return mean_pooled(hidden_states(source, text, dtype=dtype)[-1])
