"""The peers of the spectral bench rows, each on the same layer, loss and weights (benchmarks only).

Every peer gets the strongest product it can use, so the row compares eigensolvers and products,
not set-up: double backward on a gradient whose graph is **kept** across products (PyHessian's
way, :class:`~hessviz.products.autograd.AutogradProducts`), unless said otherwise.

* :func:`scipy_top`: scipy ``eigsh`` (ARPACK; what curvlinops' ``HessianLinearOperator`` is handed
  to) on those products, ``which="LA"``, the same ``tol``;
* :func:`eigenthings_top`: hessian-eigenthings' own ``lanczos`` (one Lanczos run of ``steps``
  steps with full reorthogonalisation, no restart), ``which="LA"``;
* :func:`pyhessian_top`: PyHessian's ``hessian.eigenvalues`` (power iteration with deflation,
  its defaults ``maxIter = 100``, ``tol = 1e-3``) on an ``nn.Module`` of the layer; it answers the
  largest ``|λ|`` unsorted, sorted here.

Each returns ``(values descending (k,), products)``. The imports are inside the functions: the
peers are the optional ``bench`` extra.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from hessviz.products.autograd import AutogradProducts


class Counted:
    """``v (n,) -> H v`` by kept-graph double backward, counting its products."""

    def __init__(self, cfg, params, X, Y):
        self.ag = AutogradProducts(cfg, params, X, Y)
        self.sizes = [w.numel() for w in self.ag.leaves]
        self.size = sum(self.sizes)
        self.count = 0

    def __call__(self, v: Tensor) -> Tensor:
        self.count += 1
        parts = [t.reshape(w.shape) for t, w in zip(torch.split(v, self.sizes), self.ag.leaves)]
        return torch.cat([g.reshape(-1) for g in self.ag.hvp(parts)])


def per_call_hvp(cfg, params, X, Y):
    """``v -> H v`` building the gradient's graph anew on every call (double backward per call)."""
    from hessviz import reference

    names = cfg.param_names

    def hvp(v: Tensor) -> Tensor:
        with torch.enable_grad():
            leaves = [params[n].detach().requires_grad_() for n in names]
            loss = reference.torch_loss(cfg, reference.torch_forward(cfg, dict(zip(names, leaves)), X), Y)
            grads = torch.autograd.grad(loss, leaves, create_graph=True)
            parts = [t.reshape(w.shape) for t, w in zip(torch.split(v, [w.numel() for w in leaves]), leaves)]
            return torch.cat([g.reshape(-1) for g in torch.autograd.grad(grads, leaves, parts)])

    return hvp


def scipy_top(products: Counted, k: int, tol: float, seed: int = 0) -> tuple[np.ndarray, int]:
    from scipy.sparse.linalg import LinearOperator, eigsh

    device = products.ag.leaves[0].device  # ARPACK's vectors live on the host

    def mv(x: np.ndarray) -> np.ndarray:
        return products(torch.from_numpy(np.ascontiguousarray(x.reshape(-1))).to(device)).cpu().numpy()

    op = LinearOperator((products.size, products.size), matvec=mv, dtype=np.float64)
    start = products.count
    vals = eigsh(
        op,
        k=k,
        which="LA",
        tol=tol,
        v0=np.random.default_rng(seed).standard_normal(products.size),
        return_eigenvectors=False,
    )
    return np.sort(vals)[::-1], products.count - start


def eigenthings_top(
    products: Counted, k: int, tol: float, steps: int, seed: int = 0
) -> tuple[np.ndarray, int]:
    from hessian_eigenthings import LambdaOperator, lanczos

    op = LambdaOperator(products, products.size, device=products.ag.leaves[0].device, dtype=torch.float64)
    start = products.count
    r = lanczos(op, k=k, max_iter=steps, tol=tol, reorthogonalize=True, which="LA", seed=seed)
    return np.sort(r.eigenvalues.cpu().numpy())[::-1], products.count - start


def pyhessian_top(cfg, params, X, Y, k: int) -> tuple[np.ndarray, int]:
    import importlib

    ph = importlib.import_module("pyhessian.hessian")  # the module (the package names its class so)

    from hessviz import reference

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterList(
                [torch.nn.Parameter(params[n].clone()) for n in cfg.param_names]
            )

        def forward(self, x):
            return reference.torch_forward(cfg, dict(zip(cfg.param_names, self.weights)), x[0])[None]

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # PyHessian draws its vectors in the default
    try:
        with torch.enable_grad():
            h = ph.hessian(
                Layer().to(X.device),
                torch.nn.MSELoss(),
                data=(X[None], Y[None]),
                cuda=X.device.type == "cuda",
            )
            count, hv = [0], ph.hessian_vector_product  # counted where PyHessian calls it

            def counted(*a, **kw):
                count[0] += 1
                return hv(*a, **kw)

            ph.hessian_vector_product = counted
            try:
                vals, _ = h.eigenvalues(top_n=k)
            finally:
                ph.hessian_vector_product = hv
    finally:
        torch.set_default_dtype(default)
    return np.sort(np.asarray(vals))[::-1], count[0]
