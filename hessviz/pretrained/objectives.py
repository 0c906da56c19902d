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

**Next-token loss through the LM head** (GPT-2: the final LayerNorm ``ln_f`` and the tied
embedding ``E (V, d)``), :func:`next_token_loss`: per position ``t`` with target ``y_t``,
``n = LN(Z_t)`` (``c/σ``), ``h = γ ⊙ n + β``, ``s = E h``, ``p = softmax(s)``, ``r = Eᵀ(p − e_{y_t})``:

.. math::
    ℓ_t = −\log p_{y_t},\qquad ∇_{Z_t} ℓ_t = J_n (γ ⊙ r),\qquad
    ∇^2_{Z_t} ℓ_t = J_n\, \mathrm{diag}(γ)\, E^⊤(\mathrm{diag}\,p − p p^⊤) E\, \mathrm{diag}(γ)\, J_n
                   + \textstyle\sum_k (γ ⊙ r)_k ∇^2 n_k,

with the LayerNorm's ``J_n`` and ``Σ_k g_k ∇² n_k`` of :mod:`hessviz.ops.layernorm`.
Positions ``0 … L−2`` predict the next token of the text and the loss is their mean, as
``GPT2LMHeadModel(labels=ids)``; the last position has no target (its Hessian block is 0).
The ``Eᵀ diag(p) E`` term costs ``O(V d²)`` per token.

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

from hessviz.custom_loss import CustomLoss
from hessviz.errors import ConfigError, InputError
from hessviz.ops import layernorm


@dataclass(frozen=True)
class Objective:
    """A loss at ``Z``: its value, ``grad (L, d)`` and Hessian (token-wise or dense).

    ``product`` applies the Hessian, ``Ż (k, L, d) ↦ N Ż (k, L, d)``, without forming it (the
    dense Hessian of a pooled loss is ``(L·d)²``: 1.2 GB at 32 tokens of MiniLM); ``hess`` is
    built on first use. :meth:`custom_loss` is what ``hv.hessian(…, loss=…)`` takes.
    """

    name: str
    value: Tensor
    grad: Tensor
    build: Callable[[], Tensor] = field(repr=False)
    product: Callable[[Tensor], Tensor] = field(repr=False)
    token_wise: bool = True

    @cached_property
    def hess(self) -> Tensor:
        """``(L, d, d)`` token-wise, or ``(L·d, L·d)`` dense in ``vec_r`` order."""
        return self.build()

    def dense_hessian(self) -> Tensor:
        """``(L·d, L·d)``: the token-wise blocks put on the diagonal, or the dense Hessian as is."""
        return torch.block_diag(*self.hess) if self.token_wise else self.hess

    def custom_loss(self) -> CustomLoss:
        """``hv.CustomLoss``: token-wise blocks as a tensor, a coupling Hessian as its product."""
        return CustomLoss(self.grad, self.hess if self.token_wise else self.product)


def _token_wise(name: str, value: Tensor, grad: Tensor, hess: Tensor) -> Objective:
    return Objective(name, value, grad, lambda: hess, lambda V: torch.einsum("tij,ktj->kti", hess, V))


@dataclass(frozen=True)
class LMHead:
    """GPT-2's output head: ``logits = (γ ⊙ LN(z) + β) Eᵀ`` with ``E`` the token embedding."""

    gamma: Tensor
    beta: Tensor
    eps: float
    embedding: Tensor
    """``(V, d)``."""


def _check_Z(Z: Tensor) -> Tensor:
    if not isinstance(Z, Tensor) or Z.dim() != 2 or Z.shape[0] < 1 or not Z.is_floating_point():
        raise InputError(f"Z must be a floating (L, d) tensor, got {getattr(Z, 'shape', type(Z).__name__)}")
    return Z


def mean_pooled(Z: Tensor) -> Tensor:
    """``(d,)``: the sentence embedding of sentence-transformers' mean pooling (no padding)."""
    return _check_Z(Z).mean(0)


def cosine_loss(Z: Tensor, other: Tensor) -> Objective:
    """``1 − cos(mean_pooled(Z), other)``; ``other (d,)`` is the fixed embedding of the other sentence."""
    Z = _check_Z(Z)
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
    hess_m = (torch.outer(u, e) + torch.outer(e, u) + c * (torch.eye(d, dtype=Z.dtype, device=Z.device)
                                                           - 3.0 * torch.outer(u, u))) / r**2

    def build() -> Tensor:
        return torch.kron(torch.ones(L, L, dtype=Z.dtype, device=Z.device), hess_m) / L**2

    def product(V: Tensor) -> Tensor:                      # (k, L, d): every token gets H_m Σ_t V_t / L²
        return (V.sum(1) @ hess_m / L**2).unsqueeze(1).expand_as(V)

    return Objective("cosine", 1.0 - c, grad_m.expand(L, d) / L, build, product, token_wise=False)


