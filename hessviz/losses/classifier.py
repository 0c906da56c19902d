r"""A classification head on a pooled last hidden state: :class:`Classifier`.

For one sequence ``Z (L, d)`` with label ``y``: the final norm (where the model has one:
``n_t = norm(Z_t)``, ``h_t = γ ⊙ n_t + β_n``; else ``h_t = Z_t``), the pooled ``z = Σ_t w_t h_t``
(``"cls"``: ``w = e_0``; ``"last"``: ``w = e_{L−1}``; ``"mean"``: ``w_t = 1/L``), ``s = zW + b``,
``p = softmax(s)``, ``ℓ = −log p_y``:

.. math::
    g_z = W(p − e_y),\qquad H_z = W(\mathrm{diag}\,p − pp^⊤)W^⊤,\qquad
    ∇_{Z_t} ℓ = w_t J_t (γ ⊙ g_z),

    (N Ż)_t = w_t J_t\,\mathrm{diag}(γ)\,H_z \textstyle\sum_s w_s\,\mathrm{diag}(γ) J_s Ż_s
              + w_t \sum_k (γ ⊙ g_z)_k ∇^2 n_{t,k}\,Ż_t,

with the norm's symmetric Jacobian ``J_t`` and second derivatives of :mod:`hessviz.ops.layernorm`
(``J = I`` and no second term without a final norm). ``"cls"`` and ``"last"`` touch one token:
their curvature is token-wise ``(L, d, d)`` (zero but at that token); ``"mean"`` couples every
pair of tokens and is given as its product.

``W`` and ``b`` are constants unless named (``"head.W"``, ``"head.b"``): then :class:`HeadTerms` gives
their rows and the mixed terms. A batch is the mean over its sequences: the caller weighs each
sequence's products by ``1/B``. ``hv.Classifier(W, b, labels, pooling)`` is the batch's objective;
:meth:`Classifier.at` places it at one sequence's ``Z`` (its label ``labels[index]``, through a
final norm): the :class:`~hessviz.losses.base.Loss` of that sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import torch
from torch import Tensor

from hessviz.errors import InputError
from hessviz.losses.base import unplaced
from hessviz.losses.custom import CustomLoss
from hessviz.losses.next_token import LMHead
from hessviz.losses.objective import ModelObjective
from hessviz.ops import layernorm

POOLINGS = ("cls", "mean", "last")


@dataclass(frozen=True, eq=False)
class Classifier(ModelObjective):
    """A classification head on the pooled last hidden state: ``softmax(pool(h) W + b)``.

    ``W (d, C)`` and ``b (C,)`` floating, ``labels (B,)`` integers in ``[0, C)`` (one per
    sequence), ``pooling`` one of ``"cls"`` (first token), ``"mean"``, ``"last"``. Placed at one
    sequence by :meth:`at`, it is that sequence's loss (value, gradient, curvature, product)."""

    W: Tensor
    b: Tensor
    labels: Tensor | list[int]
    pooling: str = "cls"
    Z: Tensor | None = field(default=None, repr=False, kw_only=True)
    """The point, ``(L, d)`` (``None``: not placed)."""
    index: int = field(default=0, repr=False, kw_only=True)
    """The sequence whose label applies at ``Z``."""
    norm: LMHead | None = field(default=None, repr=False, kw_only=True)
    """The model's final norm that ``Z`` goes through first (``None`` or a norm-less head: none)."""

    def __post_init__(self):
        W, b = self.W, self.b
        if not isinstance(W, Tensor) or W.dim() != 2 or not W.is_floating_point() or min(W.shape) < 1:
            raise InputError(
                f"Classifier W must be a floating (d, C) tensor, got {getattr(W, 'shape', type(W).__name__)}"
            )
        C = W.shape[1]
        if not isinstance(b, Tensor) or tuple(b.shape) != (C,) or not b.is_floating_point():
            raise InputError(
                f"Classifier b must be a floating ({C},) tensor (W is {tuple(W.shape)}), got "
                f"{getattr(b, 'shape', type(b).__name__)}"
            )
        labels = torch.as_tensor(self.labels)
        if labels.dim() != 1 or labels.is_floating_point() or labels.dtype == torch.bool:
            raise InputError(f"Classifier labels must be a (B,) sequence of integers, got {self.labels!r}")
        if bool(((labels < 0) | (labels >= C)).any()):
            raise InputError(
                f"Classifier labels must be in [0, {C - 1}] (W has {C} classes), got {labels.tolist()}"
            )
        if self.pooling not in POOLINGS:
            raise InputError(
                f"Classifier pooling must be one of {', '.join(map(repr, POOLINGS))}, got {self.pooling!r}"
            )
        object.__setattr__(self, "labels", labels.to(torch.int64))

    @property
    def n_classes(self) -> int:
        return self.W.shape[1]

    def check_model(self, d: int, batch: int, causal: bool) -> None:
        """That this head fits a model of width ``d`` run on ``batch`` sequences."""
        if self.W.shape[0] != d:
            raise InputError(
                f"Classifier W must be (d, C) with d = {d} (the model's hidden size), got "
                f"{tuple(self.W.shape)}"
            )
        if self.labels.numel() != batch:
            raise InputError(
                f"Classifier labels must have one label per sequence ({batch}), got {self.labels.numel()}"
            )
        if causal and self.pooling == "cls":
            raise InputError(
                "Classifier pooling='cls' does not fit a causal model: its first token sees "
                "only itself; use pooling='last' (or 'mean')"
            )

    # ------------------------------------------------------------------ one sequence: the Loss interface

    def at(self, Z: Tensor, index: int = 0, norm: LMHead | None = None) -> Classifier:
        """This head at sequence ``index``'s last hidden states ``Z (L, d)``, through ``norm``'s
        final norm."""
        if not 0 <= index < self.labels.numel():
            raise InputError(
                f"Classifier index must be in [0, {self.labels.numel() - 1}] (one per label), got {index}"
            )
        return replace(self, Z=Z, index=index, norm=norm)

    def at_text(self, Z: Tensor, ids: Tensor, head: LMHead | None = None, index: int = 0) -> Classifier:
        """As a whole model's objective, at sequence ``index`` (last hidden states ``Z (L, d)``, through
        the model's final norm in ``head``; its ``ids`` are not read): :meth:`at`."""
        return self.at(Z, index, head)

    @cached_property
    def _closed_form(self) -> tuple[CustomLoss, Tensor, HeadTerms]:
        if self.Z is None:
            raise unplaced(self, "value")
        return self.sequence(self.Z, int(self.labels[self.index]), self.norm)

    @property
    def value(self) -> Tensor:
        """``−log p_y`` of the sequence at ``Z``."""
        return self._closed_form[1]

    @property
    def grad(self) -> Tensor:
        """``∇_Z ℓ (L, d)``: ``w_t J_t (γ ⊙ g_z)``."""
        return self._closed_form[0].grad_Z

    @property
    def token_wise(self) -> bool:
        """``"cls"`` and ``"last"`` read one token; ``"mean"`` couples them all."""
        return self.pooling != "mean"

    def token_curvature(self) -> Tensor:
        """``(L, d, d)``: zero but at the pooled token (``"cls"``, ``"last"``)."""
        return self._closed_form[0].token_curvature()

    def product(self, dZ: Tensor) -> Tensor:
        """``N Ż`` (module docstring), ``(k, L, d) -> (k, L, d)``."""
        return self._closed_form[0].product(dZ)

    @property
    def head_terms(self) -> HeadTerms:
        """What the Hessian needs of this sequence when ``W`` and ``b`` are parameters."""
        return self._closed_form[2]

    def sequence(self, Z: Tensor, label: int, norm: LMHead | None) -> tuple[CustomLoss, Tensor, HeadTerms]:
        """The curvature (a :class:`CustomLoss`), the value and the :class:`HeadTerms` (``W``, ``b`` as
        parameters) of one sequence ``Z (L, d)`` with ``label``, through ``norm``'s final norm."""
        L, d = Z.shape
        W, b = self.W.to(Z), self.b.to(Z)
        w = Z.new_zeros(L)
        if self.pooling == "cls":
            w[0] = 1.0
        elif self.pooling == "last":
            w[-1] = 1.0
        else:
            w.fill_(1.0 / L)
        gamma = Z.new_ones(d) if norm is None or norm.gamma is None else norm.gamma.to(Z)
        if norm is None or norm.gamma is None:
            h, st = Z, None
        else:
            n, st = layernorm.value(
                Z, norm.eps, where="final norm input", centre=norm.norm_type == "layernorm"
            )
            h = gamma * n + (0.0 if norm.beta is None else norm.beta.to(Z))
        logp = torch.log_softmax((w @ h) @ W + b, -1)
        p, value = logp.exp(), -logp[label]
        r = p.clone()
        r[label] -= 1.0
        g_z, H_z = W @ r, W @ (torch.diag(p) - torch.outer(p, p)) @ W.T
        gn = w[:, None] * (gamma * g_z)  # ∂ℓ/∂n_t, (L, d)
        grad = gn if st is None else layernorm.vjp(st, gn)
        C = None if st is None else layernorm.contract_hessian(st, gn)  # (L, d, d)
        Hg = gamma[:, None] * H_z * gamma  # diag(γ) H_z diag(γ)

        def J(V: Tensor) -> Tensor:  # (k, L, d): J_t V_t
            return (
                V
                if st is None
                else layernorm.apply_jacobian(st, V.transpose(0, 1).transpose(-1, -2))
                .transpose(-1, -2)
                .transpose(0, 1)
            )

        terms = HeadTerms(w, gamma, J, w @ h, r, torch.diag(p) - torch.outer(p, p), W)
        if self.pooling != "mean":
            t = 0 if self.pooling == "cls" else L - 1
            Jt = torch.eye(d, dtype=Z.dtype, device=Z.device) if st is None else layernorm.jacobian(st)[t]
            N = Z.new_zeros(L, d, d)
            N[t] = Jt @ Hg @ Jt + (0.0 if C is None else C[t])
            return CustomLoss(grad, 0.5 * (N + N.transpose(-1, -2))), value, terms

        def product(V: Tensor) -> Tensor:
            a = (w[None, :, None] * J(V)).sum(1) @ Hg  # (k, d), Hg symmetric
            out = J(w[None, :, None] * a[:, None, :].expand_as(V))
            return out if C is None else out + torch.einsum("tij,ktj->kti", C, V)

        return CustomLoss(grad, product), value, terms


