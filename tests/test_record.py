"""The dense engine's reading of a block (:mod:`hessviz.dense.record`): one forward pass, folded.

``hv.hessian`` runs the block once, as the tape's nodes; the dense engine folds over the nodes each
step of the recipe appended, reading their values. These tests count what runs: each operation's
forward once per layer whatever is asked afterwards (dense terms and products alike), no forward of
the dense attention's own (its forward is the nodes': one chain of them per layer), and, for a block
of attention weights, no parameter part (Jacobians, mixed or functional pieces) of a LayerNorm or
feed-forward stage. The counts are checked to move when a block does need those parts, so the spies
cannot pass vacuously.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import hessviz as hv
from hessviz.ops import attention, attention_core, base, layernorm
from hessviz.ops.ffn import FeedForward
from hessviz.products import block
from tests.helpers import assert_close


@pytest.fixture
def spy(monkeypatch) -> Counter:
    """Counts: each forward of the attention core, of a norm and of the attention's node chain
    (:func:`hessviz.ops.attention_core.chain`, the tape's or the dense face's own); each parameter
    Jacobian read from a stage (by component), each feed-forward
    mixed or functional piece."""
    seen: Counter = Counter()

    def counting(key, real):
        def wrapped(*args, **kwargs):
            seen[key] += 1
            return real(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(
        attention_core.AttentionCore, "__init__", counting("core", attention_core.AttentionCore.__init__)
    )
    monkeypatch.setattr(layernorm, "value", counting("norm", layernorm.value))
    monkeypatch.setattr(attention_core, "chain", counting("chain", attention_core.chain))
    monkeypatch.setattr(block, "chain", counting("chain", block.chain))
    monkeypatch.setattr(attention, "chain", counting("chain", attention.chain))
    monkeypatch.setattr(FeedForward, "mixed", counting("ffn mixed", FeedForward.mixed))
    monkeypatch.setattr(FeedForward, "functional", counting("ffn functional", FeedForward.functional))
    real_read = base.Lazy.__getitem__

    def read(self, key):
        seen[f"{key[0]} jacobian"] += 1
        return real_read(self, key)

    monkeypatch.setattr(base.Lazy, "__getitem__", read)
    return seen


def _setup(cfg: hv.BlockConfig):
    params = hv.init_params(cfg, seed=0, dtype=torch.float64)
    X, Y = hv.sample_inputs(cfg, seed=1, dtype=torch.float64)
    return params, X, Y


@pytest.mark.parametrize("norm", ["post", "pre", "parallel"])
def test_one_forward_pass_serves_the_dense_terms_and_the_products(spy, norm):
    cfg = hv.BlockConfig(seq_len=4, d_model=6, d_k=3, n_heads=2, d_ff=5, norm=norm, out_proj=True)
    params, X, Y = _setup(cfg)
    res = hv.hessian(cfg, params, X, Y)
    H = res.full
    v = torch.randn(cfg.num_params, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert_close(res.matvec(v), H @ v, 1e-12, "H v")
    assert spy["core"] == 1 and spy["norm"] == 2
    assert spy["chain"] == 1  # the tape's: the dense attention read its Q, K, V, A and SA


def test_a_stack_is_folded_layer_by_layer_from_its_one_tape(spy):
    cfg = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, d_ff=3, n_layers=3, norm="pre")
    params, X, Y = _setup(cfg)
    res = hv.hessian(cfg, params, X, Y)
    H = res.full
    assert spy["core"] == 3 and spy["norm"] == 6 and spy["chain"] == 3
    assert_close(H, hv.hessian(cfg, params, X, Y, method="autograd").full, 1e-10, "stack H")


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_a_block_of_attention_weights_forms_no_norm_or_ffn_parameter_part(spy, norm):
    cfg = hv.BlockConfig(
        seq_len=4, d_model=6, d_k=3, n_heads=2, d_ff=5, norm=norm, ln_affine=True, out_proj=True
    )
    params, X, Y = _setup(cfg)
    res = hv.hessian(cfg, params, X, Y)
    for term in ("full", "outer", "functional"):
        res.block("W_Q", "W_K", term=term)
    built = {k: n for k, n in spy.items() if k.startswith(("ffn", "ln1", "ln2"))}
    assert built == {}, built
    res.block("W_1", "ln2_gamma", term="full")  # these do need them: the spies see it
    assert spy["ffn jacobian"] > 0 and spy["ln2 jacobian"] > 0 and spy["ffn mixed"] > 0


def test_the_folded_block_equals_the_tape_and_autograd():
    cfg = hv.BlockConfig(
        seq_len=4,
        d_model=6,
        d_k=4,
        n_heads=2,
        n_kv_heads=1,
        d_ff=5,
        norm="pre",
        mlp="gated",
        out_proj=True,
        norm_type="rmsnorm",
        rope=True,
        causal=True,
    )
    params, X, Y = _setup(cfg)
    from hessviz.dense.record import record

    rec = record(cfg, params, X)
    assert_close(rec.Z, hv.forward(cfg, params, X), 0.0, "Z")
    assert_close(
        hv.hessian(cfg, params, X, Y).full, hv.hessian(cfg, params, X, Y, method="autograd").full, 1e-11, "H"
    )