def _check_head(head: LMHead, d: int) -> LMHead:
    if not isinstance(head, LMHead) or head.embedding.dim() != 2 or head.embedding.shape[1] != d:
        raise InputError(f"head must be an LMHead whose embedding is (V, {d})")
    return head


def _cross_entropy(Z: Tensor, targets: Tensor, weights: Tensor,
                   head: LMHead) -> tuple[Tensor, Tensor, Tensor]:
    """``Σ_t w_t ℓ_t`` and its token-wise gradient and Hessian, for the LM head's cross-entropy."""
    E = head.embedding.to(Z)
    gamma, beta = head.gamma.to(Z), head.beta.to(Z)
    n, st = layernorm.value(Z, head.eps, where="ln_f input")
    s = (gamma * n + beta) @ E.T                                           # (L, V)
    logp = torch.log_softmax(s, -1)
    p = logp.exp()
    value = -(weights * logp.gather(1, targets[:, None]).squeeze(1)).sum()
    r = p @ E - E[targets]                                                 # Eᵀ(p − e_y), (L, d)
    g = weights[:, None] * gamma * r                                       # ∂ℓ/∂n
    J = layernorm.jacobian(st)                                             # (L, d, d), symmetric
    grad = layernorm.vjp(st, g)
    EpE = torch.einsum("tv,vi,vj->tij", p, E, E) - (p @ E).unsqueeze(-1) * (p @ E).unsqueeze(-2)
    G = gamma.unsqueeze(-1) * EpE * gamma                                  # diag(γ) Eᵀ(diag p − ppᵀ)E diag(γ)
    hess = weights[:, None, None] * (J @ G @ J) + layernorm.contract_hessian(st, g)
    return value, grad, hess


def _targets(ids: Sequence[int] | Tensor, vocab: int, device: torch.device) -> Tensor:
    t = torch.as_tensor(ids, dtype=torch.int64, device=device)
    if t.dim() != 1 or bool(((t < 0) | (t >= vocab)).any()):
        raise InputError(f"token ids must be a sequence of integers in [0, {vocab - 1}]")
    return t


def next_token_loss(Z: Tensor, ids: Sequence[int] | Tensor, head: LMHead) -> Objective:
    """Mean cross-entropy of positions ``0 … L−2`` predicting ``ids[1:]`` (``ids``: the text's ``L`` ids)."""
    Z = _check_Z(Z)
    L, d = Z.shape
    head = _check_head(head, d)
    t = _targets(ids, head.embedding.shape[0], Z.device)
    if t.numel() != L or L < 2:
        raise InputError(f"ids must be the text's {L} token ids (at least 2), got {t.numel()}")
    targets = torch.cat([t[1:], t[:1]])                                    # the last one is unused
    weights = torch.full((L,), 1.0 / (L - 1), dtype=Z.dtype, device=Z.device)
    weights[-1] = 0.0
    return _token_wise("next-token", *_cross_entropy(Z, targets, weights, head))


def last_token_loss(Z: Tensor, target: int, head: LMHead) -> Objective:
    """Cross-entropy of the last position predicting ``target``: ``−log p_L(target)``."""
    Z = _check_Z(Z)
    L, d = Z.shape
    head = _check_head(head, d)
    t = _targets([target], head.embedding.shape[0], Z.device)
    weights = torch.zeros(L, dtype=Z.dtype, device=Z.device)
    weights[-1] = 1.0
    return _token_wise("last-token", *_cross_entropy(Z, t.expand(L), weights, head))


def lm_head(source: str | os.PathLike, dtype: torch.dtype = torch.float64) -> LMHead:
    """GPT-2's head of the checkpoint ``source``: ``ln_f`` and the (tied) token embedding ``wte``."""
    from hessviz.pretrained.families import GPT2
    from hessviz.pretrained.load import _open

    fam = _open(source)
    if not isinstance(fam, GPT2):
        raise ConfigError(f"source {fam.ckpt.name!r} is a {fam.title} model: the next-token head "
                          "(ln_f and the tied embedding) is read from GPT-2-family checkpoints")
    d, p = fam.block.d_model, fam.prefix
    keys = {f"{p}ln_f.weight": (d,), f"{p}ln_f.bias": (d,), f"{p}wte.weight": (fam.vocab_size, d)}
    fam.ckpt.require(keys)
    w = fam.ckpt.read(list(keys), dtype)
    return LMHead(w[f"{p}ln_f.weight"], w[f"{p}ln_f.bias"], fam.block.ln_eps, w[f"{p}wte.weight"])


def sentence_embedding(source: str | os.PathLike, text: str, dtype: torch.dtype = torch.float64) -> Tensor:
    """``(d,)``: the mean-pooled last hidden state of ``text`` (the other sentence of :func:`cosine_loss`)."""
    from hessviz.pretrained.load import hidden_states

    return mean_pooled(hidden_states(source, text, dtype=dtype)[-1])
