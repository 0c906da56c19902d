"""The real-weights heterogeneity claim (hessviz.experiments.real_weights): a layer's blocks and
norms, and the summary, verdict and report on a small measured study (the full run is
``python -m hessviz.experiments.real_weights``, minutes on two cores)."""

from __future__ import annotations

import numpy as np
import pytest

import hessviz as hv
from hessviz.experiments import real_weights as rw
from hessviz.matfree.spectra import matrix_norm


@pytest.fixture(scope="module")
def small():
    cfg = hv.BlockConfig(
        seq_len=4,
        d_model=6,
        d_k=3,
        d_ff=8,
        n_heads=2,
        out_proj=True,
        bias=True,
        ln_affine=True,
        norm="post",
        activation="gelu",
    )
    X, _ = hv.sample_inputs(cfg, seed=1, input_norm=3.0)
    return cfg, X


def test_layer_blocks_and_norms_are_the_dense_ones(small):
    cfg, X = small
    params = hv.init_params(cfg, seed=2)
    h = rw.layer_heterogeneity(cfg, params, X, seed=0, prefix="l0.")
    assert h.names[0] == "l0.W_Q" and len(h.names) == len(rw.BLOCKS)
    _, Y = hv.sample_inputs(cfg, seed=0)
    res, grads = hv.hessian(cfg, params, X, Y), hv.gradient(cfg, params, X, Y)
    for i, b in enumerate(rw.BLOCKS):
        assert h.hess_norms[i] == pytest.approx(matrix_norm(res.block(b, b, "full")), rel=1e-6)
        assert h.grad_norms[i] == pytest.approx(float(grads[b].norm()), rel=1e-12)


def test_summary_verdict_and_report(small):
    cfg, X = small
    study = {}
    for j, model in enumerate(("pydoc-postln", "pydoc-preln")):

        def layer(seed: int, text: int):
            return rw.joined([rw.layer_heterogeneity(cfg, hv.init_params(cfg, seed=seed), X, seed=text)])

        study[model] = [
            {kind: layer(10 * j + s + k, s) for k, kind in enumerate(("trained", "random"))} for s in range(2)
        ]
    ms = rw.summarise(study)
    m = ms.numbers
    assert m["gini_pydoc-postln_trained"] == pytest.approx(
        np.mean([r["trained"].gini for r in study["pydoc-postln"]])
    )
    assert len(m["gini_post_minus_pre_trained_pair_range"]) == 2
    v = rw.judge(m)
    assert v.holds in (True, False, "partly") and "Λ_G/Λ_P" in v.rule
    note, figs = rw.report(ms, v)
    assert (
        "pydoc-postln" in note
        and "RoBERTa" in note
        and set(figs) == {"real_weights_gini", "real_weights_lambda"}
    )
