"""Matrix-free linear algebra on Hessian operators: Lanczos, stochastic Lanczos quadrature, traces,
per-block tables and the spectra of dense matrices (the products themselves: :mod:`hessviz.products`).

>>> import torch
>>> import hessviz as hv
>>> from hessviz import matfree
>>> cfg = hv.BlockConfig(seq_len=4, d_model=6, d_k=2, d_ff=8, n_heads=3, out_proj=True, bias=True)
>>> params = hv.init_params(cfg, seed=0)
>>> X, Y = hv.sample_inputs(cfg, seed=0)
>>> res = hv.hessian(cfg, params, X, Y)            # no dense term is formed
>>> res.matvec(torch.ones(res.size, dtype=torch.float64)).shape == (res.size,)
True
>>> top = matfree.top_eigenvalues(res, "full", k=2)
>>> table = matfree.block_table(res, "full")        # every weight, every head
>>> [r.name for r in table.rows][:4]
['W_Q[0]', 'W_Q[1]', 'W_Q[2]', 'b_Q[0]']
"""

from hessviz.matfree.report import spectrum_figure, spectrum_report
from hessviz.matfree.spectral import (
    BlockStats,
    BlockTable,
    Density,
    Eigenpairs,
    TraceEstimate,
    block_names,
    block_table,
    density,
    eigenpairs,
    top_eigenvalues,
    trace,
)

__all__ = [
    "BlockStats",
    "BlockTable",
    "Density",
    "Eigenpairs",
    "TraceEstimate",
    "block_names",
    "block_table",
    "density",
    "eigenpairs",
    "spectrum_figure",
    "spectrum_report",
    "top_eigenvalues",
    "trace",
]
