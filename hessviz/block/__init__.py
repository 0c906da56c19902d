"""What a block is: its configuration, the placements of its norms, its weights and their order in θ,
inputs, and the names of the Hessian's terms.
"""
