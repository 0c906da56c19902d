"""The papers' own protocols: the docstring task, claims ``gini_protocol`` and ``optimizers_protocol``."""

import numpy as np
import pytest
import torch

import hessviz as hv
from hessviz.experiments import docstring_task as dt
from hessviz.experiments import gini_protocol as gp
from hessviz.experiments import optimizers_protocol as op
from hessviz.pretrained.checkpoint import available_models

# ------------------------------------------------------------------ the docstring task


def test_the_docstring_task_is_deterministic_balanced_and_disjoint():
    a, b = dt.build(), dt.build.__wrapped__()  # the cached one and a fresh build
    assert a == b
    assert a.counts == {m: (dt.TRAIN_PER_CLASS, dt.PER_CLASS - dt.TRAIN_PER_CLASS) for m in dt.MODULES}
    assert min(a.available) >= dt.PER_CLASS
    texts = [e.text for e in a.train + a.validation]
    assert len(set(texts)) == len(texts), "no docstring in two places"
    assert all(len(t) >= dt.MIN_CHARS for t in texts)
    assert a.python.count(".") == 2


def test_the_docstring_task_tokenises_with_each_models_own_tokenizer():
    task = dt.build()
    ids, labels = task.ids("pydoc-postln")
    assert ids.shape == (len(task.train), dt.SEQ_LEN) and labels.tolist() == [e.label for e in task.train]
    assert torch.equal(task.ids("pydoc-preln")[0], ids)  # the pair shares its tokenizer
    v_ids, _ = task.ids("pydoc-llama", "validation")
    assert v_ids.shape == (len(task.validation), dt.SEQ_LEN)
    batches = task.batches("pydoc-postln", 8, seed=3)
    assert len(batches) == len(task.train) // 8
    rows = [x.tolist() for x, _ in batches]
    assert rows == [x.tolist() for x, _ in task.batches("pydoc-postln", 8, seed=3)]
    assert rows != [x.tolist() for x, _ in task.batches("pydoc-postln", 8, seed=4)]
    if "all-MiniLM-L6-v2" in available_models():
        m_ids, _ = task.ids("all-MiniLM-L6-v2")
        assert m_ids.shape == ids.shape and set(m_ids[:, -1].tolist()) == {102}  # ... [SEP]
    with pytest.raises(ValueError, match="split"):
        task.ids("pydoc-postln", "test")
    with pytest.raises(ValueError, match="batch"):
        task.batches("pydoc-postln", 0, seed=0)


# ------------------------------------------------------------------ gini_protocol


def test_the_22_tensors_follow_the_papers_pattern():
    assert gp.tensors(12) == tuple(f"l{i}.{w}" for i in (0, 6, 11) for w in gp.WEIGHTS)
    assert gp.tensors(4)[7] == "l2.ln1_gamma" and len(gp.tensors(6)) == 21
    model = hv.load_model("pydoc-llama")
    assert set(gp.tensors(4)) <= set(model.names)


