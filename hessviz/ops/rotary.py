r"""Rotary positions (RoPE) in Hugging Face's ``rotate_half`` layout: a fixed orthogonal map per position.

For one head's query or key row ``u (d_k)`` at position ``t`` (from 0), with ``r`` the rotary width,
``ω_i = θ^{−2i/r}`` (``i < r/2``), ``c_t = [cos tω, cos tω, 1…]`` and ``s_t = [sin tω, sin tω, 0…]``
(the last ``d_k − r`` features are left alone):

.. math::
    \operatorname{rot}_t(u) = u ⊙ c_t + \operatorname{rh}(u) ⊙ s_t, \qquad
    \operatorname{rh}(a) = [−a_{r/2:r},\ a_{:r/2},\ 0…],

so ``rot_t(u) = u P_t`` with ``P_t = diag(c_t) + R diag(s_t)`` orthogonal (``R`` the matrix of
``rh``, ``Rᵀ = −R`` on the rotated features). Its transpose is
``rot_tᵀ(v) = v P_tᵀ = v ⊙ c_t − rh(v ⊙ s_t)``.

Because the map is linear and fixed, the score ``S_tr = rot_t(q_t)·rot_r(k_r)/√d_k = q_t P_t P_rᵀ
k_rᵀ/√d_k`` stays bilinear in ``(q, k)``: the node face applies ``rot`` to the primal and tangent
``Q, K`` and ``rotᵀ`` to their adjoints; the dense face folds ``P_t`` into the score's factors.
For the key side of the dense face it writes ``P_r`` as a short sum over the frequencies
(:attr:`Rotary.basis`), ``P_r = Σ_k φ_k(r) B_k`` with fixed ``B_k (d_k, d_k)`` and ``φ_k(r)`` one of
``1`` (the features left alone), ``cos(r ω_i)``, ``sin(r ω_i)``: each ``B_k`` gives one Kronecker term.
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor


def tables(L: int, d_k: int, r: int, theta: float, like: Tensor) -> tuple[Tensor, Tensor]:
    """``(c, s)``, each ``(L, d_k)``: the cosines and sines of every position (1 and 0 beyond ``r``)."""
    i = torch.arange(r // 2, dtype=torch.float64, device=like.device)
    omega = theta ** (-2.0 * i / r)
    angle = torch.arange(L, dtype=torch.float64, device=like.device)[:, None] * omega  # (L, r/2)
    c = torch.ones(L, d_k, dtype=torch.float64, device=like.device)
    s = torch.zeros(L, d_k, dtype=torch.float64, device=like.device)
    c[:, :r] = torch.cat([angle.cos(), angle.cos()], -1)
    s[:, :r] = torch.cat([angle.sin(), angle.sin()], -1)
    return c.to(like.dtype), s.to(like.dtype)


def rotate_half(a: Tensor, r: int) -> Tensor:
    """``rh(a) = [−a[r/2:r], a[:r/2], 0…]`` over the last dimension (``d_k``)."""
    h = r // 2
    out = torch.zeros_like(a)
    out[..., :h] = -a[..., h:r]
    out[..., h:r] = a[..., :h]
    return out


class Rotary:
    """The rotations of ``L`` positions for heads of width ``d_k``, rotating the first ``r`` features."""

    def __init__(self, L: int, d_k: int, r: int, theta: float, like: Tensor):
        self.r, self.d_k, self.theta = r, d_k, theta
        self.c, self.s = tables(L, d_k, r, theta, like)

    @cached_property
    def _halves(self) -> tuple[Tensor, Tensor]:
        """``(−s[:, :r/2], s[:, r/2:r])``: the sines that multiply each half of ``rh``."""
        h = self.r // 2
        return -self.s[:, :h], self.s[:, h : self.r]

    def apply(self, u: Tensor) -> Tensor:
        """``rot_t(u_t) = u_t ⊙ c_t + rh(u_t) ⊙ s_t`` row by row for ``u (..., L, d_k)``, ``rh`` written
        half by half into the product (no ``rh(u)`` formed)."""
        h, r = self.r // 2, self.r
        ns, s2 = self._halves
        out = u * self.c
        out[..., :h].addcmul_(u[..., h:r], ns)  # −u[h:r] s[:h]
        out[..., h:r].addcmul_(u[..., :h], s2)  # + u[:h] s[h:r]
        return out

    def apply_T(self, v: Tensor) -> Tensor:
        """``rot_tᵀ(v_t) = v_t ⊙ c_t − rh(v_t ⊙ s_t)`` row by row (the adjoint of :meth:`apply`)."""
        h, r = self.r // 2, self.r
        ns, s2 = self._halves
        out = v * self.c
        out[..., :h].addcmul_(v[..., h:r], s2)  # + v[h:r] s[h:r]
        out[..., h:r].addcmul_(v[..., :h], ns)  # − v[:h] s[:h]
        return out

    @cached_property
    def relative(self) -> Tensor:
        """``P_t P_rᵀ`` for every pair of positions, ``(L, L, d_k, d_k)``: ``∂²(q̂_t·k̂_r)/∂q_t ∂k_r``."""
        P = self.matrices
        return P[:, None] @ P[None].transpose(-1, -2)

    @cached_property
    def matrices(self) -> Tensor:
        """``P_t`` of every position, ``(L, d_k, d_k)``: ``rot_t(u) = u P_t``."""
        eye = torch.eye(self.d_k, dtype=self.c.dtype, device=self.c.device)
        return self.apply(eye[None].expand(self.c.shape[0], -1, -1).transpose(0, 1)).transpose(0, 1)

    @cached_property
    def basis(self) -> list[tuple[Tensor, Tensor]]:
        """``[(φ_k (L,), B_k (d_k, d_k))]`` with ``P_t = Σ_k φ_k(t) B_k``: for each frequency ``i`` a
        cosine term (``B`` the identity on features ``i, i + r/2``) and a sine term (``B = R`` there),
        and, when ``r < d_k``, the constant term (the identity on the features left alone)."""
        L, dk, h = self.c.shape[0], self.d_k, self.r // 2
        like = self.c
        out = []
        for i in range(h):
            Bc = torch.zeros(dk, dk, dtype=like.dtype, device=like.device)
            Bs = torch.zeros_like(Bc)
            Bc[i, i] = Bc[i + h, i + h] = 1.0
            Bs[i + h, i], Bs[i, i + h] = -1.0, 1.0  # rh(u)[i] = −u[i+h], rh(u)[i+h] = u[i]
            out += [(self.c[:, i], Bc), (self.s[:, i], Bs)]
        if self.r < dk:
            Bt = torch.zeros(dk, dk, dtype=like.dtype, device=like.device)
            Bt[self.r :, self.r :] = torch.eye(dk - self.r, dtype=like.dtype, device=like.device)
            out.append((torch.ones(L, dtype=like.dtype, device=like.device), Bt))
        return out


def for_config(L: int, d_k: int, rotary_width: int, theta: float, like: Tensor) -> Rotary | None:
    """The rotations of a block, ``None`` without rope (``rotary_width = 0``)."""
    return Rotary(L, d_k, rotary_width, theta, like) if rotary_width else None
