r"""A loss given from outside by its gradient and curvature in ``Z``: :class:`CustomLoss`.

hessviz needs two things of a loss ``ℓ(Z)`` at the block's output ``Z (L, d)``: the gradient
``g = ∇_Z ℓ (L, d)`` and the curvature ``N = ∇²_Z ℓ``, an ``(L·d × L·d)`` matrix in ``vec_r``
order of ``Z`` (row ``t·d + j`` is feature ``j`` of token ``t``). The built-in losses are sums
over tokens, so their ``N`` is block diagonal, one ``(d, d)`` block per token. A real objective
need not be: a mean-pooled sentence embedding, a loss on the last token after attention, or
any loss after further layers couples tokens. :class:`CustomLoss` takes ``N`` in one of three
forms:

=========================  ====================================================================
``hess_Z``                 meaning
=========================  ====================================================================
``(L, d, d)`` tensor       token-wise: ``N = blockdiag(N_1 … N_L)`` (the fast path of one block)
``(L·d, L·d)`` tensor      dense, coupling tokens
callable                   ``Ż (k, L, d) ↦ N Ż (k, L, d)``, for matrix-free products; a dense
                           term reads ``N`` column by column (``L·d`` products)
=========================  ====================================================================

Every Hessian term follows from ``g`` and ``N`` alone (``H = Jᵀ N J + Σ_i g_i ∇²_θ Z_i``): the
``outer`` term carries ``N``, the ``functional`` term ``g``. The value of ``ℓ`` is not needed.

The autograd reference (``method="autograd"``) differentiates the second-order model
``ℓ̃(Z') = ⟨g, Z' − Z⟩ + ½ vec(Z' − Z)ᵀ N vec(Z' − Z)``, whose gradient and Hessian at ``Z``
are ``g`` and ``N``: the Hessian in the weights at the point is the same.

Validation (:meth:`CustomLoss.checked`): shapes against the config, finite values, and
symmetry (``‖N − Nᵀ‖_max ≤ tol·‖N‖_max``, ``tol`` = 1e-8 in float64, 1e-4 in float32; a
callable is probed with two random directions); each failure is an :class:`InputError`
naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from hessviz.errors import InputError
from hessviz.losses.base import Loss

SYMMETRY_TOL = {torch.float64: 1e-8, torch.float32: 1e-4}
"""Largest allowed ``max|N − Nᵀ| / max|N|`` per dtype."""

KINDS = ("token", "dense", "operator")


@dataclass(frozen=True, eq=False)
class CustomLoss(Loss):
    """A loss by its gradient ``grad_Z (L, d)`` and curvature ``hess_Z`` in ``Z``.

    ``hess_Z`` is token-wise ``(L, d, d)``, dense ``(L·d, L·d)`` in ``vec_r`` order of ``Z``, or a
    callable ``Ż (k, L, d) -> N Ż (k, L, d)``. Pass it as ``hv.hessian(cfg, params, X,
    loss=hv.CustomLoss(g, N))`` (no ``Y``). ``Z`` is the point it was computed at, set by the API.
    Its value is not known (nothing needs it): :attr:`value` is an error.
    """

    grad_Z: Tensor
    hess_Z: Tensor | Callable[[Tensor], Tensor]
    Z: Tensor | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ the Loss interface

    @property
    def grad(self) -> Tensor:
        """``grad_Z (L, d)``."""
        return self.grad_Z

    @property
    def value(self) -> Tensor:
        raise InputError("a CustomLoss has no value: it is given by its gradient and curvature in Z alone")

    @property
    def token_wise(self) -> bool:
        return self.kind == "token"

    def at(self, Z: Tensor) -> CustomLoss:
        """Given at its point: itself, bound to ``Z`` if it was not yet (:meth:`checked` binds it)."""
        return self if self.Z is not None else CustomLoss(self.grad_Z, self.hess_Z, Z.detach())

    def token_curvature(self) -> Tensor:
        """``hess_Z (L, d, d)`` when token-wise; an error when it couples tokens."""
        if self.kind != "token":
            raise ValueError("the curvature of this custom loss couples tokens: it has no (L, d, d) form")
        return self.hess_Z

    def reference_value(self, Z: Tensor) -> Tensor:
        """Its second-order model at ``Z'`` (:meth:`model`)."""
        return self.model(Z)

    @property
    def kind(self) -> str:
        """``"token"`` ``(L, d, d)``, ``"dense"`` ``(L·d, L·d)`` or ``"operator"`` (a callable)."""
        if callable(self.hess_Z) and not isinstance(self.hess_Z, Tensor):
            return "operator"
        return "token" if self.hess_Z.ndim == 3 else "dense"

    # ------------------------------------------------------------------ validation

    def checked(
        self, L: int, d: int, dtype: torch.dtype, device: torch.device, Z: Tensor, probe: bool = True
    ) -> CustomLoss:
        """This loss checked against ``Z (L, d)`` and cast to ``dtype`` and ``device``; bound to ``Z``.
        ``probe=False`` skips the two-direction probe of a callable curvature (its shapes and
        symmetry): for hessviz's own objectives' products (:attr:`~hessviz.losses.objective.ModelObjective.
        exact_curvature`), checked against autograd by their tests, whose probe cost two product
        columns through the head at every build (a sixth of SmolLM2's set-up at 64 tokens, issue 47)."""
        g = _tensor("grad_Z", self.grad_Z, (L, d), dtype, device)
        if isinstance(self.hess_Z, Tensor):
            if self.hess_Z.ndim == 3:
                N = _tensor("hess_Z", self.hess_Z, (L, d, d), dtype, device)
                _check_symmetric("hess_Z", N, N.transpose(-1, -2))
            elif self.hess_Z.ndim == 2:
                N = _tensor("hess_Z", self.hess_Z, (L * d, L * d), dtype, device)
                _check_symmetric("hess_Z", N, N.T)
            else:
                raise InputError(
                    f"hess_Z must have shape (L, d, d) = {(L, d, d)} (token-wise) or "
                    f"(L*d, L*d) = {(L * d, L * d)} (dense), got {tuple(self.hess_Z.shape)}"
                )
            N = 0.5 * (N + N.transpose(-1, -2))
        elif callable(self.hess_Z):
            N = self.hess_Z
            if probe:
                _probe("hess_Z", N, L, d, dtype, device)
        else:
            raise InputError(
                f"hess_Z must be a torch.Tensor of shape (L, d, d) or (L*d, L*d), or a callable "
                f"(k, L, d) -> (k, L, d), got {type(self.hess_Z).__name__}"
            )
        return CustomLoss(g, N, Z.detach())

    # ------------------------------------------------------------------ the curvature

    def product(self, dZ: Tensor) -> Tensor:
        """``N Ż`` for ``Ż (k, L, d)``."""
        k, L, d = dZ.shape
        if self.kind == "operator":
            out = self.hess_Z(dZ)
            if not isinstance(out, Tensor) or tuple(out.shape) != (k, L, d):
                raise InputError(
                    f"hess_Z(dZ) must return a tensor of shape {(k, L, d)}, got "
                    f"{getattr(out, 'shape', type(out).__name__)}"
                )
            return out
        if self.kind == "token":
            t = self._curved_tokens
            if t is None:
                return torch.einsum("tij,ktj->kti", self.hess_Z, dZ)
            out = dZ.new_zeros(k, L, d)
            out[:, t] = torch.einsum("tij,ktj->kti", self.hess_Z[t], dZ[:, t])
            return out
        return (dZ.reshape(k, L * d) @ self.hess_Z).reshape(k, L, d)  # N symmetric

    @cached_property
    def _curved_tokens(self) -> Tensor | None:
        """The tokens ``t`` whose block ``N_t`` is not all zero, when some are (a loss on one pooled
        token, a classifier on ``[CLS]``: ``N Ż`` then costs one ``d × d`` block, not ``L``); ``None``
        when every block is curved."""
        t = self.hess_Z.flatten(1).ne(0).any(1).nonzero().flatten()
        return None if t.numel() == self.hess_Z.shape[0] else t

    @cached_property
    def read_tokens(self) -> Tensor | None:
        """The tokens ``R`` outside which the gradient and the curvature are exactly zero, when they are
        not all of them (a classifier on ``[CLS]``: ``R = [0]``): the Hessian then depends on those
        tokens of ``Z`` alone (:meth:`restricted`). ``None`` when every token is read, or for a callable
        curvature (its zeros are not known)."""
        if self.kind == "operator":
            return None
        L, d = self.grad_Z.shape
        N = self.hess_Z.flatten(1) if self.kind == "token" else self.hess_Z.reshape(L, -1)
        read = (self.grad_Z.ne(0).any(1) | N.ne(0).any(1)).nonzero().flatten()
        return None if read.numel() == L else read

    def restricted(self, tokens: Tensor) -> CustomLoss:
        """This loss on the tokens ``tokens`` of ``Z`` alone: ``grad_Z[tokens]`` and the curvature among them
        (exact for the Hessian when the rest is zero, :attr:`read_tokens`)."""
        L, d = self.grad_Z.shape
        if self.kind == "token":
            N = self.hess_Z[tokens]
        elif self.kind == "dense":
            flat = (tokens[:, None] * d + torch.arange(d, device=tokens.device)).flatten()
            N = self.hess_Z[flat][:, flat]
        else:
            raise InputError("a CustomLoss with a callable hess_Z cannot be restricted to some tokens")
        return CustomLoss(self.grad_Z[tokens], N, None if self.Z is None else self.Z[tokens])

    def dense_hessian(self) -> Tensor:
        """``N (L·d, L·d)``: block diagonal from token-wise blocks, read column by column from a
        callable (once, then kept)."""
        return self._dense

    @cached_property
    def _dense(self) -> Tensor:
        L, d = self.grad_Z.shape
        if self.kind == "dense":
            return self.hess_Z
        if self.kind == "token":
            return torch.block_diag(*self.hess_Z)
        eye = torch.eye(L * d, dtype=self.grad_Z.dtype, device=self.grad_Z.device)
        N = self.product(eye.reshape(L * d, L, d)).reshape(L * d, L * d)
        _check_symmetric("hess_Z", N, N.T)
        return 0.5 * (N + N.T)

    def model(self, Z: Tensor) -> Tensor:
        """``ℓ̃(Z') = ⟨g, Z' − Z⟩ + ½ vec(Z' − Z)ᵀ N vec(Z' − Z)`` (the autograd reference's loss)."""
        delta = (Z - self.Z).reshape(-1)
        return (self.grad_Z.reshape(-1) * delta).sum() + 0.5 * delta @ (self.dense_hessian() @ delta)


