r"""The next-token objective of one sequence with vocabulary-sized logits in bounded memory.

Per position ``t < L−1`` with target ``y_t = ids[t+1]``, the final norm ``h_t = γ ⊙ n(Z_t) + β``
(``n`` a LayerNorm or RMSNorm; ``h_t = Z_t`` without a final norm), ``s_t = E h_t`` (``E (V, d)``
the unembedding), ``p_t = softmax(s_t)``, ``w = 1/(L−1)``:

.. math::
    ℓ = w \textstyle\sum_t \big(\log\sum_v e^{s_{tv}} − s_{t y_t}\big),\qquad
    \bar h_t = w\,E^⊤(p_t − e_{y_t}),\qquad ∇_{Z_t} ℓ = J_t (γ ⊙ \bar h_t),

    N Ż_t = J_t\big(γ ⊙ w\,E^⊤(\mathrm{diag}\,p_t − p_t p_t^⊤) E\,\dot h_t\big)
            + (∂J_t[Ż_t])(γ ⊙ \bar h_t),\qquad \dot h_t = γ ⊙ J_t Ż_t,

the same numbers as :func:`hessviz.pretrained.objectives.next_token_loss` (whose token-wise
``(L, d, d)`` blocks cost ``O(L V d²)`` to build and an ``(L, V, d)`` intermediate), given here
as a product: ``N Ż`` for ``Ż (k, L, d)`` costs ``O(k L V d)`` and never forms ``(L, d, d)``.
The norm's ``J_t`` and its second derivative ``∂J[Ż] n̄`` are the
:class:`hessviz.ops.layernorm.LayerNorm` node's own rules (``tangent``, ``adjoint``,
``adjoint_tangent``).

**Bounded memory.** The logits are never kept: the value and the gradient, at construction, and
every product recompute ``s`` a ``chunk`` of positions at a time, so at most ``chunk × V`` logits
(and ``k × chunk × V`` product terms) live at once, not ``L × V`` (nor ``B·L·V`` over a batch:
the batch is swept one sequence at a time). The price is one ``chunk × d × V`` matmul per chunk
and product call, beside the two of the product itself. :func:`default_chunk` sizes the chunk from
the memory guard (:func:`hessviz.memory.memory_limit`). Chunking changes only the order of nothing:
each position's row is computed alone, so any chunk gives the same numbers bit for bit up to the
matmul kernels' blocking (``tests/test_next_token.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hessviz.custom_loss import CustomLoss
from hessviz.errors import InputError
from hessviz.matfree.operator import BATCH
from hessviz.memory import memory_limit
from hessviz.ops.layernorm import LayerNorm
from hessviz.pretrained.objectives import LMHead

CHUNK_SHARE = 16
"""A chunk's logits and product terms may take ``1/CHUNK_SHARE`` of the memory guard's limit."""

MAX_CHUNK = 1024
"""Tokens per chunk at most (beyond it the matmuls are already large and nothing is gained)."""

TOKEN_WISE_MAX_D = 256
"""Up to this width the curvature is handed over as token-wise ``(L, d, d)`` blocks (:meth:`NextToken.blocks`,
built once in chunks for ``O(L V d²)``): a product then costs ``2 d²`` per token and column, against
``≈ 3 V d`` for :meth:`NextToken.product`, and a small model's ``V ≫ d`` (pydoc-llama: its README
example timed with products alone, ``benchmarks/WHOLE.md``). Wider models (GPT-2 small, ``d = 768``)
take the product."""


def default_chunk(vocab: int, dtype: torch.dtype, device: torch.device | str, columns: int = BATCH) -> int:
    """Positions per chunk: a chunk's ``(2·columns + 3) × chunk × V`` values (logits,
    probabilities, a scratch row, and two ``(columns, chunk, V)`` terms of a product of
    ``columns`` columns) within ``memory_limit(device) / CHUNK_SHARE``; at least 1."""
    per_token = (2 * columns + 3) * vocab * torch.empty((), dtype=dtype).element_size()
    return int(max(1, min(MAX_CHUNK, memory_limit(device) // CHUNK_SHARE // per_token)))


class NextToken:
    """The next-token cross-entropy of one sequence ``Z (L, d)``, ``ids (L,)``, through ``head``:
    ``value``, ``grad (L, d)`` and :meth:`product` ``Ż (k, L, d) -> N Ż`` (module docstring), in
    chunks of ``chunk`` positions (``None``: :func:`default_chunk`)."""

    def __init__(self, Z: Tensor, ids: Sequence[int] | Tensor, head: LMHead, chunk: int | None = None):
        if not isinstance(Z, Tensor) or Z.dim() != 2 or not Z.is_floating_point():
            raise InputError(
                f"Z must be a floating (L, d) tensor, got {getattr(Z, 'shape', type(Z).__name__)}"
            )
        L, d = Z.shape
        E = head.embedding
        if not isinstance(E, Tensor) or E.dim() != 2 or E.shape[1] != d:
            raise InputError(f"head.embedding must be (V, {d}), got {tuple(getattr(E, 'shape', ()))}")
        ids = torch.as_tensor(ids, dtype=torch.int64, device=Z.device)
        if ids.shape != (L,) or L < 2:
            raise InputError(f"ids must be the text's {L} token ids (at least 2), got {tuple(ids.shape)}")
        if bool(((ids < 0) | (ids >= E.shape[0])).any()):
            raise InputError(f"token ids must be integers in [0, {E.shape[0] - 1}]")
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise InputError(f"chunk must be a positive number of tokens, got {chunk!r}")
        self.E = E.to(Z)
        self.chunk = chunk or default_chunk(E.shape[0], Z.dtype, Z.device)
        self.targets = ids[1:]
        self.weight = 1.0 / (L - 1)
        self.L, self.d = L, d
        self.head, self.Z = head, Z
        if head.gamma is None:
            self.norm = None
            self.h = Z[:-1]
        else:
            gamma = ("gamma", head.gamma.to(Z))
            beta = None if head.beta is None else ("beta", head.beta.to(Z))
            self.norm = LayerNorm(
                "h",
                "Z",
                Z[:-1],
                head.eps,
                gamma,
                beta,
                "final norm input",
                centre=head.norm_type == "layernorm",
            )
            self.h = self.norm.y
        value = Z.new_zeros(())
        gh = torch.empty_like(self.h)  # h̄ = w Eᵀ(p − e_y)
        for c in self._chunks():
            s = self.h[c] @ self.E.T  # (c, V)
            lse = torch.logsumexp(s, -1)
            y = self.targets[c]
            value += (lse - s.gather(1, y[:, None]).squeeze(1)).sum()
            p = torch.exp(s.sub_(lse[:, None]))
            torch.matmul(p, self.E, out=gh[c])
            gh[c] -= self.E[y]
        gh *= self.weight
        self.value = value * self.weight
        gz = gh if self.norm is None else self.norm.adjoint(gh)[0][0]
        self.grad = torch.cat([gz, Z.new_zeros(1, d)])

    def _chunks(self) -> list[slice]:
        n = self.L - 1
        return [slice(a, min(a + self.chunk, n)) for a in range(0, n, self.chunk)]

    def product(self, dZ: Tensor) -> Tensor:
        """``N Ż``: ``(k, L, d) -> (k, L, d)``; the last position (no target) gets 0."""
        k = dZ.shape[0]
        dz = dZ[:, :-1]
        nparams = 0 if self.norm is None else len(self.norm.params)
        dh = dz if self.norm is None else self.norm.tangent([dz], [None] * nparams)
        dgh = torch.empty_like(dh)
        for c in self._chunks():
            p = torch.softmax(self.h[c] @ self.E.T, -1)  # (c, V)
            u = dh[:, c] @ self.E.T  # (k, c, V): E ḣ
            u -= (u * p).sum(-1, keepdim=True)
            u *= p  # (diag p − ppᵀ) E ḣ
            dgh[:, c] = u @ self.E
        dgh *= self.weight
        if self.norm is None:
            out = dgh
        else:
            out = self.norm.adjoint_tangent(dgh, [dz], [None] * nparams, True, [True], [False] * nparams)[0][
                0
            ]
        return torch.cat([out, dZ.new_zeros(k, 1, self.d)], 1)

    @property
    def token_wise(self) -> bool:
        """Whether :meth:`custom_loss` hands over :meth:`blocks` (``d ≤ TOKEN_WISE_MAX_D`` and the
        ``(L, d, d)`` blocks within the chunk budget) rather than :meth:`product`."""
        size = self.L * self.d * self.d * self.Z.element_size()
        return self.d <= TOKEN_WISE_MAX_D and size <= memory_limit(self.Z.device) // CHUNK_SHARE

    def blocks(self) -> Tensor:
        """``(L, d, d)``: the token-wise ``∇²_Z ℓ`` (the last position's block 0), built a chunk of
        positions at a time so that at most ``chunk × V × d`` values of ``Eᵀ diag(p) E`` live at once."""
        from hessviz.ops import layernorm

        L, d, E = self.L, self.d, self.E
        itemsize = self.Z.element_size()
        step = max(
            1, min(self.chunk, memory_limit(self.Z.device) // CHUNK_SHARE // (E.shape[0] * d * itemsize))
        )
        gamma = None if self.norm is None else self.norm.gamma
        N = self.Z.new_zeros(L, d, d)
        for a in range(0, L - 1, step):
            c = slice(a, min(a + step, L - 1))
            p = torch.softmax(self.h[c] @ E.T, -1)
            pE = p @ E
            G = torch.einsum("tv,vi,vj->tij", p, E, E) - pE[:, :, None] * pE[:, None, :]
            N[c] = self.weight * (G if gamma is None else gamma[:, None] * G * gamma)
        if self.norm is not None:
            _, st = layernorm.value(self.Z[:-1], self.head.eps, centre=self.norm.centre)
            J = layernorm.jacobian(st)
            N[:-1] = J @ N[:-1] @ J + layernorm.contract_hessian(st, self.norm.gn)
        return N

    def custom_loss(self) -> CustomLoss:
        """``hv.CustomLoss(grad, blocks or product)``: what the stack's products take (:attr:`token_wise`)."""
        return CustomLoss(self.grad, self.blocks() if self.token_wise else self.product)
