"""Configurations as data: every placement × activation × loss, odd sizes, extreme norms."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import hessviz as hv
from hessviz.block.config import ACTIVATIONS, LOSSES

NORMS = ("post", "pre", "none", "attention")
"""The placements of parts 1 and 2, drawn by :func:`random_cases` (part 3's ``parallel`` has its own
lists, ``tests/test_block_norms_ffn.py``, so these cases stay as they were)."""


@dataclass(frozen=True)
class Case:
    cfg: hv.BlockConfig
    input_norm: float = 1.0
    seed: int = 0

    @property
    def id(self) -> str:
        c = self.cfg
        return (
            f"{c.norm}-{c.activation}-{c.loss}-L{c.seq_len}-d{c.d_model}-dk{c.d_k}-ff{c.d_ff}"
            f"-eps{c.ln_eps:g}-x{self.input_norm:g}-s{self.seed}"
        )

    def inputs(self):
        params = hv.init_params(self.cfg, seed=self.seed)
        X, Y = hv.sample_inputs(self.cfg, seed=self.seed + 1, input_norm=self.input_norm)
        return params, X, Y


# every placement × activation × loss on a small block with d_k ≠ d and d_ff ≠ d
GRID = [
    Case(
        hv.BlockConfig(seq_len=5, d_model=6, d_k=3, d_ff=7, norm=n, activation=a, loss=lo),
        input_norm=x,
        seed=s,
    )
    for (n, a, lo), (x, s) in zip(
        itertools.product(("post", "pre", "none", "attention"), ("relu", "gelu"), ("mse", "ce")),
        itertools.cycle([(0.01, 0), (1.0, 1), (3.0, 2), (20.0, 3)]),
    )
]

# odd sizes: one token, d_k = 1, d_ff < d, wide d_k, LayerNorm epsilon
ODD = [
    Case(hv.BlockConfig(seq_len=1, d_model=4, d_k=2, d_ff=5, norm="post", activation="gelu")),
    Case(hv.BlockConfig(seq_len=1, d_model=3, d_k=1, d_ff=2, norm="attention", loss="ce")),
    Case(
        hv.BlockConfig(seq_len=4, d_model=5, d_k=1, d_ff=3, norm="pre", activation="gelu", loss="ce"),
        input_norm=2.0,
    ),
    Case(hv.BlockConfig(seq_len=3, d_model=6, d_k=9, d_ff=2, norm="none", activation="gelu"), input_norm=5.0),
    Case(hv.BlockConfig(seq_len=6, d_model=4, d_k=4, d_ff=3, norm="post", ln_eps=1e-3), input_norm=0.05),
    Case(
        hv.BlockConfig(
            seq_len=7, d_model=2, d_k=2, d_ff=1, norm="pre", activation="relu", loss="ce", ln_eps=0.5
        ),
        input_norm=10.0,
    ),
    # a longer sequence: the softmax curvature is never formed as (L, L, L)
    Case(
        hv.BlockConfig(seq_len=40, d_model=4, d_k=2, d_ff=3, norm="post", activation="gelu", loss="ce"),
        input_norm=6.0,
    ),
]


def random_cases(n: int, seed: int = 2026) -> list[Case]:
    """Seeded random configurations: any sizes, placements, losses, ε, ‖X‖₂ in [0.01, 20]."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        cfg = hv.BlockConfig(
            seq_len=rng.randint(1, 6),
            d_model=rng.randint(2, 7),
            d_k=rng.randint(1, 5),
            d_ff=rng.randint(1, 8),
            norm=rng.choice(NORMS),
            activation=rng.choice(ACTIVATIONS),
            loss=rng.choice(LOSSES),
            ln_eps=rng.choice((0.0, 1e-3)),
        )
        out.append(Case(cfg, input_norm=round(10 ** rng.uniform(-2, math.log10(20)), 4), seed=k))
    return out


RANDOM = random_cases(8)
ALL = GRID + ODD + RANDOM


def tiered(cases: list, fast: int, stride: int | None = None) -> list:
    """``cases`` as ``pytest.param``s, all but ``fast`` of them marked ``slow``: the fast tier keeps
    every ``stride``-th case (``len(cases) // fast`` by default), spread over the whole list so that
    each placement and option is still drawn."""
    import pytest

    stride = stride or max(1, len(cases) // fast)
    keep = set(range(0, len(cases), stride)[:fast])
    return [c if i in keep else pytest.param(c, marks=pytest.mark.slow) for i, c in enumerate(cases)]
