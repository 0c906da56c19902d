"""``hessviz.checks.verify.compare``: closed form against autograd, each error at the result's own scale.

A view whose gradients cancel (a Post-LN block of width 2 normalises every token to ±1, so no weight
moves the output) has a Hessian of pure round-off in both methods: it agrees, at the size of the
numbers it is computed from (issue 43). A wrong formula is still seen there and in an ordinary view.
"""

from __future__ import annotations

import pytest
import torch

import hessviz as hv
from hessviz.checks import verify

SMALL = dict(seq_len=4, d_k=4, d_ff=8)


def _inputs(cfg: hv.BlockConfig):
    params = hv.init_params(cfg, seed=0)
    X, Y = hv.sample_inputs(cfg, seed=0, input_norm=1.0)
    return params, X, Y


def test_a_view_whose_gradients_cancel_agrees_to_rounding():
    cfg = hv.BlockConfig(norm="post", d_model=2, **SMALL)
    params, X, Y = _inputs(cfg)
    g = hv.gradient(cfg, params, X, Y)
    assert max(float(v.abs().max()) for v in g.values()) < 1e-12, "the premise: every gradient is zero"
    out = verify.compare(cfg, params, X, Y)
    assert out.agrees and out.worst < verify.AGREE_RTOL, out.table()


class _Wrong:
    """A closed-form result with ``delta`` added to the functional term's (and so the full's)
    ``name × name`` block, in whichever precision it was computed: a formula that is wrong."""

    def __init__(self, res, name: str, delta: float):
        self.res, self.name, self.delta = res, name, delta
        self.offsets, self.names = res.offsets, res.names

    def terms(self) -> dict[str, torch.Tensor]:
        terms = dict(self.res.terms())
        r = self.offsets[self.name]
        wrong = torch.zeros_like(terms["full"])
        wrong[r, r] = self.delta
        terms["functional"] = terms["functional"] + wrong
        terms["full"] = terms["full"] + wrong
        return terms

    def term(self, name: str) -> torch.Tensor:
        return self.terms()[name]


@pytest.mark.parametrize("d_model", [2, 8], ids=["cancelled", "ordinary"])
def test_a_wrong_block_is_still_seen(monkeypatch, d_model):
    """The error at the rounding scale: a formula wrong by 10⁻⁶ of the numbers a block is computed
    from (of its own size, in an ordinary view) is reported, in both kinds of view."""
    cfg = hv.BlockConfig(norm="post", d_model=d_model, **SMALL)
    params, X, Y = _inputs(cfg)
    right = hv.hessian(cfg, params, X, Y).terms()["full"]
    r = hv.hessian(cfg, params, X, Y).offsets["W_1"]
    single = hv.hessian(cfg, {k: v.float() for k, v in params.items()}, X.float(), Y.float())
    scale = max(
        float(torch.linalg.norm(right[r, r])),
        verify.rounding_scale(single.terms()["full"][r, r], right[r, r]),
    )
    delta = 1e-6 * scale / (r.stop - r.start)  # ‖Δ‖_F = 1e-6 · scale
    real = hv.hessian

    def wrong(*args, method="closed_form", **kw):
        res = real(*args, method=method, **kw)
        return _Wrong(res, "W_1", delta) if method == "closed_form" else res

    monkeypatch.setattr(hv, "hessian", wrong)
    out = verify.compare(cfg, params, X, Y)
    assert not out.agrees
    i = out.names.index("W_1")
    assert out.block_errors["full"][i, i] > 1e-7, out.block_errors["full"][i, i]
