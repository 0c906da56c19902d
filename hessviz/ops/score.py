r"""The bilinear attention score ``S = Q Kᵀ / sqrt(d_k)``, ``Q = X W_Q + b_Q``, ``K = X W_K + b_K``.

Every function takes the factor on ``q·k`` as ``scale`` (``BlockConfig.attn_scale``; ``None``:
``1/sqrt(d_k)``, written so below).

Row ``t`` is token ``t``'s scores over the tokens ``r``: ``S_tr = q_t · k_r / sqrt(d_k)``.
Per token ``t`` (output index ``r``), in the local names of :mod:`hessviz.ops.attention`:

.. math::
    \frac{∂S_{tr}}{∂W_Q[i,m]} = x_t[i]\, \frac{K[r,m]}{\sqrt{d_k}} \quad (\text{left term}),
    \qquad \frac{∂S_{tr}}{∂b_Q[m]} = \frac{K[r,m]}{\sqrt{d_k}},
    \qquad
    \frac{∂S_{tr}}{∂W_K[i,m]} = \frac{X[r,i]}{\sqrt{d_k}}\, q_t[m] \quad (\text{right term}).

(``∂S_{tr}/∂b_K[m] = q_t[m]/\sqrt{d_k}`` is the same for every ``r``: the softmax ignores it.)

``S`` is linear in each weight, so only the mixed second derivative is non-zero;
contracted with an upstream gradient ``G (L, L)``:

.. math::
    \sum_{t,r} G_{tr} \frac{∂^2 S_{tr}}{∂W_Q[i,m]\,∂W_K[i',m']}
      = \frac{(X^\top G X)[i,i']}{\sqrt{d_k}}\, δ_{mm'}.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hessviz.ops.base import ones
from hessviz.ops.kron import LEFT, RIGHT, Factored, KronTerm
from hessviz.ops.rotary import Rotary


def factor(d_k: int, scale: float | None = None) -> float:
    """The factor on ``q·k``: ``scale``, or ``1/sqrt(d_k)`` when it is ``None``."""
    return 1.0 / math.sqrt(d_k) if scale is None else scale


def value(Q: Tensor, K: Tensor, scale: float | None = None) -> Tensor:
    """``(L, d_k), (L, d_k) -> (L, L)``."""
    return Q @ K.T * factor(Q.shape[-1], scale)


def jacobian(
    X: Tensor, Q: Tensor, K: Tensor, scale: float | None = None, key_bias: bool = False
) -> dict[str, Factored]:
    """Factored ``∂S_t/∂θ`` for ``query.weight``, ``query.bias``, ``key.weight``, output size
    ``L`` per token; with ``key_bias`` also ``key.bias`` (``∂S_tr/∂b_K = q_t/√d_k`` for every ``r``:
    needed where a later map does not ignore a row shift, the soft-cap)."""
    L, dk = Q.shape
    scale = factor(dk, scale)
    K_scaled = (K * scale).expand(L, L, dk)
    out = {
        "query.weight": Factored((KronTerm(LEFT, X, K_scaled),)),
        "query.bias": Factored((KronTerm(LEFT, ones(L, X), K_scaled),)),
        "key.weight": Factored((KronTerm(RIGHT, Q, (X * scale).expand(L, L, X.shape[1])),)),
    }
    if key_bias:
        out["key.bias"] = Factored((KronTerm(LEFT, ones(L, X), (Q * scale)[:, None, :].expand(L, L, dk)),))
    return out


def contract_mixed(X: Tensor, G: Tensor, d_k: int, scale: float | None = None) -> Tensor:
    """``(XᵀGX)/sqrt(d_k)``, ``(d, d)``: the W_Q–W_K block is this ``⊗ I_{d_k}``."""
    return X.T @ G @ X * factor(d_k, scale)


def rotary_jacobian(
    X: Tensor, Q: Tensor, K: Tensor, rot: Rotary, key_bias: bool, scale: float | None = None
) -> dict[str, Factored]:
    r"""``∂S_t/∂θ`` with rotary positions: ``S_tr = q̂_t·k̂_r/√d_k``, ``q̂_t = q_t P_t``, ``k̂_r = k_r P_r``
    (``Q``, ``K`` the rotated rows). The rotation folds into the factors:

    .. math::
        \frac{∂S_{tr}}{∂q_t} = \frac{k̂_r P_t^\top}{\sqrt{d_k}} = K̃_t[r],\qquad
        \frac{∂S_{tr}}{∂k_r} = \frac{q̂_t P_r^\top}{\sqrt{d_k}}
          = \sum_k φ_k(r)\, \frac{q̂_t B_k^\top}{\sqrt{d_k}}

    so ``W_Q`` is one left term ``x_t ⊗ K̃_t`` and ``W_K`` one right term per rotary basis
    element ``(φ_k X)[r, i] · (q̂_t B_kᵀ)[m]/√d_k`` (:attr:`~hessviz.ops.rotary.Rotary.basis`).
    ``b_K`` no longer cancels in the softmax (``rot_r(b_K)`` changes with ``r``):
    ``∂S_tr/∂b_K = q̂_t P_rᵀ/√d_k``, one left term with a per-token matrix."""
    L, dk = Q.shape
    scale = factor(dk, scale)
    Kt = rot.apply_T(K[:, None, :].expand(L, L, dk)).transpose(0, 1) * scale  # [t, r] = rot_tᵀ(k̂_r)/√d_k
    out = {
        "query.weight": Factored((KronTerm(LEFT, X, Kt),)),
        "query.bias": Factored((KronTerm(LEFT, ones(L, X), Kt),)),
    }
    out["key.weight"] = Factored(
        tuple(
            KronTerm(RIGHT, (Q @ B.T) * scale, (phi[:, None] * X).expand(L, L, X.shape[1]))
            for phi, B in rot.basis
        )
    )
    if key_bias:
        Qt = rot.apply_T(Q[:, None, :].expand(L, L, dk)) * scale  # [t, r] = rot_rᵀ(q̂_t)/√d_k
        out["key.bias"] = Factored((KronTerm(LEFT, ones(L, X), Qt),))
    return out


def rotary_mixed(
    U: Tensor, V: Tensor, G: Tensor, rot: Rotary, d_k: int, scale: float | None = None
) -> Tensor:
    r"""``Σ_tr G_tr ∂²S_tr/∂(U-side query weight)∂(V-side key weight)`` with rotary positions:
    ``(Σ_tr G_tr U[t,i] V[r,j] (P_t P_rᵀ)[m,n])/√d_k``, returned as the block ``(i, m, j, n)``.
    ``U``, ``V`` are ``X`` for a weight and ``1 (L, 1)`` for a bias."""
    weighted = G[:, :, None, None] * rot.relative  # (L, L, d_k, d_k)
    keyed = torch.einsum("rj,trmn->tjmn", V, weighted)  # one contraction at a time:
    return torch.einsum("ti,tjmn->imjn", U, keyed) * factor(d_k, scale)  # O(L² d d_k²) + O(L d² d_k²)