def _tensor(name: str, t: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    if not isinstance(t, Tensor):
        raise InputError(f"{name} must be a torch.Tensor of shape {shape}, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise InputError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if not t.is_floating_point():
        raise InputError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not torch.isfinite(t).all():
        raise InputError(f"{name} has non-finite entries (nan or inf)")
    return t.to(dtype=dtype, device=device)


def _check_symmetric(name: str, N: Tensor, Nt: Tensor) -> None:
    scale = float(N.abs().max()) if N.numel() else 0.0
    gap = float((N - Nt).abs().max()) if N.numel() else 0.0
    tol = SYMMETRY_TOL.get(N.dtype, 1e-4)
    if gap > tol * max(scale, 1e-300):
        raise InputError(
            f"{name} must be symmetric (a Hessian): max|N - Nᵀ| = {gap:.3g} exceeds "
            f"{tol:g} × max|N| = {tol * scale:.3g}"
        )


def _probe(
    name: str, op: Callable[[Tensor], Tensor], L: int, d: int, dtype: torch.dtype, device: torch.device
) -> None:
    """Check a callable curvature on two seeded random directions: shape, finiteness, ``uᵀNv = vᵀNu``."""
    gen = torch.Generator().manual_seed(0)
    U = torch.randn(2, L, d, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    out = op(U)
    if not isinstance(out, Tensor) or tuple(out.shape) != (2, L, d):
        raise InputError(
            f"{name}(dZ) must map a (k, L, d) = {(2, L, d)} tensor to the same shape, got "
            f"{getattr(out, 'shape', type(out).__name__)}"
        )
    if not torch.isfinite(out).all():
        raise InputError(f"{name}(dZ) returned non-finite entries (nan or inf)")
    uNv, vNu = float((U[0] * out[1]).sum()), float((U[1] * out[0]).sum())
    scale = float(U[0].norm() * out[1].norm() + U[1].norm() * out[0].norm())
    tol = SYMMETRY_TOL.get(dtype, 1e-4)
    if abs(uNv - vNu) > tol * max(scale, 1e-300):
        raise InputError(
            f"{name} must be symmetric (a Hessian): on two random directions uᵀNv = {uNv:.6g} "
            f"but vᵀNu = {vNu:.6g}"
        )