@dataclass(frozen=True, eq=False)
class HeadTerms:
    r"""What the Hessian needs of one sequence when the classifier's ``W (d, C)`` and ``b (C,)`` are
    parameters ``φ`` (``"head.W"``, ``"head.b"``), beside the curvature in ``Z`` of :meth:`Classifier.loss`.

    With the pooled ``z = Σ_t w_t h_t``, ``s = zW + b``, ``r = p − e_y``, ``A = diag p − pp^⊤``:

    .. math::
        ∇_W ℓ = z r^⊤,\qquad ∇_b ℓ = r,\qquad ṡ = z Ẇ + ḃ + ż W,\qquad
        ż = \textstyle\sum_t w_t\, γ ⊙ J_t Ż_t,

        \dot{∇_W ℓ} = ż r^⊤ + z (A ṡ)^⊤,\qquad \dot{∇_b ℓ} = A ṡ,\qquad
        \text{seed}_{Z_t} \mathrel{+}= w_t J_t\big(γ ⊙ (Ẇ r + W A (z Ẇ + ḃ))\big),

    the last the mixed ``∂²ℓ/∂Z∂φ · φ̇`` added to the sweep's seed ``Z̄̇`` (``∇²_Z ℓ · Ż`` is already
    there). Shapes carry a leading ``k`` (products at once)."""

    w: Tensor
    """``(L,)`` pooling weights."""
    gamma: Tensor
    """``(d,)`` the final norm's γ (ones without one)."""
    J: object
    """``V (k, L, d) -> J_t V_t``: the final norm's symmetric Jacobian per token (identity without one)."""
    z: Tensor
    """``(d,)`` pooled last hidden state (after the final norm)."""
    r: Tensor
    """``(C,)`` ``p − e_y``."""
    A: Tensor
    """``(C, C)`` ``diag p − pp^⊤``."""
    W: Tensor

    @property
    def gradient(self) -> dict[str, Tensor]:
        return {HEAD_W: torch.outer(self.z, self.r), HEAD_B: self.r.clone()}

    def pooled(self, dZ: Tensor) -> Tensor:
        """``Ż (k, L, d) -> ż (k, d)``."""
        return (self.w[None, :, None] * self.J(dZ)).sum(1) * self.gamma

    def seed(self, dW: Tensor | None, db: Tensor | None, L: int) -> Tensor | None:
        """The mixed seed ``(k, L, d)`` of the head's tangents ``dW (k, d, C)``, ``db (k, C)`` (None: 0)."""
        if dW is None and db is None:
            return None
        ds = 0.0
        g = 0.0
        if dW is not None:
            ds = ds + torch.einsum("i,kic->kc", self.z, dW)
            g = g + torch.einsum("kic,c->ki", dW, self.r)
        if db is not None:
            ds = ds + db
        g = g + (ds @ self.A) @ self.W.T  # A symmetric
        k = g.shape[0]
        return self.J(self.w[None, :, None] * (self.gamma * g)[:, None, :].expand(k, L, g.shape[1]))

    def head_part(self, dz: Tensor | None, dW: Tensor | None, db: Tensor | None) -> dict[str, Tensor]:
        """``{head.W: (k, d, C), head.b: (k, C)}``: the head's part of ``H v`` from the pooled tangent
        ``dz (k, d)`` (None: 0) and the head's own tangents."""
        ds = None
        for part in (
            None if dz is None else dz @ self.W,
            None if dW is None else torch.einsum("i,kic->kc", self.z, dW),
            db,
        ):
            if part is not None:
                ds = part if ds is None else ds + part
        if ds is None:
            k = 0 if dz is None else dz.shape[0]
            return {HEAD_W: self.W.new_zeros(k, *self.W.shape), HEAD_B: self.W.new_zeros(k, self.W.shape[1])}
        As = ds @ self.A
        gW = torch.einsum("i,kc->kic", self.z, As)
        if dz is not None:
            gW = gW + torch.einsum("ki,c->kic", dz, self.r)
        return {HEAD_W: gW, HEAD_B: As}


HEAD_W, HEAD_B = "head.W", "head.b"
"""The names of a :class:`Classifier`'s ``W`` and ``b`` as parameters (``MODEL.md`` part 3)."""
HEAD_NAMES = (HEAD_W, HEAD_B)
