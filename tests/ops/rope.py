"""Rotary positions as Hugging Face writes them (``rotate_half``, partial rotary): the reference the
rotary tables, the score and the attention core are checked against."""

import torch


def rotate(u, r, theta):
    """``u (..., L, d_k)`` with its first ``r`` features of row ``t`` rotated by the angles ``t ω_i``."""
    L = u.shape[-2]
    inv_freq = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    freqs = torch.arange(L, dtype=torch.float64)[:, None] * inv_freq
    emb = torch.cat([freqs, freqs], -1)
    rot, rest = u[..., :r], u[..., r:]
    half = torch.cat([-rot[..., r // 2 :], rot[..., : r // 2]], -1)
    return torch.cat([rot * emb.cos() + half * emb.sin(), rest], -1)
