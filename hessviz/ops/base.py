"""The two interfaces every operation speaks: a token-wise map (dense face) and a node (product face).

See :mod:`hessviz.ops` for the conventions.

A token-wise map and its derivatives are the currency of the dense chain rule.

A token-wise map sends each token's vector ``x_t (n_in)`` to ``y_t (n_out)`` on its own
(LayerNorm, the feed-forward branch, a residual sum). For the chain rule it is enough
to know, per token,

* ``jac``: the Jacobian ``∂y_t/∂x_t``, a tensor ``(L, n_out, n_in)``;
* ``contract(g)``: the second derivative contracted with an upstream gradient
  ``g (L, n_out)``: ``Σ_i g_{t,i} ∇²_{x_t} y_{t,i}``, a tensor ``(L, n_in, n_in)``,
  or ``None`` for a map that is linear in its input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from hessviz.ops.contributions import Piece, Ref
from hessviz.ops.kron import Factored


@dataclass(frozen=True)
class TokenMap:
    jac: Tensor
    contract: Callable[[Tensor], Tensor] | None = None

    def vjp(self, g: Tensor) -> Tensor:
        """``Jᵀ g``: ``(L, n_out) -> (L, n_in)``."""
        return torch.einsum("toi,to->ti", self.jac, g)


@dataclass(frozen=True)
class Stage:
    r"""A token-wise map with parameters, ``y_t = f(x_t; θ)``: everything the chain rule needs.

    * ``map``: ``∂y_t/∂x_t`` and ``Q(g) = Σ_i g_i ∇²_{x_t} y_{t,i}`` (a :class:`TokenMap`);
    * ``jacobians[r]``: ``∂y_t/∂θ_r``, factored, output index ``y`` (size ``n_out``);
    * ``mixed(g)[r]``: ``∂²(Σ_t g_tᵀ y_t)/∂x_t ∂θ_r``, factored, output index ``x`` (``n_in``);
      absent where zero;
    * ``functional(g)``: the pieces of ``∂²(Σ_t g_tᵀ y_t)/∂θ ∂θ'``.

    The gradients themselves come from the product engine's first reverse sweep
    (:attr:`hessviz.products.tape.Tape.gradients`), not from here.

    Parameters are addressed by :data:`~hessviz.ops.contributions.Ref`; the block's weight
    table says which global name each one is.
    """

    map: TokenMap
    jacobians: Mapping[Ref, Factored]
    mixed: Callable[[Tensor], dict[Ref, Factored]]
    functional: Callable[[Tensor], list[Piece]]


class Lazy(Mapping):
    """A mapping whose keys are known and whose values are computed when first read
    (a composed stage's parameter Jacobians: not formed unless a block needs them)."""

    def __init__(self, makers: dict[Ref, Callable[[], Factored]]):
        self._makers, self._values = makers, {}

    def __getitem__(self, key: Ref) -> Factored:
        if key not in self._values:
            self._values[key] = self._makers[key]()
        return self._values[key]

    def __iter__(self):
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def _nothing(g: Tensor) -> dict:
    return {}


def _no_pieces(g: Tensor) -> list:
    return []


def plain(f: TokenMap) -> Stage:
    """A token-wise map without parameters."""
    return Stage(f, {}, _nothing, _no_pieces)


@lru_cache(maxsize=64)
def _eye(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.eye(n, dtype=dtype, device=device)


def eye(n: int, like: Tensor, L: int | None = None) -> Tensor:
    """``I_n`` in the dtype and device of ``like`` (cached, read-only), or expanded to ``(L, n, n)``."""
    out = _eye(n, like.dtype, like.device)
    return out if L is None else out.expand(L, n, n)


@lru_cache(maxsize=64)
def _ones(L: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.ones(L, 1, dtype=dtype, device=device)


def ones(L: int, like: Tensor) -> Tensor:
    """``(L, 1)`` ones (cached, read-only): the vector of a bias's Kronecker term. One shared
    tensor, so term pairs of different biases are recognised as sharing it."""
    return _ones(L, like.dtype, like.device)


def identity(L: int, n: int, like: Tensor) -> TokenMap:
    """The identity map on ``n``-vectors, for ``L`` tokens."""
    return TokenMap(eye(n, like, L))


Maybe = Tensor | None
"""A tangent or adjoint; ``None`` stands for zero, and nodes skip the work it would multiply."""


def add(*terms: Maybe) -> Maybe:
    """Sum of the non-``None`` terms (``None`` when all are zero)."""
    out = None
    for t in terms:
        if t is not None:
            out = t if out is None else out + t
    return out


@dataclass(frozen=True)
class Along:
    r"""The direction of :meth:`Node.adjoint_tangent`, one argument for every node: the tangent of
    the reverse sweep is taken along ``(ȳ̇, ẋ, θ̇)``.

    * ``dgy``: ``ȳ̇``, the adjoint tangent of the node's output, ``(k, *y.shape)`` (``None``: zero);
    * ``dx``, ``dp``: the forward tangents ``ẋ_i`` of its inputs and ``θ̇`` of its parameters, in
      the order of ``Node.inputs`` and ``Node.params`` (``None``: zero);
    * ``second``: keep the second-order part ``[Σ_j (∂_j∂_i f)[ẋ_j] + (∂_θ∂_i f)[θ̇]]ᵀ ȳ`` (off for
      the Gauss–Newton term, :data:`hessviz.block.terms.SWEEP_RULES`);
    * ``need_x``, ``need_p``: which adjoint tangents the sweep reads (the others may be returned as
      ``None``); left out, all of them.
    """

    dgy: Maybe
    dx: Sequence[Maybe]
    dp: Sequence[Maybe] = ()
    second: bool = True
    need_x: Sequence[bool] = None  # type: ignore[assignment]  (filled in: all True)
    need_p: Sequence[bool] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.need_x is None:
            object.__setattr__(self, "need_x", [True] * len(self.dx))
        if self.need_p is None:
            object.__setattr__(self, "need_p", [True] * len(self.dp))

    @property
    def second_dx(self) -> Maybe:
        """``ẋ`` of a node with one input, ``None`` unless ``second`` (the tangent that only the
        second-order part reads)."""
        return self.dx[0] if self.second else None


class Node:
    """One step ``y = f(inputs; params)`` of a tape (:mod:`hessviz.products.tape`): value names
    ``inputs``, ``output`` and the parameter names ``params``; ``y`` is the primal output."""

    inputs: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    output: str = ""
    y: Tensor
    writes_into: bool = False
    """``True`` when ``adjoint_tangent`` takes ``dest``: per parameter a ``(k, *shape)`` view (or
    ``None``) to write ``θ̄̇`` into instead of allocating it (the sweep's output, so a batched
    product is written once, in place)."""
    defers_params: bool = False
    """``True`` when ``adjoint(gy, params=False)`` skips the parameter adjoints (weight-sized) and
    :meth:`parameter_adjoint` gives them when asked (:attr:`hessviz.products.tape.Tape.gradients`)."""

    def tangent(self, dx: list[Maybe], dp: list[Maybe]) -> Maybe:
        """``ẏ`` from the input tangents ``dx`` and parameter tangents ``dp`` (``k`` leading)."""
        raise NotImplementedError

    def adjoint(self, gy: Tensor) -> tuple[list[Maybe], list[Maybe]]:
        """``(x̄ per input, θ̄ per parameter)`` from ``ȳ`` at the primal point (unbatched)."""
        raise NotImplementedError

    def parameter_adjoint(self, gy: Tensor, i: int) -> Maybe:
        """``θ̄`` of parameter ``i`` from ``ȳ`` (entry ``i`` of what :meth:`adjoint` returns second)."""
        return self.adjoint(gy)[1][i]

    def adjoint_tangent(self, a: Along) -> tuple[list[Maybe], list[Maybe]]:
        """``(x̄̇, θ̄̇)`` from ``ȳ̇`` and the tangents (``a``, an :class:`Along`); the second-order part
        only when ``a.second``; entries not in ``a.need_x``/``a.need_p`` may be ``None``."""
        raise NotImplementedError
