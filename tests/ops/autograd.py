r"""The references every op test checks against: autograd in float64, reverse mode only.

Second derivatives are reverse-over-reverse (``torch.autograd.grad`` twice): ``torch.func.hessian``
(forward over reverse) is wrong through ``F.layer_norm`` with a weight in torch 2.13.

Two checks, one per face of an op (:mod:`hessviz.ops`):

* :func:`check_node`: a :class:`~hessviz.ops.base.Node` against a stock-torch ``f(*inputs, *params)``:
  its value, ``tangent`` (JVP), ``adjoint`` (VJP) and ``adjoint_tangent`` with and without its
  second-order part, for ``k`` tangents at once, any of them ``None`` (zero);
* :func:`check_stage`: a token-wise :class:`~hessviz.ops.base.Stage` against ``f(x, *params)``: its input
  Jacobian and contracted second derivative per token, its parameter Jacobians, the mixed
  ``∂²(gᵀy)/∂x ∂θ`` and the weight-weight pieces, each written into its block as the assembler does
  (:func:`blocks`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from hessviz.dense.assembly import write_block
from hessviz.ops.base import Along
from hessviz.ops.contributions import Piece, Ref
from tests.helpers import assert_close

Maybe = Tensor | None


def randn(rng: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return scale * torch.randn(*shape, generator=rng, dtype=torch.float64)


def _leaves(args: Sequence[Tensor]) -> list[Tensor]:
    return [a.detach().clone().requires_grad_(True) for a in args]


def _or_zeros(grads: Sequence[Maybe], like: Sequence[Tensor]) -> list[Tensor]:
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, like)]


def jacobians(f: Callable[..., Tensor], args: Sequence[Tensor]) -> list[Tensor]:
    """``∂f/∂args_i``, each ``(*f.shape, *args_i.shape)`` (reverse mode)."""
    out = torch.func.jacrev(f, argnums=tuple(range(len(args))))(*args)
    return list(out)


def jvp(J: Sequence[Tensor], tangents: Sequence[Maybe]) -> Tensor:
    """``Σ_i ∂_i f ṫ_i`` from the Jacobians ``J`` (:func:`jacobians`) for ``k`` tangents at once,
    ``(k, *args_i.shape)`` each (``None``: zero): ``(k, *f.shape)``."""
    return sum(
        torch.tensordot(t, Ji, dims=([*range(1, t.dim())], [*range(Ji.dim() - t.dim() + 1, Ji.dim())]))
        for Ji, t in zip(J, tangents)
        if t is not None
    )


def vjp(f: Callable[..., Tensor], args: Sequence[Tensor], gy: Tensor) -> list[Tensor]:
    """``(∂_i f)ᵀ ȳ`` per argument."""
    xs = _leaves(args)
    grads = torch.autograd.grad((f(*xs) * gy).sum(), xs, allow_unused=True)
    return _or_zeros(grads, args)


def hvp(
    f: Callable[..., Tensor], args: Sequence[Tensor], gy: Tensor, tangents: Sequence[Maybe]
) -> list[Tensor]:
    """``∇²(ȳᵀf) ṫ`` per argument: the second-order part of the adjoint's tangent."""
    xs = _leaves(args)
    grads = torch.autograd.grad((f(*xs) * gy).sum(), xs, create_graph=True, allow_unused=True)
    inner = [
        (g * t).sum() for g, t in zip(grads, tangents) if g is not None and t is not None and g.requires_grad
    ]
    if not inner:
        return [torch.zeros_like(a) for a in args]
    return _or_zeros(torch.autograd.grad(sum(inner), xs, allow_unused=True), args)


def hessian(f: Callable[..., Tensor], args: Sequence[Tensor], gy: Tensor) -> list[list[Tensor]]:
    """``∂²(ȳᵀf)/∂args_i ∂args_j``, each ``(*args_i.shape, *args_j.shape)``, reverse over reverse."""
    xs = _leaves(args)
    grads = torch.autograd.grad((f(*xs) * gy).sum(), xs, create_graph=True, allow_unused=True)
    out = []
    for g, a in zip(grads, args):
        if g is None or not g.requires_grad:
            out.append([torch.zeros(*a.shape, *b.shape, dtype=a.dtype) for b in args])
            continue
        n = g.numel()
        rows = torch.autograd.grad(
            g.reshape(-1),
            xs,
            torch.eye(n, dtype=g.dtype),
            retain_graph=True,
            allow_unused=True,
            is_grads_batched=True,
        )
        out.append(
            [
                torch.zeros(*a.shape, *b.shape, dtype=a.dtype) if r is None else r.reshape(*a.shape, *b.shape)
                for r, b in zip(rows, args)
            ]
        )
    return out


def _stack(per_tangent: list[Tensor]) -> Tensor:
    return torch.stack(per_tangent)


def _pick(ts: Sequence[Maybe], j: int) -> list[Maybe]:
    return [None if t is None else t[j] for t in ts]


