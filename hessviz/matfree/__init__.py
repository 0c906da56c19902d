"""Matrix-free Hessian products and the spectral tools built on them."""
