r"""The cross-entropy of a decoder's LM head in its last hidden states, in bounded memory: :class:`NextToken`.

A decoder's head (:class:`LMHead`) is its final norm and its unembedding ``E (V, d)``. Per predicting
position ``t`` with target ``y_t``, the final norm ``h_t = γ ⊙ n(Z_t) + β`` (``n`` a LayerNorm or
RMSNorm; ``h_t = Z_t`` without a final norm), ``s_t = E h_t``, ``p_t = softmax(s_t)``, and a common
weight ``w``:

.. math::
    ℓ = w \textstyle\sum_t \big(\log\sum_v e^{s_{tv}} − s_{t y_t}\big),\qquad
    \bar h_t = w\,E^⊤(p_t − e_{y_t}),\qquad ∇_{Z_t} ℓ = J_t (γ ⊙ \bar h_t),

    N_t = J_t\,\mathrm{diag}(γ)\, w E^⊤(\mathrm{diag}\,p_t − p_t p_t^⊤) E\,\mathrm{diag}(γ)\, J_t
          + \textstyle\sum_k (γ ⊙ \bar h_t)_k ∇^2 n_k(Z_t),

    N Ż_t = J_t\big(γ ⊙ w\,E^⊤(\mathrm{diag}\,p_t − p_t p_t^⊤) E\,\dot h_t\big)
            + (∂J_t[Ż_t])(γ ⊙ \bar h_t),\qquad \dot h_t = γ ⊙ J_t Ż_t,

with the norm's symmetric Jacobian ``J_t`` (``I`` without a final norm, and no second term).

**Final-logit soft-capping** (Gemma 2, :attr:`LMHead.softcap` ``= c``): the logits are ``σ = c·tanh(s/c)``
and ``p = softmax(σ)``. With ``τ = tanh(s/c)``, ``a = σ' = 1 − τ²`` and ``b = σ'' = −(2/c)·τ·a``
(elementwise), ``∂ℓ_t/∂s = a ⊙ (p − e_y)`` and ``∂²ℓ_t/∂s² = diag(a)(diag p − p pᵀ)diag(a) +
diag(b ⊙ (p − e_y))``, so ``h̄_t = w Eᵀ(a ⊙ (p − e_y))`` and the middle factor ``diag p − p pᵀ`` above
becomes ``diag(a² ⊙ p + b ⊙ (p − e_y)) − (a ⊙ p)(a ⊙ p)ᵀ``. Without a cap ``a = 1``, ``b = 0``. The loss
is a sum over positions: ``N`` is token-wise, and positions that predict nothing have ``g_t = 0``,
``N_t = 0``. Two choices of positions:

* **next token** (:class:`NextToken`): positions ``0 … L−2`` predict ``ids[1:]``, ``w = 1/(L−1)``:
  the mean, as ``transformers``' ``…ForCausalLM(labels=ids)`` computes it;
* **last token** (``NextToken(Z, head=head, target=y)``): position ``L−1`` predicts a target the caller names
  (the token after the text), ``w = 1``.

:meth:`NextToken.product` costs ``O(k L V d)`` and never forms ``(L, d, d)``;
:meth:`NextToken.token_curvature` builds the blocks for ``O(L V d²)``. The norm's ``J_t`` and its
second derivative are the :class:`hessviz.ops.layernorm.LayerNorm` node's own rules (``tangent``,
``adjoint``, ``adjoint_tangent``) and :mod:`hessviz.ops.layernorm`'s ``jacobian`` and
``contract_hessian``.

**Bounded memory.** The logits are never kept: the value and the gradient, at construction, and
every product recompute ``s`` a ``chunk`` of positions at a time, so at most ``chunk × V`` logits
(and ``k × chunk × V`` product terms) live at once, not ``L × V`` (nor ``B·L·V`` over a batch:
a whole model's batch is swept one sequence at a time). :func:`default_chunk` sizes the chunk from
the memory guard (:func:`hessviz.runtime.memory.memory_limit`). Each position's row is computed alone, so
any chunk gives the same numbers up to the matmul kernels' blocking (``tests/test_whole_next_token.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hessviz.errors import InputError
from hessviz.losses.base import check_Z, unplaced
from hessviz.losses.objective import ModelObjective
from hessviz.ops import layernorm
from hessviz.ops.base import Along
from hessviz.ops.layernorm import LayerNorm
from hessviz.runtime.memory import memory_limit

NORM_TYPES = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class LMHead:
    """A decoder's output head: ``logits = (γ ⊙ norm(z) + β) Eᵀ``.

    ``norm_type`` ``"layernorm"`` (GPT-2, GPT-NeoX, OPT) or ``"rmsnorm"`` (Llama, Mistral, Qwen;
    ``beta = None``); ``gamma = None`` for a head without a final norm. ``embedding`` is the
    unembedding ``E (V, d)``, the token embedding when the weights are tied.
    """

    gamma: Tensor | None
    beta: Tensor | None
    eps: float
    embedding: Tensor
    """``(V, d)``."""
    norm_type: str = "layernorm"
    softcap: float | None = None
    """Final-logit soft-capping ``c``: logits ``c·tanh(s/c)`` (Gemma 2); ``None``: none."""

    def check(self, d: int) -> LMHead:
        """This head, checked against a model of width ``d``; an :class:`InputError` naming the field."""
        E = self.embedding
        if not isinstance(E, Tensor) or E.dim() != 2 or E.shape[1] != d:
            raise InputError(f"head.embedding must be (V, {d}), got {tuple(getattr(E, 'shape', ()))}")
        if self.norm_type not in NORM_TYPES:
            raise InputError(
                f"head.norm_type must be one of {', '.join(map(repr, NORM_TYPES))}, got {self.norm_type!r}"
            )
        if any(v is not None and (v.shape != (d,)) for v in (self.gamma, self.beta)):
            raise InputError(f"head.gamma and head.beta must be ({d},) (or None)")
        if self.gamma is None and self.beta is not None:
            raise InputError("head.beta needs head.gamma (a head without a final norm has neither)")
        c = self.softcap
        finite = isinstance(c, (int, float)) and not isinstance(c, bool) and 0 < c < float("inf")
        if c is not None and not finite:
            raise InputError(f"head.softcap must be a finite number > 0 (or None), got {c!r}")
        return self


CHUNK_SHARE = 16
"""A chunk's logits and product terms may take ``1/CHUNK_SHARE`` of the memory guard's limit."""

MAX_CHUNK = 256
"""Tokens per chunk at most: beyond it the matmuls are already large and nothing is gained. At GPT-2
small's vocabulary (``python benchmarks/next_token_memory.py``, L = 1024, float32, 2 CPU threads) a
product of 8 columns took 8.8 s in chunks of 256 and 9.4 s in one chunk of 1024, with 1,036 against
3,605 MiB of heap; chunks of 64 were as fast at 8 columns and slower at 1."""

KEEP_PROBABILITIES = 256 << 20
"""Bytes of the softmax ``p (L', V)`` kept from the point for the products when it fits (SmolLM2's
``V = 49,152`` in float64: up to 682 positions). A product then computes ``E ḣ`` alone instead of
recomputing the logits ``h Eᵀ`` in the same GEMM, whose rows it doubled at one column (issue 47: the
head was a third of a 16-token product's GEMM work against double backward's two GEMMs; at 256
tokens the recomputed logits were 10 % of a SmolLM2 product)."""

VOCAB_BLOCK = 256
"""Rows of ``E`` per block of a product with ``p`` kept (:meth:`NextToken.product`): ``E ḣ`` and
``Eᵀ(p ⊙ E ḣ)`` of one block run back to back while the block (``256 × d`` values: 1.2 MB at
``d = 576`` in float64) is still in the core's cache, so ``E`` is read from memory once a product,
not twice, and no ``(k, L', V)`` term is formed. Wider blocks at many rows
(:data:`VOCAB_BLOCK_WIDE` from :data:`WIDE_ROWS` rows), where the GEMMs are compute-bound. SmolLM2,
one thread, one column (issue 47): 1.49× / 1.31× / 1.30× the unblocked head at 15 / 63 / 255 rows."""

VOCAB_BLOCK_WIDE = 1024
WIDE_ROWS = 64

PRODUCT_COLUMNS = 8
"""Columns of one product call that a chunk is sized for: :data:`hessviz.products.operator.BATCH`
(kept equal by ``tests/test_losses.py``; imported from there it would close an import circle)."""

TOKEN_WISE_MAX_D = 256
"""Up to this width :meth:`NextToken.custom_loss` hands the curvature over as token-wise ``(L, d, d)``
blocks (:meth:`NextToken.token_curvature`, built once in chunks for ``O(L V d²)``): a product then
costs ``2 d²`` per token and column, against ``≈ 3 V d`` for :meth:`NextToken.product`, and a small
model's ``V ≫ d``. Wider models (GPT-2 small, ``d = 768``) take the product."""


def default_chunk(
    vocab: int, dtype: torch.dtype, device: torch.device | str, columns: int = PRODUCT_COLUMNS
) -> int:
    """Positions per chunk: a chunk's ``(2·columns + 3) × chunk × V`` values (logits,
    probabilities, a scratch row, and two ``(columns, chunk, V)`` terms of a product of
    ``columns`` columns) within ``memory_limit(device) / CHUNK_SHARE``; at least 1."""
    per_token = (2 * columns + 3) * vocab * torch.empty((), dtype=dtype).element_size()
    return int(max(1, min(MAX_CHUNK, memory_limit(device) // CHUNK_SHARE // per_token)))


def check_chunk(chunk: object) -> None:
    """``chunk`` is ``None`` or a positive number of tokens."""
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise InputError(f"chunk must be a positive number of tokens, got {chunk!r}")


def _token_ids(ids: Sequence[int] | Tensor, vocab: int, device: torch.device) -> Tensor:
    ids = torch.as_tensor(ids, dtype=torch.int64, device=device)
    if ids.dim() != 1 or bool(((ids < 0) | (ids >= vocab)).any()):
        raise InputError(f"token ids must be integers in [0, {vocab - 1}]")
    return ids


class NextToken(ModelObjective):
    """The next-token cross-entropy of one sequence ``Z (L, d)``, ``ids (L,)``, through ``head``
    (module docstring), in chunks of ``chunk`` positions (``None``: :func:`default_chunk`): built
    at its point, with ``value``, ``grad (L, d)``, :meth:`token_curvature` and :meth:`product`.
    With ``target`` (and no ``ids``) it is the last token's loss alone: position ``L−1`` predicting
    ``target``, ``−log p_{L−1}(target)``.

    ``NextToken()`` (no point; ``chunk`` may be given) is a whole model's objective,
    ``hv.model_hessian(model, ids, objective=hv.NextToken())`` (the string ``"next_token"`` names it,
    :mod:`hessviz.losses.names`): :meth:`at_text` places it at each sequence's last hidden states."""

    reads_head = True
    exact_curvature = True

    def __init__(
        self,
        Z: Tensor | None = None,
        ids: Sequence[int] | Tensor | None = None,
        head: LMHead | None = None,
        chunk: int | None = None,
        *,
        target: int | None = None,
    ):
        if Z is None:
            if ids is not None or head is not None or target is not None:
                raise InputError(
                    "NextToken: Z, ids (or target) and head come together (or none: the objective alone)"
                )
            check_chunk(chunk)
            self.Z, self._chunk = None, chunk
            return
        if head is None or (ids is None) == (target is None):
            raise InputError("NextToken at a point needs the model's head and either ids or a target with Z")
        L, d = check_Z(Z).shape
        head.check(d)
        vocab = head.embedding.shape[0]
        if target is not None:
            self._place(Z, slice(L - 1, L), _token_ids([target], vocab, Z.device), 1.0, head, chunk)
            return
        ids = torch.as_tensor(ids, dtype=torch.int64, device=Z.device)
        if ids.shape != (L,) or L < 2:
            raise InputError(f"ids must be the text's {L} token ids (at least 2), got {tuple(ids.shape)}")
        ids = _token_ids(ids, vocab, Z.device)
        self._place(Z, slice(0, L - 1), ids[1:], 1.0 / (L - 1), head, chunk)

    def _place(
        self, Z: Tensor, positions: slice, targets: Tensor, weight: float, head: LMHead, chunk: int | None
    ) -> None:
        """Compute the value and the gradient at ``Z``: the positions ``positions`` predict ``targets``, each
        weighted ``weight``."""
        check_chunk(chunk)
        L, d = Z.shape
        E = head.embedding
        self.E = E.to(Z)
        self._chunk = chunk
        self.chunk = chunk or default_chunk(E.shape[0], Z.dtype, Z.device)
        self.positions, self.targets, self.weight = positions, targets, weight
        self.L, self.d = L, d
        self.head, self.Z = head, Z
        if head.gamma is None:
            self.norm = None
            self.h = Z[positions]
        else:
            gamma = ("gamma", head.gamma.to(Z))
            beta = None if head.beta is None else ("beta", head.beta.to(Z))
            self.norm = LayerNorm(
                "h",
                "Z",
                Z[positions],
                head.eps,
                gamma,
                beta,
                "final norm input",
                centre=head.norm_type == "layernorm",
            )
            self.h = self.norm.y
        value = Z.new_zeros(())
        gh = torch.empty_like(self.h)  # h̄ = w Eᵀ(p − e_y)
        keep = (
            self.head.softcap is None
            and self.h.shape[0] * E.shape[0] * Z.element_size() <= KEEP_PROBABILITIES
        )
        self.kept: list[Tensor] | None = [] if keep else None
        self._block_views: dict[tuple[int, int], list[tuple[Tensor, Tensor]]] = {}
        self.mean: list[Tensor] = []  # Eᵀ p_t of each chunk's positions, with p kept
        for c in self._chunks():
            s = self.h[c] @ self.E.T  # (c, V)
            y = self.targets[c]
            a = self._cap(s)  # s capped in place; a = σ' (None without a cap)
            lse = torch.logsumexp(s, -1)
            value += (lse - s.gather(1, y[:, None]).squeeze(1)).sum()
            p = torch.exp(s.sub_(lse[:, None]))
            if keep:  # as (V, c): a product's E ḣ is (V, k·c), the GEMMs' long side first
                self.kept.append(p.T.contiguous())
            if a is None:
                torch.matmul(p, self.E, out=gh[c])
                if keep:  # Eᵀ p_t, the products' rank-one term
                    self.mean.append(gh[c].clone())
                gh[c] -= self.E[y]
            else:  # Eᵀ(a ⊙ (p − e_y))
                torch.matmul(p * a, self.E, out=gh[c])
                gh[c] -= a.gather(1, y[:, None]) * self.E[y]
        gh *= self.weight
        self.value = value * self.weight
        self.grad = Z.new_zeros(L, d)
        self.grad[positions] = gh if self.norm is None else self.norm.adjoint(gh)[0][0]

    def __getattr__(self, name: str):
        """Only reached for what :meth:`_place` sets: an objective without a point has none of it."""
        if name in ("value", "grad") and self.__dict__.get("Z", 0) is None:
            raise unplaced(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        chunk = "" if self._chunk is None else f"chunk={self._chunk}"
        where = "" if self.Z is None else f"at Z {tuple(self.Z.shape)}" + ", " * bool(chunk)
        return f"NextToken({where}{chunk})"

    def at_text(self, Z: Tensor, ids: Tensor, head: LMHead | None = None, index: int = 0) -> NextToken:
        """This objective at one text: ``NextToken(Z, ids, head, chunk)``."""
        return NextToken(Z, ids, head, self._chunk)

    def at(self, Z: Tensor) -> NextToken:
        """The same positions and targets at another ``Z``."""
        if self.Z is None:
            raise InputError("NextToken() has no ids or head: place it with NextToken(Z, ids, head)")
        if Z is self.Z:
            return self
        out = type(self).__new__(type(self))
        out._place(
            check_Z(Z), self.positions, self.targets, self.weight, self.head.check(Z.shape[1]), self._chunk
        )
        return out

    def _cap(self, s: Tensor) -> Tensor | None:
        """Soft-cap the logits ``s`` in place, ``s ← c·tanh(s/c)``, and return ``a = 1 − tanh²(s/c)``
        (``None``, ``s`` unchanged, without a cap)."""
        c = self.head.softcap
        if c is None:
            return None
        s.div_(c).tanh_()
        a = 1 - s * s
        s.mul_(c)
        return a

    def _capped(self, s: Tensor, y: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``(p, a, q)`` at raw logits ``s (c, V)`` with targets ``y``: ``p = softmax(σ)``, and with a cap
        ``a = σ'`` and ``q = σ'' ⊙ (p − e_y)`` (``None`` without one)."""
        a = self._cap(s)
        p = torch.softmax(s, -1)
        if a is None:
            return p, None, None
        b = s.mul(-2.0 / self.head.softcap**2).mul_(a)  # σ'' = −(2/c)·tanh·a, with s = c·tanh
        q = b * p
        q.scatter_add_(1, y[:, None], -b.gather(1, y[:, None]))
        return p, a, q

    def _chunks(self) -> list[slice]:
        n = self.h.shape[0]
        return [slice(a, min(a + self.chunk, n)) for a in range(0, n, self.chunk)]

    def product(self, dZ: Tensor) -> Tensor:
        """``N Ż``: ``(k, L, d) -> (k, L, d)``; positions that predict nothing get 0."""
        k = dZ.shape[0]
        dz = dZ[:, self.positions]
        nparams = 0 if self.norm is None else len(self.norm.params)
        dh = dz if self.norm is None else self.norm.tangent([dz], [None] * nparams)
        dgh = torch.empty_like(dh)
        for i, c in enumerate(self._chunks()):
            if self.kept is not None:  # p kept from the point (no cap): E read once, in blocks
                dgh[:, c] = self._kept_product(dh[:, c], i)
                continue
            # the logits h Eᵀ (recomputed: O(chunk · V) memory) and E ḣ, one GEMM
            rows = torch.cat([self.h[c][None], dh[:, c]])  # (1 + k, c, d)
            s = (rows.reshape(-1, self.d) @ self.E.T).view(1 + k, rows.shape[1], -1)
            p, a, q = self._capped(s[0], self.targets[c])  # (c, V)
            u = s[1:]  # (k, c, V): E ḣ
            if a is None:
                u -= (u * p).sum(-1, keepdim=True)
                u *= p  # (diag p − ppᵀ) E ḣ
            else:  # (diag(a) (diag p − ppᵀ) diag(a) + diag q) E ḣ
                extra = q * u
                u *= a
                u -= (u * p).sum(-1, keepdim=True)
                u *= p * a
                u += extra
            dgh[:, c] = u @ self.E
        dgh *= self.weight
        out = dZ.new_zeros(k, self.L, self.d)
        if self.norm is None:
            out[:, self.positions] = dgh
        else:
            out[:, self.positions] = self.norm.adjoint_tangent(
                Along(dgh, [dz], [None] * nparams, True, [True], [False] * nparams)
            )[0][0]
        return out

    def _kept_product(self, dh: Tensor, i: int) -> Tensor:
        """``Eᵀ(diag p_t − p_t p_tᵀ) E ḣ_t`` of chunk ``i``, ``dh (k, c, d)``, with its softmax kept as
        ``pᵀ (V, c)`` and ``mean = Eᵀ p (c, d)``: the rank-one term is ``(Eᵀp_t)(p_tᵀ E ḣ_t) =
        mean_t (mean_t · ḣ_t)``, and ``Eᵀ (p ⊙ E ḣ) = Σ_j E_jᵀ (p_j ⊙ E_j ḣ)`` over blocks ``E_j`` of
        :data:`VOCAB_BLOCK` rows (:meth:`_blocks`), each block's two GEMMs back to back (the block read
        from memory once; on a GPU one block of every row). The tangents are the columns, ``ḣ (d, k·c)``:
        ``E_j ḣ`` is a GEMM with ``E_j``'s rows as its long side, which MKL runs 1.3× faster at one
        column (15 rows) than ``ḣᵀ E_jᵀ``."""
        k, c, d = dh.shape
        n = k * c
        cols = dh.reshape(n, d).T.contiguous()  # (d, k·c)
        V = self.E.shape[0]
        if self.E.device.type != "cpu":  # a GPU: one block, two launches (no cache to keep it in)
            block = V
        else:
            block = VOCAB_BLOCK_WIDE if n >= WIDE_ROWS else VOCAB_BLOCK
        acc = cols.new_zeros(n, d)
        u = cols.new_empty(min(block, V) * n)
        whole = u.view(-1, n), u.view(-1, k, c)  # a whole block's E_j ḣ, and per column
        for Ej, pj in self._blocks(block, i):
            b = Ej.shape[0]
            uj, per = whole if b * n == u.numel() else (u[: b * n].view(b, n), u[: b * n].view(b, k, c))
            torch.mm(Ej, cols, out=uj)  # E_j ḣ
            per.mul_(pj)  # p_j ⊙ E_j ḣ
            acc.addmm_(uj.T, Ej)
        out = acc.view(k, c, d)
        mean = self.mean[i]
        out -= (dh * mean).sum(-1, keepdim=True) * mean  # − (Eᵀp)(pᵀ E ḣ)
        return out

    def _blocks(self, block: int, i: int) -> list[tuple[Tensor, Tensor]]:
        """``(E_j, p_jᵀ (b, 1, c))`` of chunk ``i``'s kept softmax over blocks of ``block`` vocabulary rows:
        views, made at the first product and reused (192 blocks a product for SmolLM2: their slicing
        cost 3 ms of a one-column head's 25)."""
        got = self._block_views.get((block, i))
        if got is None:
            pT = self.kept[i]
            got = self._block_views[(block, i)] = [
                (Ej, pj[:, None]) for Ej, pj in zip(self.E.split(block), pT.split(block), strict=True)
            ]
        return got

    @property
    def prefers_blocks(self) -> bool:
        """Whether :meth:`custom_loss` hands over :meth:`token_curvature` (``d ≤ TOKEN_WISE_MAX_D`` and
        the ``(L, d, d)`` blocks within the chunk budget) rather than :meth:`product`."""
        size = self.L * self.d * self.d * self.Z.element_size()
        return self.d <= TOKEN_WISE_MAX_D and size <= memory_limit(self.Z.device) // CHUNK_SHARE

    def token_curvature(self) -> Tensor:
        """``(L, d, d)``: the blocks ``N_t`` (0 where a position predicts nothing), built a chunk of
        positions at a time so that at most ``chunk × V × d`` values of ``Eᵀ diag(p) E`` live at once."""
        L, d, E = self.L, self.d, self.E
        itemsize = self.Z.element_size()
        step = max(
            1, min(self.chunk, memory_limit(self.Z.device) // CHUNK_SHARE // (E.shape[0] * d * itemsize))
        )
        gamma = None if self.norm is None else self.norm.gamma
        N = self.Z.new_zeros(L, d, d)
        Nr = N[self.positions]
        n = self.h.shape[0]
        for a in range(0, n, step):
            c = slice(a, min(a + step, n))
            p, a, q = self._capped(self.h[c] @ E.T, self.targets[c])
            ap = p if a is None else a * p
            diag = p if a is None else a * ap + q  # diag(a² ⊙ p + q) − (a ⊙ p)(a ⊙ p)ᵀ
            pE = ap @ E
            G = torch.einsum("tv,vi,vj->tij", diag, E, E) - pE[:, :, None] * pE[:, None, :]
            Nr[c] = self.weight * (G if gamma is None else gamma[:, None] * G * gamma)
        if self.norm is not None:
            _, st = layernorm.value(self.Z[self.positions], self.head.eps, centre=self.norm.centre)
            J = layernorm.jacobian(st)
            N[self.positions] = J @ Nr @ J + layernorm.contract_hessian(st, self.norm.gn)
        return N
