r"""The bilinear attention score ``S = Q Kᵀ / sqrt(d_k)``, ``Q = X W_Q + b_Q``, ``K = X W_K + b_K``.

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

from torch import Tensor

from hessviz.kron import LEFT, RIGHT, Factored, KronTerm
from hessviz.ops.base import ones


def value(Q: Tensor, K: Tensor) -> Tensor:
    """``(L, d_k), (L, d_k) -> (L, L)``."""
    return Q @ K.T / math.sqrt(Q.shape[-1])


def jacobian(X: Tensor, Q: Tensor, K: Tensor) -> dict[str, Factored]:
    """Factored ``∂S_t/∂θ`` for ``query.weight``, ``query.bias``, ``key.weight``, output size
    ``L`` per token."""
    L, dk = Q.shape
    scale = 1.0 / math.sqrt(dk)
    K_scaled = (K * scale).expand(L, L, dk)
    return {
        "query.weight": Factored((KronTerm(LEFT, X, K_scaled),)),
        "query.bias": Factored((KronTerm(LEFT, ones(L, X), K_scaled),)),
        "key.weight": Factored((KronTerm(RIGHT, Q, (X * scale).expand(L, L, X.shape[1])),)),
    }


def contract_mixed(X: Tensor, G: Tensor, d_k: int) -> Tensor:
    """``(XᵀGX)/sqrt(d_k)``, ``(d, d)``: the W_Q–W_K block is this ``⊗ I_{d_k}``."""
    return X.T @ G @ X / math.sqrt(d_k)
