r"""Single-head self-attention ``SA(X) = A X W_V``, ``A = softmax_row(S)``, ``S`` the score.

Per token ``t`` (output ``SA_t ∈ R^d``), with ``a_t`` the row of ``A``, ``Σ_t = diag(a_t) - a_t a_tᵀ``
the softmax Jacobian and ``u_t = a_t X``:

.. math::
    \frac{∂SA_t}{∂W_V} = u_t ⊗ I_d, \qquad
    \frac{∂SA_t}{∂W_{Q,K}} = V^\top Σ_t \frac{∂S_t}{∂W_{Q,K}}.

The second derivative of ``Σ_t g_tᵀ SA_t`` (the functional term of Ormaniec et al.)
has three sources:

* the softmax, contracted with ``g^A_t = V g_t``: ``J_Sᵀ Q_softmax(a_t, g^A_t) J_S``;
* the bilinear score, contracted with ``g^S_t = Σ_t g^A_t``: ``(XᵀG^S X)/sqrt(d_k) ⊗ I``;
* the bilinear product ``A · V``: ``∂²/∂a_t ∂W_V`` pairs ``∂u_t/∂W_{Q,K} = Xᵀ Σ_t ∂S_t/∂W``
  with ``g_t``: a Sandwich against ``I_d ⊗ g_t``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from torch import Tensor

from hessviz.components import score, softmax
from hessviz.components.base import eye
from hessviz.contributions import Diagonal, Sandwich
from hessviz.kron import LEFT, RIGHT, Factored, KronTerm


@dataclass(frozen=True)
class SelfAttention:
    """Forward values of one self-attention layer on a constant input ``X (L, d)``."""

    X: Tensor
    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor

    @cached_property
    def Q(self) -> Tensor:
        return self.X @ self.W_Q

    @cached_property
    def K(self) -> Tensor:
        return self.X @ self.W_K

    @cached_property
    def V(self) -> Tensor:
        return self.X @ self.W_V

    @cached_property
    def A(self) -> Tensor:
        """``(L, L)`` attention weights."""
        return softmax.value(score.value(self.Q, self.K))

    @cached_property
    def output(self) -> Tensor:
        """``SA (L, d)``."""
        return self.A @ self.V

    @property
    def L(self) -> int:
        return self.X.shape[0]

    @cached_property
    def score_jacobian(self) -> dict[str, Factored]:
        return score.jacobian(self.X, self.Q, self.K)

    def _through_softmax(self, M: Tensor) -> Tensor:
        """``Mᵀ Σ_t`` per token for ``M (L, n)``: ``(L, n, L)``."""
        L = self.L
        return softmax.apply_jacobian(self.A, M.expand(L, L, M.shape[-1])).transpose(-1, -2)

    @cached_property
    def jacobian(self) -> dict[str, Factored]:
        """``∂SA_t/∂W`` for ``W_Q, W_K, W_V``, factored, output size ``d``."""
        VtSigma = self._through_softmax(self.V)                   # Vᵀ Σ_t, (L, d, L)
        d = self.X.shape[1]
        return {
            "W_Q": self.score_jacobian["W_Q"].lmul(VtSigma),
            "W_K": self.score_jacobian["W_K"].lmul(VtSigma),
            "W_V": Factored((KronTerm(LEFT, self.A @ self.X, eye(d, self.X, self.L)),)),
        }

    def weight_gradients(self, g: Tensor) -> dict[str, Tensor]:
        """``∂(Σ_t g_tᵀ SA_t)/∂W`` by reverse mode: ``G^A = g Vᵀ``, ``G^S = Σ_t G^A_t``,
        ``∇W_Q = Xᵀ G^S K / sqrt(d_k)``, ``∇W_K = Xᵀ G^{S⊤} Q / sqrt(d_k)``, ``∇W_V = (A X)ᵀ g``."""
        gS = softmax.vjp(self.A, g @ self.V.T) / math.sqrt(self.Q.shape[1])
        return {"W_Q": self.X.T @ (gS @ self.K), "W_K": self.X.T @ (gS.T @ self.Q),
                "W_V": (self.A @ self.X).T @ g}

    def functional(self, g: Tensor) -> list[Sandwich | Diagonal]:
        """Contributions of ``Σ_t g_tᵀ ∇²SA_t`` for an upstream gradient ``g (L, d)``."""
        gA = g @ self.V.T                                         # ∂/∂A, (L, L)
        C = softmax.contract_hessian_factored(self.A, gA)         # (L, L, L), kept factored
        gS = softmax.vjp(self.A, gA)                              # ∂/∂S, (L, L)
        JS = self.score_jacobian
        d, dk = self.X.shape[1], self.Q.shape[1]
        XtSigma = self._through_softmax(self.X)                   # Xᵀ Σ_t, (L, d, L)
        g_times_identity = Factored((KronTerm(RIGHT, g, eye(d, g, self.L)),))   # [i,(i',j)] = δ_ii' g_t[j]
        return [
            Sandwich("W_Q", "W_Q", JS["W_Q"], C, JS["W_Q"]),
            Sandwich("W_Q", "W_K", JS["W_Q"], C, JS["W_K"]),
            Sandwich("W_K", "W_K", JS["W_K"], C, JS["W_K"]),
            Diagonal("W_Q", "W_K", (d, dk, d, dk), (1, 3),
                     score.contract_mixed(self.X, gS, dk)[:, :, None].expand(d, d, dk)),
            Sandwich("W_Q", "W_V", JS["W_Q"].lmul(XtSigma), None, g_times_identity),
            Sandwich("W_K", "W_V", JS["W_K"].lmul(XtSigma), None, g_times_identity),
        ]
