"""What the real-LLM claims read of a per-tensor table: names of layer tensors, their types, and the
unembedding's top eigenvalue in closed form (shared by :mod:`hessviz.experiments.smollm2`,
:mod:`hessviz.experiments.llm` and :mod:`hessviz.experiments.sharpness`)."""

from __future__ import annotations

import numpy as np
import torch
from scipy.sparse.linalg import eigsh

from hessviz.products.hessian_operator import scipy_view

TYPES = {
    "QK": ("W_Q", "W_K"),
    "FFN": ("W_G", "W_1", "W_2"),
    "VO": ("W_V", "W_O"),
    "Norm": ("ln1_gamma", "ln2_gamma"),
}
"""Block types of the layers (``Emb`` is the unembedding, computed apart)."""


def split_name(name: str) -> tuple[int, str, int | None]:
    """``"l3.W_Q[2]" -> (3, "W_Q", 2)``, ``"l0.ln1_gamma" -> (0, "ln1_gamma", None)``.

    >>> split_name("l3.W_Q[2]"), split_name("l0.ln1_gamma")
    ((3, 'W_Q', 2), (0, 'ln1_gamma', None))
    """
    layer, _, rest = name.partition(".")
    w, _, h = rest.partition("[")
    return int(layer[1:]), w, int(h.rstrip("]")) if h else None


def weight_rows(table: dict) -> dict[str, dict]:
    """The whole-weight rows (no head slices), in layer order."""
    rows = {n: r for n, r in table["rows"].items() if "[" not in n}
    return dict(sorted(rows.items(), key=lambda kv: split_name(kv[0])[0]))


def head_rows(table: dict) -> dict[str, dict]:
    """The per-head rows, by layer."""
    rows = {n: r for n, r in table["rows"].items() if "[" in n}
    return dict(sorted(rows.items(), key=lambda kv: split_name(kv[0])[0]))


def type_means(tops: dict[str, float]) -> dict[str, float]:
    """``{type: mean top eigenvalue}`` over the tensors of each of :data:`TYPES` present in ``tops``
    (names ``l{i}.w``).

    >>> type_means({"l0.W_Q": 1.0, "l0.W_K": 3.0, "l1.ln1_gamma": 5.0})
    {'QK': 2.0, 'Norm': 5.0}
    """
    out = {}
    for t, ws in TYPES.items():
        vals = [v for n, v in tops.items() if split_name(n)[1] in ws]
        if vals:
            out[t] = float(np.mean(vals))
    return out


# ----------------------------------------------------------------------------- the unembedding block
def unembedding_top(
    h: torch.Tensor, p: torch.Tensor, w: torch.Tensor, tol: float = 1e-6, ncv: int | None = None
) -> float:
    r"""The top eigenvalue of the loss's Hessian in the unembedding ``E (V, d)`` of
    ``ℓ = Σ_t w_t (\log\sum_v e^{(E h_t)_v} − (E h_t)_{y_t})`` (logits linear in ``E``, so exactly)

    .. math:: H = \sum_t w_t\, (\mathrm{diag}\,p_t − p_t p_t^⊤) ⊗ h_t h_t^⊤,

    ``h (T, d)`` the final-normed states, ``p (T, V)`` the softmax, ``w (T,)`` the weights. ``H``
    vanishes on every ``M`` whose rows are orthogonal to all ``h_t``, so with ``Q (d, r)`` an
    orthonormal basis of their span and ``c_t = Q^⊤ h_t``, ``H`` acts on ``W (V, r)`` (``M = W Q^⊤``)
    as ``W ↦ Σ_t w_t A_t W c_t c_t^⊤``: Lanczos (``eigsh``) on ``V·r`` instead of ``V·d`` entries,
    ``ncv`` Lanczos vectors (``eigsh``'s default when ``None``; fewer for a large vocabulary).

    >>> h, p = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]])
    >>> round(unembedding_top(h, p, torch.ones(1)), 6)   # diag p − ppᵀ has eigenvalues 0 and 0.5
    0.5
    """
    h, p, w = h.double(), p.double(), w.double()
    U, S, _ = torch.linalg.svd(h.T, full_matrices=False)
    Q = U[:, S > S[0] * 1e-10]
    C = h @ Q  # (T, r)
    V, r = p.shape[1], Q.shape[1]

    def apply(x: torch.Tensor) -> torch.Tensor:
        W = x.reshape(V, r)
        u = W @ C.T  # (V, T): W c_t
        Au = p.T * u - p.T * (p.T * u).sum(0, keepdim=True)  # A_t u_t
        return ((Au * w) @ C).reshape(-1)

    op = scipy_view((V * r, V * r), lambda X: torch.stack([apply(x) for x in X]), h)
    if V * r <= 64:
        dense = torch.stack([apply(e) for e in torch.eye(V * r, dtype=torch.float64)], 1).numpy()
        return float(np.linalg.eigvalsh(0.5 * (dense + dense.T))[-1])
    v0 = np.random.default_rng(0).standard_normal(V * r)
    return float(eigsh(op, k=1, which="LA", v0=v0, tol=tol, ncv=ncv, return_eigenvectors=False)[0])
