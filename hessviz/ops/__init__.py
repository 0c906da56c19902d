r"""The operations of a block, one file each, with both faces of their math.

Conventions, stated once for every operation (cf. BackPACK's ``basederivatives.py``):

* **Shapes.** ``L`` tokens, ``d`` features; a token-wise operation maps each row
  ``x_t (n_in)`` of ``X (L, n_in)`` to ``y_t (n_out)`` on its own. Weights are matrices
  ``(rows, cols)`` (a vector is the row ``(1, n)``) flattened row-major (``vec_r``).
* **Dense face** (read by the Kronecker-factored assembler, :mod:`hessviz.dense.assembly`,
  through the chain rule of :mod:`hessviz.dense.chain`):

  - the value;
  - the input Jacobian per token ``∂y_t/∂x_t``, ``(L, n_out, n_in)`` (a
    :class:`~hessviz.ops.base.TokenMap`'s ``jac``);
  - the **contracted second derivative** ``Q(g) = Σ_i g_{t,i} ∇²_{x_t} y_{t,i}``,
    ``(L, n_in, n_in)``, for an upstream gradient ``g (L, n_out)`` (the ``contract`` of a
    ``TokenMap``; ``None`` for an operation linear in its input). It is what the
    functional term needs, BackPACK's ``residual_mat_prod``;
  - for its weights (by *local* name, ``gamma``, ``fc1.weight``; :mod:`hessviz.block.weights` says
    which global name each one is): ``∂y_t/∂θ`` factored (:class:`~hessviz.ops.kron.Factored`,
    output index ``y``), the mixed ``∂²(gᵀy)/∂x ∂θ`` and the pieces of ``∂²(gᵀy)/∂θ ∂θ'``
    (a :class:`~hessviz.ops.base.Stage`).

* **Node face** (read by the product sweep, :mod:`hessviz.products.tape`): a
  :class:`~hessviz.ops.base.Node` ``y = f(x_1, …, x_m; θ)`` with unbatched primals ``(L, n)``
  and tangents that carry a leading batch axis ``k``:

  - ``tangent``: ``ẏ = Σ_i ∂_i f ẋ_i + ∂_θ f θ̇`` (JVP);
  - ``adjoint``: ``x̄_i = (∂_i f)ᵀ ȳ``, ``θ̄ = (∂_θ f)ᵀ ȳ`` (VJP, once at the primal point;
    it gives the gradients);
  - ``adjoint_tangent``: the tangent of that VJP, whose *second-order* part is the contracted
    second derivative along the tangent, ``Q(ȳ)[ẋ]``.

Where fusing matters for speed the dense face is fused inside its file: the feed-forward
branch (:mod:`~hessviz.ops.ffn`, linear ∘ activation ∘ linear), the gated one
(:mod:`~hessviz.ops.gated`, ``(φ(y W_G) ⊙ y W_1) W_2``, whose node face is the product
:class:`~hessviz.ops.gated.GatedUnit` between two ``Linear`` nodes) and multi-head attention
(:mod:`~hessviz.ops.attention`, projections ∘ score ∘ softmax ∘ values). A variant that differs
from an operation by one algebraic piece is a flag of that operation, not a second file:
RMSNorm is :mod:`~hessviz.ops.layernorm` with the centring projector ``Π`` replaced by ``I``
(``centre=False``). An elementwise
activation is a subclass of :class:`~hessviz.ops.elementwise.Elementwise` that states ``f``,
``df`` and ``d2f`` (or ``hessian_is_zero``), one row in :data:`hessviz.ops.activations.ACTIVATIONS`.
"""
