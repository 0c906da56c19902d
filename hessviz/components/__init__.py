"""The components of a block, one module each.

Every component offers the same three things, batched over leading dimensions:

* its value,
* its Jacobian, as a matrix per row or applied to a matrix,
* its second derivative contracted with an upstream gradient ``g``:
  ``Q(g)[k, l] = Σ_i g_i ∂²y_i / ∂x_k ∂x_l`` (a symmetric matrix per row).
"""
