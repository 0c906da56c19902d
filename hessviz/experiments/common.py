"""What every claim module shares: the result record, block norms, and seeded problems."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

import hessviz as hv
from hessviz.spectra import matrix_norm

CLAIM_IDS = ("xnorm6", "placement", "seqlen", "nonconvex", "ln_collapse", "bounds", "gini", "optimizers")

SOURCES = {
    "petrov": "Petrov, Kiselev, Meshkov, Grabovoy, 'Closing the Curvature Gap: Full Transformer Hessians "
    "and Their Implications for Scaling Laws', arXiv:2510.16927",
    "ormaniec": "Ormaniec, Dangel, Singh, 'What Does It Mean to Be a Transformer? Insights from a "
    "Theoretical Hessian Analysis', arXiv:2410.10986 (ICLR 2025)",
    "tomihari": "Tomihari, Sato, 'Gradient Heterogeneity Complements Hessian Heterogeneity in Transformer "
    "Optimization' (earlier version arXiv:2502.00213)",
}

SHORT = {"W_Q": "Q", "W_K": "K", "W_V": "V", "W_1": "1", "W_2": "2"}


@dataclass
class ClaimResult:
    """One claim, measured: the record of ``claims.json`` plus figures and raw data."""

    id: str
    claim: str
    source: str
    measured: dict
    holds: bool | str
    note: str
    figures: dict = field(default_factory=dict)
    """name -> plotly Figure."""
    data: dict = field(default_factory=dict)
    """name -> numpy array (written to an NPZ next to the report)."""
    seconds: float = 0.0

    def record(self) -> dict:
        return {
            "id": self.id,
            "claim": self.claim,
            "source": self.source,
            "measured": clean_measured(self.measured),
            "holds": self.holds,
            "note": self.note,
        }


def _to_number(v):
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_to_number(u) for u in np.asarray(v, dtype=float).ravel().tolist()]
    if isinstance(v, (bool, np.bool_)):
        return float(v)
    return float(v)


def clean_measured(measured: dict) -> dict:
    """Plain floats (or lists of floats); raises on anything non-finite."""
    out = {}
    for k, v in measured.items():
        num = _to_number(v)
        flat = num if isinstance(num, list) else [num]
        if not all(math.isfinite(u) for u in flat):
            raise ValueError(f"measured[{k!r}] is not finite: {v!r}")
        out[k] = num
    return out


def block_norm(res, a: str, b: str, term: str) -> float:
    """Spectral norm of one block of a :class:`~hessviz.HessianResult`."""
    return matrix_norm(res.block(a, b, term=term))


def problem(cfg: hv.BlockConfig, seed: int, input_norm: float):
    """Seeded ``(params, X, Y)``: weights ``N(0, 1/fan_in)``, ``‖X‖₂ = input_norm``."""
    params = hv.init_params(cfg, seed=seed)
    X, Y = hv.sample_inputs(cfg, seed=seed, input_norm=input_norm)
    return params, X, Y


def unit_entry_norm(cfg: hv.BlockConfig) -> float:
    """``√L + √d``: the spectral norm a Gaussian ``X`` with unit-variance entries has, roughly."""
    return math.sqrt(cfg.seq_len) + math.sqrt(cfg.d_model)


def softmax_jacobian_norm(cfg: hv.BlockConfig, params: dict, X: torch.Tensor) -> float:
    """``max_t ‖diag(a_t) − a_t a_tᵀ‖₂`` of the attention rows (``1/L`` when uniform, ``≤ 1/2``)."""
    from hessviz.block import trace
    from hessviz.components import softmax

    A = trace(cfg, params, X).attention.A
    return float(torch.linalg.matrix_norm(softmax.jacobian(A), ord=2).max())