def test_the_classifier_block_and_gradient_are_their_autograd():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    W = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    b = torch.randn(4, generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 3, 1])
    H, g = gp.head_block(z, W, b, y)

    def loss(w):
        return torch.nn.functional.cross_entropy(z @ w.reshape(5, 4) + b, y)

    torch.testing.assert_close(g.ravel(), torch.func.grad(loss)(W.ravel()), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(H, torch.func.hessian(loss)(W.ravel()), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("source", ["pydoc-postln", "pydoc-llama", gp.PERI])
def test_the_protocols_gradient_norms_are_autograds(source):
    """The closed-form per-tensor gradients (hv.model_hessian) of the Classifier objective, and the
    pooled state of the head's block, against autograd through the reference forward; also for the
    Peri-LN variant of pydoc-preln, a whole model whose every layer is ``norm="peri"``."""
    if source == gp.PERI:
        model = gp.peri_variant(hv.load_model(gp.PAIR[1]))
        assert model.cfg.norm == "peri" and all(c.norm == "peri" for c, _ in model)
        assert model.params["l1.ln2_out_gamma"].eq(1).all() and model.params["l1.ln1_out_beta"].eq(0).all()
        source = gp.PAIR[1]  # its tokenizer and batches
    else:
        model = hv.load_model(source)
    ids, labels = dt.build().batches(source, 2, seed=0)[0]
    ids = ids[:, :10]
    got = gp.gradient_norms(model, ids, labels, seed=0)
    W, b = gp.head(model.cfg.d_model, 0)
    import dataclasses

    cfg = dataclasses.replace(model.cfg, seq_len=ids.shape[1])
    names = gp.tensors(cfg.n_layers)
    params = {n: p.detach().clone().requires_grad_(n in names) for n, p in model.params.items()}
    Wr = W.clone().requires_grad_(True)
    task = op.Task(
        cfg,
        torch.stack(model.embed(ids)),
        labels,
        torch.arange(2),
        model.head if model.head is not None and model.head.gamma is not None else None,
        params,
    )
    loss = torch.nn.functional.cross_entropy(op.logits(task, params, Wr, b, task.X), labels)
    grads = torch.autograd.grad(loss, [params[n] for n in names] + [Wr])
    np.testing.assert_allclose(got, [float(g.norm()) for g in grads], rtol=1e-6)
    z = gp.pooled(gp._problem(model, ids, labels, seed=0)[0])
    torch.testing.assert_close(
        z @ W + b, op.logits(task, params, W, b, task.X).detach(), rtol=1e-6, atol=1e-7
    )


def test_gini_protocol_judge_reads_its_rule():
    m = {
        "gini_post_minus_pre_pair": 0.05,
        "gini_post_minus_pre_pair_min": 0.01,
        "gini_post_minus_pre_pair_ci": [0.02, 0.08],
        "ratio_pydoc-postln": 30.0,
        "ratio_band_pydoc-postln": [1, 2],
        "ratio_pydoc-preln": 20.0,
    }
    assert gp.judge(m).holds is True
    assert gp.judge({**m, "gini_post_minus_pre_pair_min": -0.01}).holds == "partly"
    assert gp.judge({**m, "gini_post_minus_pre_pair_min": -0.01, "ratio_pydoc-preln": 0.5}).holds is False
    no_eig = {k: v for k, v in m.items() if not k.startswith("ratio")}
    assert gp.judge(no_eig).holds == "partly"  # the Gini alone: never more than partly


@pytest.mark.slow  # one table of 22 eigenvalues: about a minute on a shared CPU
def test_the_protocols_table_top_eigenvalue_is_the_dense_blocks():
    model = hv.load_model("pydoc-preln")
    ids, labels = dt.build().batches("pydoc-preln", 1, seed=0)[0]
    ids = ids[:, :6]
    r = gp.batch_stats(model, ids, labels, seed=0)
    assert r["top"].shape == r["grad"].shape == (22,) and r["size"][-1] == 128 * len(dt.MODULES)
    W, b = gp.head(model.cfg.d_model, 0)
    res = hv.model_hessian(model, ids, objective=hv.Classifier(W, b, labels, "last"), wrt=("l0.ln1_gamma",))
    dense = res.block_operator("l0.ln1_gamma") @ np.eye(128)
    top = float(np.linalg.eigvalsh(0.5 * (dense + dense.T))[-1])
    assert abs(r["top"][0] - top) <= 1e-2 * abs(top)


@pytest.mark.slow  # two models' gradients on eight batches: half a minute
def test_gini_protocol_quick_run(claims_once):
    from hessviz.experiments.report import run_claims

    with claims_once():  # the run of test_reproduce_quick, once
        res = run_claims(True, ids=("gini_protocol",))[0]
    m = res.entry()["measured"]
    assert 0 < m["gini_pydoc-postln"] < 1 and 0 < m["gini_pydoc-preln"] < 1
    assert m["paper_gini_post_roberta"] == 0.941
    assert res.holds in (True, False, "partly") and "0.941" in res.note
    assert res.data["pydoc-postln_grad"].shape == (4, 22)


# ------------------------------------------------------------------ optimizers_protocol


def test_a_short_fine_tuning_run_lowers_the_loss_and_is_reproducible():
    task = op.task_for("pydoc-preln")
    a = op.train(task, "Adam", 1e-3, 5, seed=0)
    assert a.shape == (5 // op.EVAL_EVERY + 1,)
    assert a[-1] < a[0] and abs(a[0] - np.log(len(dt.MODULES))) < 0.1  # a fresh head starts near ln 6
    np.testing.assert_array_equal(a, op.train(task, "Adam", 1e-3, 5, seed=0))
    assert op.train(task, "SGD", 1e6, 5, seed=0)[-1] == 1e3  # diverged: held at 1e3
    with pytest.raises(ValueError, match="optimizer"):
        op.train(task, "RMSprop", 1e-3, 5, seed=0)
    assert op.steps_to(np.array([2.0, 1.5, 0.9, 0.5]), 1.0) == 2 * op.EVAL_EVERY
    assert op.steps_to(np.array([2.0, 1.5]), 1.0) == 2 * op.EVAL_EVERY


def test_optimizers_protocol_judge_and_saved_curves():
    m = {f"log_final_ratio_SGD_over_sign_{s}": v for s, v in zip(op.MODELS, (0.8, 0.3, 0.5))}
    assert op.judge(m).holds is True
    assert op.judge({**m, "log_final_ratio_SGD_over_sign_pydoc-preln": 0.9}).holds == "partly"
    assert op.judge({**m, "log_final_ratio_SGD_over_sign_pydoc-postln": -0.1}).holds is False
    data = {
        "pydoc-postln_SGD": np.ones((2, 3)),
        "pydoc-postln_Adam": np.zeros((2, 3)),
        "eval_every": np.array(5),
    }
    curves, every = op.saved_curves(data)
    assert list(curves) == ["pydoc-postln"] and list(curves["pydoc-postln"]) == ["SGD", "Adam"] and every == 5
    with pytest.raises(ValueError, match="optimizers_protocol"):
        op.saved_curves({"eval_every": np.array(5)})


@pytest.mark.slow  # two models × five optimizers, ten steps: half a minute
def test_optimizers_protocol_quick_run(claims_once):
    from hessviz.experiments.report import run_claims

    with claims_once():  # the run of test_reproduce_quick, once
        res = run_claims(True, ids=("optimizers_protocol",))[0]
    m = res.entry()["measured"]
    for s in op.PAIR:
        for o in op.OPTIMIZERS:
            assert 0 < m[f"final_loss_{s}_{o}"] < 1e3
    assert set(res.figures) == {f"optimizers_protocol_{s}" for s in op.PAIR}
    curves, _ = op.saved_curves(res.data)
    assert curves["pydoc-postln"]["SGD"].shape == (1, 10 // op.EVAL_EVERY + 1)


def test_a_text_too_short_for_a_tokenizer_is_an_error_or_left_out_on_request():
    long = dt.build().train[0]
    task = dt.DocstringTask((dt.Example("Short.", 1), long), (), (1, 1), "x")
    with pytest.raises(ValueError, match="SEQ_LEN"):
        task.ids("pydoc-postln")
    ids, labels = task.ids("pydoc-postln", drop_short=True)
    assert ids.shape == (1, dt.SEQ_LEN) and labels.tolist() == [long.label]
    assert torch.equal(ids[0], dt.build().ids("pydoc-postln")[0][0])
