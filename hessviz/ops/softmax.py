r"""Row softmax ``a = softmax(s)`` over the last dimension.

.. math::
    J = \operatorname{diag}(a) - a a^\top, \qquad
    Q(g) = \operatorname{diag}(w) - w a^\top - a w^\top,\quad w = a \odot (g - a^\top g).

``w = J^\top g`` is also the vector-Jacobian product. For a whole attention matrix
``Q(g)`` is ``(L, L, L)``; :class:`ContractedHessian` keeps it as ``(a, w)`` and forms
only the small products ``Mᵀ Q(g) M'`` the chain rule needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def mask(
    L: int, causal: bool, window: int | None = None, device: torch.device | None = None
) -> Tensor | None:
    """The entries ``(t, s)`` of an ``(L, L)`` score matrix that row ``t`` does not see (``True``), or
    ``None`` when it sees every column: with ``causal`` the future ``s > t``, with a ``window`` also
    ``s ≤ t − window`` (token ``t`` attends to ``t − window < s ≤ t``)."""
    if not causal:
        if window is not None:
            raise ValueError(f"a window ({window}) needs the causal mask: t − window < s ≤ t")
        return None
    hidden = torch.ones(L, L, dtype=torch.bool, device=device).triu(1)
    if window is not None and window < L:
        hidden |= torch.ones(L, L, dtype=torch.bool, device=device).tril(-window)
    return hidden


def value(s: Tensor, causal: bool = False, window: int | None = None) -> Tensor:
    """``(..., n) -> (..., n)``, row by row. With ``causal`` the scores are ``(..., L, L)`` and
    row ``t`` sees columns ``s ≤ t`` only, with a ``window`` ``t − window < s ≤ t`` (the rest are
    ``−∞`` before the softmax, :func:`mask`). Masked entries have ``a = 0``, so every derivative
    rule below is zero there: the mask needs no rule of its own."""
    hidden = mask(s.shape[-1], causal, window, s.device)
    if hidden is not None:
        s = s.masked_fill(hidden, float("-inf"))
    return torch.softmax(s, dim=-1)


def jacobian(a: Tensor) -> Tensor:
    """``(..., n) -> (..., n, n)``: ``diag(a) - a aᵀ`` from the softmax output ``a``."""
    return torch.diag_embed(a) - a.unsqueeze(-1) * a.unsqueeze(-2)


def apply_jacobian(a: Tensor, M: Tensor) -> Tensor:
    """``J M`` for ``a (..., n)`` and ``M (..., n, k)`` -> ``(..., n, k)`` without forming ``J``."""
    return a.unsqueeze(-1) * (M - (a.unsqueeze(-2) @ M))


def vjp(a: Tensor, g: Tensor) -> Tensor:
    """``Jᵀ g = a ⊙ (g - aᵀg)``: ``(..., n), (..., n) -> (..., n)``. ``J`` is symmetric, so this is
    also the JVP ``J ṡ``."""
    return vjp_centered(a, g)[0]


def vjp_fused(a: Tensor, g: Tensor) -> Tensor:
    """:func:`vjp` as ``a ⊙ g − a ⊙ rowsum(a ⊙ g)``, in place on one fresh tensor (one pass fewer
    over ``(…, L, L)`` than :func:`vjp_centered`; the products' tangents use it)."""
    t = a * g
    return t.addcmul_(a, t.sum(-1, keepdim=True), value=-1.0)


def vjp_centered(a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """``(Jᵀ g, g − aᵀg)``: the VJP and the centred ``g`` it is made of (the adjoint tangent reuses it)."""
    centered = g - (a * g).sum(-1, keepdim=True)
    return a * centered, centered


def contract_hessian(a: Tensor, g: Tensor) -> Tensor:
    """``Σ_i g_i ∇² a_i``: ``(..., n), (..., n) -> (..., n, n)``."""
    return contract_hessian_factored(a, g).dense()


@dataclass(frozen=True)
class ContractedHessian:
    """``Q(g) = diag(w) - w aᵀ - a wᵀ`` per row, kept factored: ``a, w (..., n)``."""

    a: Tensor
    w: Tensor

    symmetric = True

    def dense(self) -> Tensor:
        """``(..., n, n)``."""
        outer = self.w.unsqueeze(-1) * self.a.unsqueeze(-2)
        return torch.diag_embed(self.w) - outer - outer.transpose(-1, -2)

    def sandwich(self, Ma: Tensor, Mb: Tensor) -> Tensor:
        """``Maᵀ Q(g) Mb`` for ``Ma (..., n, p)``, ``Mb (..., n, q)`` -> ``(..., p, q)``,
        in ``O(n p q)`` per row instead of ``O(n² q)``:
        ``Maᵀ diag(w) Mb − (Maᵀw)(Mbᵀa)ᵀ − (Maᵀa)(Mbᵀw)ᵀ``."""
        Maw = (Ma * self.w.unsqueeze(-1)).sum(-2)
        Maa = (Ma * self.a.unsqueeze(-1)).sum(-2)
        Mbw = (Mb * self.w.unsqueeze(-1)).sum(-2)
        Mba = (Mb * self.a.unsqueeze(-1)).sum(-2)
        diag = Ma.transpose(-1, -2) @ (self.w.unsqueeze(-1) * Mb)
        return diag - Maw.unsqueeze(-1) * Mba.unsqueeze(-2) - Maa.unsqueeze(-1) * Mbw.unsqueeze(-2)

    def gram(self, Ma: Tensor, Mb: Tensor) -> list[tuple[Tensor, Tensor]]:
        """``Σ_t Ma_tᵀ Q_t(g) Mb_t = Σ_k A_kᵀ B_k`` for ``Ma (L, n, p)``, ``Mb (L, n, q)`` (rows
        ``a, w (L, n)``): ``A = Ma`` and ``B = w ⊙ Mb`` over the ``L·n`` (token, entry) pairs, then
        ``−(Maᵀw)ᵀ(Mbᵀa)`` and ``−(Maᵀa)ᵀ(Mbᵀw)`` over the ``L`` tokens."""
        w, a = self.w.unsqueeze(-1), self.a.unsqueeze(-1)
        return [
            (Ma.flatten(0, 1), (w * Mb).flatten(0, 1)),
            (-(Ma * w).sum(-2), (Mb * a).sum(-2)),
            (-(Ma * a).sum(-2), (Mb * w).sum(-2)),
        ]


def contract_hessian_factored(a: Tensor, g: Tensor) -> ContractedHessian:
    """:func:`contract_hessian` without forming it."""
    return ContractedHessian(a, vjp(a, g))