def check_node(
    node,
    f: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    params: Sequence[Tensor],
    rng: torch.Generator,
    rtol: float,
    *,
    moving: str = "xp",
    k: int = 2,
    what: str = "node",
) -> None:
    """Every rule of ``node`` against ``f(*inputs, *params)``, with ``k`` tangents along the inputs
    (``"x"`` in ``moving``) and the parameters (``"p"``); the others are ``None``."""
    args = list(inputs) + list(params)
    y = f(*args)
    assert_close(node.y, y, rtol, f"{what} value")
    dx = [randn(rng, k, *x.shape) if "x" in moving else None for x in inputs]
    dp = [randn(rng, k, *p.shape) if "p" in moving else None for p in params]
    tangents = dx + dp
    dy = node.tangent(dx, dp)
    assert_close(dy, jvp(jacobians(f, args), tangents), rtol, f"{what} tangent")

    gy = randn(rng, *y.shape)
    gx, gp = node.adjoint(gy)
    for name, got, ref in zip(node.inputs + node.params, list(gx) + list(gp), vjp(f, args, gy)):
        assert_close(got, ref, rtol, f"{what} adjoint {name}")

    dgy = randn(rng, k, *y.shape)
    for second in (False, True):
        first = [vjp(f, args, dgy[j]) for j in range(k)]
        curv = [hvp(f, args, gy, _pick(tangents, j)) if second else [0] * len(args) for j in range(k)]
        dgx, dgp = node.adjoint_tangent(Along(dgy, dx, dp, second))
        for i, (name, got) in enumerate(zip(node.inputs + node.params, list(dgx) + list(dgp))):
            ref = _stack([first[j][i] + curv[j][i] for j in range(k)])
            assert_close(got, ref, rtol, f"{what} adjoint tangent {name} (second={second})")


def per_token(J: Tensor) -> Tensor:
    """The diagonal token blocks ``(L, a, b)`` of a full ``(L, a, L, b)`` derivative."""
    return J.diagonal(dim1=0, dim2=2).permute(2, 0, 1)


def unit_shape(t: Tensor) -> tuple[int, int]:
    """A parameter unit as a matrix: a vector is one row."""
    return (1, t.shape[0]) if t.dim() == 1 else tuple(t.shape)


def blocks(pieces: list[Piece], units: dict[Ref, tuple[int, int]]) -> dict[tuple[Ref, Ref], Tensor]:
    """The 4-d block ``(α, β, α', β')`` of every pair ``a ≤ b`` of ``units`` (in their order) written from
    ``pieces`` as the assembler writes it (each piece seen from the earlier unit; zeros where none)."""
    order = {r: i for i, r in enumerate(units)}
    bucket: dict[tuple[Ref, Ref], list[Piece]] = {}
    for p in pieces:
        p = p.transposed() if order[p.a] > order[p.b] else p
        bucket.setdefault((p.a, p.b), []).append(p)
    refs = list(units)
    out = {}
    for i, a in enumerate(refs):
        for b in refs[i:]:
            block = torch.empty(*units[a], *units[b], dtype=torch.float64)
            write_block(block, bucket.get((a, b), []))
            out[(a, b)] = block
    return out


def check_pieces(
    pieces: list[Piece], units: dict[Ref, Tensor], H: list[list[Tensor]], rtol: float, what: str
) -> None:
    """The blocks written from ``pieces`` against the reference Hessian ``H`` over ``units`` (in order),
    each to ``rtol`` of itself or of the whole Hessian (a block zero in exact arithmetic, or one small
    beside the others, carries the round-off of the whole)."""
    refs = list(units)
    got = blocks(pieces, {r: unit_shape(t) for r, t in units.items()})
    scale = sum(float(torch.linalg.norm(b)) ** 2 for row in H for b in row) ** 0.5
    for i, a in enumerate(refs):
        for j in range(i, len(refs)):
            b = refs[j]
            ref = H[i][j].reshape(*unit_shape(units[a]), *unit_shape(units[b]))
            assert_close(got[(a, b)], ref, rtol, f"{what} block {a[1:]} × {b[1:]}", atol=rtol * scale)


def check_stage(
    stage,
    f: Callable[..., Tensor],
    x: Tensor,
    params: dict[Ref, Tensor],
    rng: torch.Generator,
    rtol: float,
    what: str = "stage",
) -> None:
    """A token-wise stage ``y = f(x, *params)`` against autograd: ``map``, ``jacobians``, ``mixed(g)``
    and ``functional(g)`` at a random upstream gradient ``g``."""
    refs, values = list(params), list(params.values())
    args = [x, *values]
    J = jacobians(f, args)
    L, n_out = J[0].shape[:2]
    assert_close(stage.map.jac, per_token(J[0]), rtol, f"{what} ∂y/∂x")
    g = randn(rng, L, n_out)
    H = hessian(f, args, g)
    if stage.map.contract is None:
        assert torch.count_nonzero(H[0][0]) == 0, f"{what}: no contraction stated, but ∂²y/∂x² ≠ 0"
    else:
        assert_close(stage.map.contract(g), per_token(H[0][0]), rtol, f"{what} Q(g)", atol=1e-14)
    assert set(stage.jacobians) == set(refs), f"{what}: Jacobians of {set(stage.jacobians)}, not {set(refs)}"
    mixed = stage.mixed(g)
    for i, r in enumerate(refs, start=1):
        assert_close(stage.jacobians[r].dense(), J[i].reshape(L, n_out, -1), rtol, f"{what} ∂y/∂{r[1]}")
        ref = H[0][i].reshape(L, x.shape[1], -1)
        got = mixed[r].dense() if r in mixed else torch.zeros_like(ref)
        assert_close(got, ref, rtol, f"{what} ∂²(gᵀy)/∂x∂{r[1]}", atol=1e-14)
    check_pieces(stage.functional(g), params, [row[1:] for row in H[1:]], rtol, what)
