"""Whole models under their own objectives (``MODEL.md`` part 3, "Whole models"): ``hv.load_model``,
``hv.model_hessian`` and ``hv.Classifier`` against double-backward products through ``transformers``'
own models (tiny random models saved with ``save_pretrained``; nothing downloaded).

GPT-2 and BERT compute everything in float64 (``TIGHT``); Llama's RMSNorm and rotary angles are
float32 inside ``transformers`` (``LOOSE``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import hessviz as hv
from hessviz import matfree
from hessviz.errors import ConfigError, InputError, ModelRangeError
from hessviz.pretrained import load as pl
from hessviz.runtime.tasks import shipped
from hessviz.whole.table import tensor_table
from tests.test_pretrained import randomise

transformers = pytest.importorskip("transformers")

D, HEADS, DK, FF, VOCAB, POSITIONS = 12, 3, 4, 20, 30, 16
TIGHT, LOOSE = 1e-10, 1e-6
IDS = torch.tensor([[3, 17, 5, 29, 11, 2], [7, 1, 22, 9, 14, 4]])

CONFIGS = {
    "gpt2": (
        "GPT2LMHeadModel",
        lambda: transformers.GPT2Config(
            vocab_size=VOCAB,
            n_embd=D,
            n_layer=2,
            n_head=HEADS,
            n_inner=FF,
            n_positions=POSITIONS,
            layer_norm_epsilon=1e-5,
            activation_function="gelu_new",
        ),
    ),
    "llama": (
        "LlamaForCausalLM",
        lambda: transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=FF,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            num_key_value_heads=HEADS,
            max_position_embeddings=POSITIONS,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        ),
    ),
    "bert": (
        "BertModel",
        lambda: transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            intermediate_size=FF,
            max_position_embeddings=POSITIONS,
            hidden_act="gelu",
            layer_norm_eps=1e-12,
        ),
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("whole")
    out = {}
    for i, (name, (cls, config)) in enumerate(CONFIGS.items()):
        model = getattr(transformers, cls)(config())
        randomise(model, seed=10 + i)
        model.save_pretrained(root / name)
        out[name] = root / name
    return out


def reference(folder: Path, name: str) -> torch.nn.Module:
    cls = getattr(transformers, CONFIGS[name][0])
    return cls.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="sdpa", local_files_only=True
    ).eval()


def where(name: str, hv_name: str):
    """``(key of the transformers parameter, view of it in hessviz orientation)`` for a layer weight
    or head slice ``l{i}.W…[h]`` (only the weights these tests use)."""
    layer, local = hv_name.split(".", 1)
    i = int(layer[1:])
    base, _, head = local.partition("[")
    cols = slice(None) if not head else slice(int(head[:-1]) * DK, (int(head[:-1]) + 1) * DK)
    if name == "gpt2":
        p = f"transformer.h.{i}."
        table = {
            "W_Q": (p + "attn.c_attn.weight", lambda T: T[:, :D][:, cols]),
            "W_V": (p + "attn.c_attn.weight", lambda T: T[:, 2 * D :][:, cols]),
            "W_2": (p + "mlp.c_proj.weight", lambda T: T),
            "ln2_gamma": (p + "ln_2.weight", lambda T: T),
        }
    elif name == "llama":
        p = f"model.layers.{i}."
        table = {
            "W_Q": (p + "self_attn.q_proj.weight", lambda T: T.T[:, cols]),
            "W_G": (p + "mlp.gate_proj.weight", lambda T: T.T),
            "ln2_gamma": (p + "post_attention_layernorm.weight", lambda T: T),
        }
    else:
        p = f"encoder.layer.{i}."
        table = {
            "W_K": (p + "attention.self.key.weight", lambda T: T.T[:, cols]),
            "W_1": (p + "intermediate.dense.weight", lambda T: T.T),
        }
    return table[base]


def autograd_hvp(
    model: torch.nn.Module, name: str, names: tuple[str, ...], offsets: dict, loss_of, v: torch.Tensor
) -> torch.Tensor:
    """``H v`` by double backward of ``loss_of(model)`` in the named slices of the model's parameters."""
    params = dict(model.named_parameters())
    keys = sorted({where(name, n)[0] for n in names})
    tangents = {k: torch.zeros_like(params[k]) for k in keys}
    for n in names:
        key, view = where(name, n)
        view(tangents[key]).copy_(v[offsets[n]].reshape(view(tangents[key]).shape))
    with sdpa_kernel(SDPBackend.MATH):  # the fused CPU kernel has no double backward
        loss = loss_of(model)
        grads = torch.autograd.grad(loss, [params[k] for k in keys], create_graph=True)
        dot = sum((g * tangents[k]).sum() for g, k in zip(grads, keys))
        hv_ = dict(zip(keys, torch.autograd.grad(dot, [params[k] for k in keys])))
    return torch.cat([where(name, n)[1](hv_[where(name, n)[0]]).reshape(-1) for n in names])


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def check_products(
    folder: Path, name: str, ids: torch.Tensor, objective, wrt: tuple[str, ...], loss_of, tol: float
) -> hv.ModelHessian:
    model = hv.load_model(folder)
    res = hv.model_hessian(model, ids, objective=objective, wrt=wrt)
    ref = reference(folder, name)
    with torch.no_grad():
        assert abs(float(res.value) - float(loss_of(ref))) <= tol * abs(float(res.value))
    offsets = res.cfg.offsets(res.names)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        v = torch.randn(res.size, generator=gen, dtype=torch.float64)
        assert relative(res.matvec(v), autograd_hvp(ref, name, res.names, offsets, loss_of, v)) <= tol
    return res


def next_token(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``…ForCausalLM(labels=ids)``'s loss in float64 (``transformers`` casts the logits to float32
    for it): the mean cross-entropy of positions ``0 … L−2`` predicting ``ids[:, 1:]``."""
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def test_gpt2_next_token_batch_matches_transformers(folders):
    res = check_products(
        folders["gpt2"],
        "gpt2",
        IDS,
        "next_token",
        ("l1.W_2", "l0.W_Q[1]", "l1.ln2_gamma"),
        lambda m: next_token(m, IDS),
        TIGHT,
    )
    assert res.names == ("l0.W_Q[1]", "l1.ln2_gamma", "l1.W_2")  # θ order
    with torch.no_grad():  # the same as labels=ids
        hf = reference(folders["gpt2"], "gpt2")(input_ids=IDS, labels=IDS).loss
        assert abs(float(res.value) - float(hf)) <= 1e-6 * float(res.value)


def test_llama_next_token_matches_transformers(folders):
    ids = IDS[0]
    check_products(
        folders["llama"],
        "llama",
        ids,
        "next_token",
        ("l0.W_Q[2]", "l1.W_G", "l0.ln2_gamma"),
        lambda m: m(input_ids=ids[None], labels=ids[None]).loss,
        LOOSE,
    )


def classifier(d: int, labels: list[int], pooling: str) -> hv.Classifier:
    gen = torch.Generator().manual_seed(3)
    W = torch.randn(d, 4, generator=gen, dtype=torch.float64)
    return hv.Classifier(W, 0.1 * torch.randn(4, generator=gen, dtype=torch.float64), labels, pooling)


def pooled_ce(hidden: torch.Tensor, head: hv.Classifier) -> torch.Tensor:
    pooled = {"cls": hidden[:, 0], "last": hidden[:, -1], "mean": hidden.mean(1)}[head.pooling]
    return torch.nn.functional.cross_entropy(pooled @ head.W + head.b, head.labels)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_gpt2_classifier_matches_transformers(folders, pooling):
    head = classifier(D, [1, 3], pooling)  # through ln_f: GPT2Model's last state
    check_products(
        folders["gpt2"],
        "gpt2",
        IDS,
        head,
        ("l0.W_V[2]", "l1.W_2"),
        lambda m: pooled_ce(m.transformer(input_ids=IDS).last_hidden_state, head),
        TIGHT,
    )


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_bert_classifier_matches_transformers(folders, pooling):
    head = classifier(D, [2, 0], pooling)
    check_products(
        folders["bert"],
        "bert",
        IDS,
        head,
        ("l0.W_K[0]", "l1.W_1"),
        lambda m: pooled_ce(m(input_ids=IDS).last_hidden_state, head),
        TIGHT,
    )


def test_gradient_spectral_tools_and_dense_agree(folders):
    model = hv.load_model(folders["gpt2"])
    res = hv.model_hessian(model, IDS, wrt=("l0.W_Q[0]", "l1.ln2_gamma"))
    H = res.dense("full")
    E = torch.eye(res.size, dtype=torch.float64)
    assert torch.allclose(res.matvec(E), H, rtol=0, atol=1e-12 * float(H.abs().max()))
    outer, functional = res.matvec(E, "outer"), res.matvec(E, "functional")
    assert torch.allclose(outer + functional, H, rtol=0, atol=1e-12 * float(H.abs().max()))
    top = matfree.top_eigenvalues(res, "full", k=2)
    assert np.allclose(top, torch.linalg.eigvalsh(H).flip(0)[:2].numpy(), rtol=1e-8)
    op = res.block_operator("l1.ln2_gamma")
    x = np.ones(D)
    assert np.allclose(op.matvec(x), H[-D:, -D:].numpy() @ x, rtol=1e-10)
    assert np.allclose(res.linear_operator().matvec(E[0].numpy()), H[:, 0].numpy(), rtol=1e-10)
    table = matfree.block_table(hv.model_hessian(model, IDS, wrt=("l1.ln2_gamma",)), "full")
    assert table.rows[0].name == "l1.ln2_gamma"
    exact = float(torch.linalg.eigvalsh(H[-D:, -D:])[-1])
    assert abs(table.rows[0].top - exact) <= 1e-9 * abs(exact)
    # the gradient against transformers
    ref = reference(folders["gpt2"], "gpt2")
    loss = next_token(ref, IDS)
    key, view = where("gpt2", "l1.ln2_gamma")
    (g,) = torch.autograd.grad(loss, [dict(ref.named_parameters())[key]])
    assert relative(res.gradient("l1.ln2_gamma")["l1.ln2_gamma"], view(g)) <= TIGHT


def test_model_is_still_the_list_of_layers(folders):
    model = hv.load_model(folders["gpt2"])
    old = pl.load_model(folders["gpt2"])
    assert len(model) == len(old) == 2 and model.names[0] == "l0.ln1_gamma"
    assert all(torch.equal(model[i][1][n], old[i][1][n]) for i in range(2) for n in old[i][1])
    kept = pl.hidden_states(folders["gpt2"], IDS[0].tolist(), layers=model)
    assert all(torch.equal(a, b) for a, b in zip(kept, pl.hidden_states(folders["gpt2"], IDS[0].tolist())))
    assert hv.load_model(folders["bert"]).head is None


def test_bad_input_names_the_field(folders):
    gpt2, bert = hv.load_model(folders["gpt2"]), hv.load_model(folders["bert"])
    with pytest.raises(ConfigError, match="n_layers = 2"):
        hv.model_hessian(gpt2, IDS, wrt=("l5.W_Q",))
    with pytest.raises(ConfigError, match="has no head W and b"):
        hv.model_hessian(gpt2, IDS, wrt=("l0.W_Q", "head.W"))
    with pytest.raises(ConfigError, match="'head.W', 'head.b'"):
        hv.model_hessian(bert, IDS, objective=classifier(D, [1, 2], "cls"), wrt=("l0.W_Q", "head.gamma"))
    with pytest.raises(ConfigError, match="term 'outer' with the head's weights"):
        hv.model_hessian(bert, IDS, objective=classifier(D, [1, 2], "cls"), wrt=("head.b",)).matvec(
            torch.ones(4, dtype=torch.float64), "outer"
        )
    with pytest.raises(ConfigError, match="W_Z"):
        hv.model_hessian(gpt2, IDS, wrt=("l0.W_Z",))
    with pytest.raises(InputError, match="labels must be in"):
        hv.Classifier(torch.zeros(D, 4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), [0, 4])
    with pytest.raises(InputError, match="one label per sequence"):
        hv.model_hessian(bert, IDS, objective=classifier(D, [1], "cls"))
    with pytest.raises(InputError, match="d = 12"):
        hv.model_hessian(bert, IDS, objective=classifier(D + 1, [1, 2], "cls"))
    with pytest.raises(InputError, match="encoder"):
        hv.model_hessian(bert, IDS)
    with pytest.raises(InputError, match="causal"):
        hv.model_hessian(gpt2, IDS, objective=classifier(D, [1, 2], "cls"))
    with pytest.raises(InputError, match=r"shape \(L,\) or \(B, L\)"):
        hv.model_hessian(gpt2, IDS[None])
    with pytest.raises(InputError, match="integer tensor"):
        hv.model_hessian(gpt2, IDS.double())
    with pytest.raises(InputError, match="token ids must be in|token ids in"):
        hv.model_hessian(gpt2, IDS + VOCAB)
    with pytest.raises(ModelRangeError, match="sequence length"):
        hv.model_hessian(gpt2, torch.zeros(POSITIONS + 1, dtype=torch.int64))
    with pytest.raises(InputError, match="objective must be"):
        hv.model_hessian(gpt2, IDS, objective="cosine")


def test_the_next_token_objective_is_an_object(folders):
    """``objective=hv.NextToken()`` is ``"next_token"``: the string becomes that object once, at the
    entry, with the same products to the bit (a ``chunk`` reaches every sequence); one sequence's
    placed ``NextToken`` is not a batch's objective."""
    gpt2 = hv.load_model(folders["gpt2"])
    wrt = ("l0.W_Q[1]", "l1.W_2")
    named = hv.model_hessian(gpt2, IDS, "next_token", wrt)
    obj = hv.model_hessian(gpt2, IDS, hv.NextToken(), wrt)
    chunked = hv.model_hessian(gpt2, IDS, hv.NextToken(chunk=2), wrt)
    assert isinstance(named.problem.objective, hv.NextToken) and named.info == obj.info
    assert named.info.startswith("next_token over")
    v = torch.randn(named.size, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(named.matvec(v), obj.matvec(v)) and float(named.value) == float(obj.value)
    assert relative(chunked.matvec(v), named.matvec(v)) < 1e-13
    placed = hv.NextToken(torch.zeros(IDS.shape[1], D, dtype=torch.float64), IDS[0], gpt2.head)
    with pytest.raises(InputError, match="objective must be 'next_token', hv.NextToken()"):
        hv.model_hessian(gpt2, IDS, placed, wrt)
    with pytest.raises(InputError, match="has no point yet"):
        _ = hv.NextToken().value
    with pytest.raises(InputError, match="chunk must be"):
        hv.NextToken(chunk=0)


def test_only_the_entry_reads_the_objectives_name():
    """No module of ``hessviz/whole/`` compares anything with ``"next_token"``: the name is looked up
    once (:func:`hessviz.losses.names.whole_objective`) and the code below holds the object."""
    import ast

    from tests.test_imports import ROOT, _compared_strings

    found = {
        p.name: hits
        for p in (ROOT / "whole").glob("*.py")
        if (hits := [line for line, s in _compared_strings(ast.parse(p.read_text())) if s == "next_token"])
    }
    assert found == {}
    assert _compared_strings(ast.parse('if objective == "next_token":\n    pass')) == [(1, "next_token")]


# ----------------------------------------------------------------------------- the per-tensor table


def table_problem(folders) -> hv.ModelHessian:
    model = hv.load_model(folders["gpt2"])
    return hv.model_hessian(model, IDS, wrt=("l0.W_Q", "l0.ln1_gamma", "l1.W_O", "l1.W_1"))


TABLE = dict(by_head=True, trace_samples=9, exact_limit=20, seed=3)


def test_tensor_table_rows_match_the_blocks(folders):
    res = table_problem(folders)
    table = tensor_table(res, **TABLE)
    assert [r.name for r in table.rows] == [
        "l0.ln1_gamma",
        "l0.W_Q[0]",
        "l0.W_Q[1]",
        "l0.W_Q[2]",
        "l1.W_O[0]",
        "l1.W_O[1]",
        "l1.W_O[2]",
        "l1.W_1",
    ]
    assert [r.exact for r in table.rows] == [True] + [False] * 7 and table.matvecs > 0
    for r in (table.rows[0], table.rows[2]):  # one exact, one by Lanczos
        Hb = res.matvec(torch.eye(r.size, dtype=torch.float64), rows=(r.name,), cols=(r.name,))
        vals = torch.linalg.eigvalsh(0.5 * (Hb + Hb.T))
        assert abs(r.top - float(vals[-1])) <= 1e-6 * abs(r.top)
        assert abs(r.trace - float(vals.sum())) <= (1e-10 if r.exact else 4 * r.trace_stderr + 1e-12)
        g = res.gradient((r.name,))[r.name]
        assert r.grad_norm == pytest.approx(float(g.norm()), rel=1e-12) and r.grad_norm > 0


def test_tensor_table_on_an_executor_is_bit_identical(folders):
    res = table_problem(folders)
    here = tensor_table(res, **TABLE)
    seen = []
    with ThreadPoolExecutor(2) as pool:
        there = tensor_table(res, executor=pool, **TABLE)
        grouped = tensor_table(
            res, executor=pool, tasks=3, progress=lambda d, t, _m: seen.append((d, t)), **TABLE
        )
        with pytest.raises(ConfigError, match="tasks must be an integer >= 1"):
            tensor_table(res, executor=pool, tasks=0, **TABLE)
    assert there.rows == here.rows and there.where == "ThreadPoolExecutor" and there.matvecs == here.matvecs
    assert grouped.rows == here.rows and grouped.matvecs == here.matvecs  # 8 rows in 3 tasks
    assert seen == [(3, 8), (6, 8), (8, 8)]
    with pytest.raises(InputError, match="executor is closed"):
        tensor_table(res, executor=pool, **TABLE)
    with pytest.raises(InputError, match="concurrent.futures.Executor"):
        tensor_table(res, executor="localhost:8786", **TABLE)


@pytest.mark.slow  # two worker processes: 37-70 s on the shared 2-core machine, load-dependent
@pytest.mark.timeout(180)
def test_tensor_table_on_a_two_worker_dask_cluster_is_bit_identical(folders):
    distributed = pytest.importorskip("distributed")
    res = table_problem(folders)
    here = tensor_table(res, **TABLE)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        executor = client.get_executor()
        assert isinstance(shipped(executor, res.problem), distributed.Future)  # sent once, not per task
        there = tensor_table(res, executor=executor, **TABLE)
        slq = matfree.density(res, probes=3, steps=6, seed=4, group=1, executor=executor)
        executor.shutdown()
        with pytest.raises(InputError, match="executor is closed"):
            tensor_table(res, executor=executor, **TABLE)
    assert there.rows == here.rows
    alone = matfree.density(res, probes=3, steps=6, seed=4, group=1)
    assert all(np.array_equal(a, b) for a, b in zip(alone.nodes + alone.weights, slq.nodes + slq.weights))


def test_slq_probes_on_an_executor_are_the_in_process_numbers(folders):
    """Each group of SLQ probes one task on a result rebuilt from ``res.problem``: the nodes and
    weights of the in-process run with the same groups to the bit, progress per group; a one-block
    result, which has no problem to rebuild, is refused by name, and so is a group < 1."""
    res = table_problem(folders)
    here = matfree.density(res, probes=4, steps=8, seed=2, reorth="full", group=2)
    seen = []
    with ThreadPoolExecutor(2) as pool:
        there = matfree.density(
            res,
            probes=4,
            steps=8,
            seed=2,
            reorth="full",
            group=2,
            executor=pool,
            progress=lambda d, t, _m: seen.append((d, t)),
        )
    assert all(np.array_equal(a, b) for a, b in zip(here.nodes + here.weights, there.nodes + there.weights))
    assert there.matvecs == here.matvecs == 32 and seen == [(16, 32), (32, 32)]
    side_by_side = matfree.density(res, probes=4, steps=8, seed=2, reorth="full")  # one group of 4
    for a, b in zip(here.nodes, side_by_side.nodes):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * np.abs(a).max())
    with pytest.raises(ConfigError, match="group"):
        matfree.density(res, probes=4, steps=8, group=0)
    cfg = hv.BlockConfig(seq_len=3, d_model=4, d_k=2, norm="attention")
    block = hv.hessian(cfg, hv.init_params(cfg, seed=0), *hv.sample_inputs(cfg, seed=0))
    with ThreadPoolExecutor(1) as pool, pytest.raises(ConfigError, match="a worker can rebuild"):
        matfree.density(block, probes=2, steps=3, executor=pool)


def test_a_one_layer_model_keeps_the_l0_names(tmp_path):
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=8, n_layer=1, n_head=2, n_positions=POSITIONS)
    ref = transformers.GPT2LMHeadModel(cfg)
    randomise(ref, seed=5)
    ref.save_pretrained(tmp_path)
    model = hv.load_model(tmp_path)
    res = hv.model_hessian(model, IDS[0], wrt=("l0.W_Q[1]", "l0.W_2"))
    assert res.public_names == ("l0.W_Q[1]", "l0.W_2") and list(res.gradient()) == ["l0.W_Q[1]", "l0.W_2"]
    assert [r.name for r in tensor_table(res, trace_samples=3).rows] == ["l0.W_Q[1]", "l0.W_2"]
    v = torch.ones(32 * 8, dtype=torch.float64)  # W_2 (4d, d)
    assert res.matvec(v, rows=("l0.W_Q[1]",), cols=("l0.W_2",)).shape == (8 * 4,)
    with pytest.raises(ConfigError, match="one-layer model"):
        hv.model_hessian(model, IDS[0], wrt=("l1.W_Q",))


class _NoHessviz:
    """A ``sys.meta_path`` finder that refuses ``hessviz``: a worker on which it is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "hessviz" or name.startswith("hessviz."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _hide_hessviz() -> None:
    import sys

    for name in [n for n in sys.modules if n == "hessviz" or n.startswith("hessviz.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _NoHessviz())


@pytest.mark.timeout(60)
def test_an_executor_whose_workers_cannot_import_hessviz_is_named(folders):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    res = table_problem(folders)
    with ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("fork"), initializer=_hide_hessviz
    ) as pool:
        with pytest.raises(InputError, match="workers cannot import hessviz"):
            tensor_table(res, tensors=("l0.ln1_gamma",), executor=pool, **TABLE)


# ----------------------------------------------------------------------------- the head's own weights


def autograd_hvp_with_head(
    model: torch.nn.Module,
    name: str,
    names: tuple[str, ...],
    offsets: dict,
    hidden_of,
    head: hv.Classifier,
    v: torch.Tensor,
) -> torch.Tensor:
    """``H v`` by double backward in the named layer slices and the classifier's ``W`` and ``b``
    (leaves), the loss ``CE(pool(hidden) W + b, labels)``."""
    params = dict(model.named_parameters())
    layer = [n for n in names if not n.startswith("head.")]
    keys = sorted({where(name, n)[0] for n in layer})
    W, b = head.W.clone().requires_grad_(True), head.b.clone().requires_grad_(True)
    leaves = [params[k] for k in keys] + [W, b]
    tangents = [torch.zeros_like(t) for t in leaves]
    for n in layer:
        key, view = where(name, n)
        t = tangents[keys.index(key)]
        view(t).copy_(v[offsets[n]].reshape(view(t).shape))
    for n, t in (("head.W", tangents[-2]), ("head.b", tangents[-1])):
        if n in offsets:
            t.copy_(v[offsets[n]].reshape(t.shape))
    with sdpa_kernel(SDPBackend.MATH):
        hidden = hidden_of(model)
        pooled = {"cls": hidden[:, 0], "last": hidden[:, -1], "mean": hidden.mean(1)}[head.pooling]
        loss = torch.nn.functional.cross_entropy(pooled @ W + b, head.labels)
        grads = torch.autograd.grad(loss, leaves, create_graph=True)
        dot = sum((g * t).sum() for g, t in zip(grads, tangents))
        hv_ = torch.autograd.grad(dot, leaves, allow_unused=True)
    by_key = dict(zip(keys, hv_))
    out = [where(name, n)[1](by_key[where(name, n)[0]]).reshape(-1) for n in layer]
    out += [g.reshape(-1) for n, g in (("head.W", hv_[-2]), ("head.b", hv_[-1])) if n in offsets]
    return torch.cat(out), grads


@pytest.mark.parametrize(
    "name, pooling, wrt",
    [
        ("bert", "cls", ("l0.W_K[0]", "l1.W_1", "head.W", "head.b")),
        ("bert", "mean", ("head.b", "l1.W_1")),
        ("gpt2", "last", ("l0.W_V[2]", "head.W")),  # through ln_f: the final norm's Jacobian
        ("gpt2", "mean", ("head.W", "head.b")),  # the head alone
    ],
)
def test_the_heads_weights_as_parameters_match_autograd(folders, name, pooling, wrt):
    head = classifier(D, [1, 3], pooling)
    model = hv.load_model(folders[name])
    res = hv.model_hessian(model, IDS, objective=head, wrt=wrt)
    layer = [n for n in res.names if not n.startswith("head.")]
    assert res.names[len(layer) :] == tuple(h for h in ("head.W", "head.b") if h in wrt)  # the head last
    sizes = {n: res.param_size(n) for n in res.names}
    assert sizes.get("head.W", D * 4) == D * 4 and sizes.get("head.b", 4) == 4
    offsets, start = {}, 0
    for n in res.names:
        offsets[n] = slice(start, start + sizes[n])
        start += sizes[n]
    assert start == res.size
    ref = reference(folders[name], name)
    hidden_of = (
        (lambda m: m(input_ids=IDS).last_hidden_state)
        if name == "bert"
        else (lambda m: m.transformer(input_ids=IDS).last_hidden_state)
    )
    gen = torch.Generator().manual_seed(1)
    V = torch.randn(res.size, 2, generator=gen, dtype=torch.float64)
    got = res.matvec(V)
    for j in range(2):
        want, grads = autograd_hvp_with_head(ref, name, res.names, offsets, hidden_of, head, V[:, j])
        assert relative(got[:, j], want) <= TIGHT
    g = res.gradient()
    for n, t in (("head.W", grads[-2]), ("head.b", grads[-1])):
        if n in g:
            assert relative(g[n], t.detach()) <= TIGHT
    H = res.matvec(torch.eye(res.size, dtype=torch.float64))  # symmetric, blocks agree with the rows
    assert torch.allclose(H, H.T, atol=1e-10 * float(H.abs().max()), rtol=0)
    last = res.names[-1]
    block = res.matvec(torch.eye(sizes[last], dtype=torch.float64), rows=(last,), cols=(last,))
    assert torch.allclose(block, H[offsets[last], offsets[last]], atol=1e-12 * float(H.abs().max()), rtol=0)
    row = tensor_table(res, tensors=(last,), trace_samples=3, exact_limit=256).rows[0]
    assert row.name == last and row.exact
    assert row.top == pytest.approx(float(torch.linalg.eigvalsh(block)[-1]), rel=1e-10)
    assert row.grad_norm == pytest.approx(float(g[last].norm()), rel=1e-12)


def test_tensor_table_of_the_top_eigenvalue_alone_and_of_the_largest_magnitude(folders):
    """``trace_samples=0``: Lanczos alone (no trace, NaN); ``which="magnitude"``: the eigenvalue of
    largest magnitude, what PyHessian's power iteration reports as the top one."""
    res = table_problem(folders)
    names = ("l0.W_Q[1]", "l1.W_O[2]")
    top = tensor_table(res, tensors=names, trace_samples=0, exact_limit=0)
    big = tensor_table(res, tensors=names, trace_samples=0, exact_limit=0, which="magnitude")
    for a, b in zip(top.rows, big.rows):
        Hb = res.matvec(torch.eye(a.size, dtype=torch.float64), rows=(a.name,), cols=(a.name,))
        vals = torch.linalg.eigvalsh(0.5 * (Hb + Hb.T))
        assert a.top == pytest.approx(float(vals[-1]), rel=1e-6) and np.isnan(a.trace)
        assert b.top == pytest.approx(float(vals[vals.abs().argmax()]), rel=1e-6)
        assert a.grad_norm == b.grad_norm > 0
    with pytest.raises(ConfigError, match="which must be"):
        tensor_table(res, tensors=names, which="bottom")
    with pytest.raises(ConfigError, match="trace_samples=0"):
        tensor_table(res, tensors=names, which="magnitude")
    exact = tensor_table(
        res, tensors=("l0.W_Q[1]", "l0.ln1_gamma"), trace_samples=0, exact_limit=256, which="magnitude"
    ).rows  # exact blocks in the same path
    exact = {r.name: r for r in exact}
    assert exact["l0.W_Q[1]"].exact and exact["l0.W_Q[1]"].top == pytest.approx(big.rows[0].top, rel=1e-6)
    assert exact["l0.ln1_gamma"].exact and np.isfinite(exact["l0.ln1_gamma"].trace)


def test_tensor_table_to_a_stated_eigenvalue_accuracy(folders):
    """``bound="value"``: every top eigenvalue within ``tol`` relative of the dense block's, for fewer
    products than the residual test at the same ``tol``; an unknown bound is refused by name."""
    res = table_problem(folders)
    names = ("l0.W_Q", "l1.W_O", "l1.ln2_gamma")
    by_value = tensor_table(
        res, tensors=names, trace_samples=0, exact_limit=0, tol=1e-3, which="magnitude", bound="value"
    )
    by_residual = tensor_table(
        res, tensors=names, trace_samples=0, exact_limit=0, tol=1e-3, which="magnitude"
    )
    for r in by_value.rows:
        Hb = res.matvec(torch.eye(r.size, dtype=torch.float64), rows=(r.name,), cols=(r.name,))
        vals = torch.linalg.eigvalsh(0.5 * (Hb + Hb.T))
        assert r.top == pytest.approx(float(vals[vals.abs().argmax()]), rel=1e-3)
    assert by_value.matvecs < by_residual.matvecs
    with pytest.raises(ConfigError, match="bound must be"):
        tensor_table(res, tensors=names, bound="eigenvalue")


@pytest.mark.parametrize("term", ["full", "outer"])
def test_the_batch_swept_in_lockstep_is_the_sum_of_the_sequences_sweeps(folders, term):
    """One lockstep sweep of a batch's tapes (its linear maps on the stacked rows,
    :mod:`hessviz.products.lockstep`) gives the products of the per-sequence sweeps, every weight and
    a head slice among the names, two columns at once, written into a given ``out``."""
    res = hv.model_hessian(hv.load_model(folders["gpt2"]), IDS, wrt=None)
    mf = res.products
    assert len(mf.parts) >= 2 and mf.lockstep(mf.X)
    V = torch.randn(2, res.size, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ours = mf.engine(mf, term, mf.names, mf.names).apply(
        V, out=torch.full((2, res.size), float("nan"), dtype=V.dtype)
    )
    each = sum(p.operator(term).apply(V) for p in mf.parts) / len(mf.parts)
    assert relative(ours, each) <= 1e-12
    sliced = res.operator(term).block(["l0.W_Q[1]", "l1.ln2_gamma"])
    v = torch.randn(sliced.shape[1], generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    inner = res._names(["l0.W_Q[1]", "l1.ln2_gamma"])
    alone = sum(p.operator(term, inner).apply(v[None]) for p in mf.parts)[0] / len(mf.parts)
    assert relative(sliced @ v, alone) <= 1e-12


@pytest.mark.parametrize("which", ["top", "magnitude"])
def test_tensor_table_in_lockstep_is_each_tensor_alone(folders, which):
    """The top-eigenvalue table (``trace_samples=0``) runs each layer's Lanczos runs in lockstep
    (:mod:`hessviz.whole.lockstep`, one call per step, the union's block): each row equals the row of
    its tensor alone (``table.row``, :func:`hessviz.matfree.eigenpairs` from the gradient) to round-off,
    with the same products, and the dense block's eigenvalue to ``tol``; a shared call's products are
    each tensor's own block's."""
    from hessviz.whole import lockstep, table

    res = table_problem(folders)
    seen = []
    opts = dict(by_head=True, trace_samples=0, exact_limit=0, tol=1e-6, bound="value", which=which)
    tab = tensor_table(res, progress=lambda d, t, _m: seen.append((d, t)), **opts)
    names = res._names([r.name for r in tab.rows])
    assert lockstep.groups(res, names) == [names[:4], names[4:]]  # l0's and l1's
    assert seen[-1] == (8, 8) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    alone = table.Options("full", 0, 0, 1e-6, 0, which, "value")
    for r, n in zip(tab.rows, names):
        ref, matvecs = table.row(res, n, alone)
        assert abs(r.top - ref.top) <= 1e-12 * abs(ref.top) and r.grad_norm == ref.grad_norm
        assert matvecs > 1 and r.name == ref.name and r.size == ref.size
        Hb = res.matvec(torch.eye(r.size, dtype=torch.float64), rows=(n,), cols=(n,))
        vals = torch.linalg.eigvalsh(0.5 * (Hb + Hb.T))
        want = vals[-1] if which == "top" else vals[vals.abs().argmax()]
        assert abs(r.top - float(want)) <= 1e-6 * abs(float(want))
    assert tab.matvecs == sum(table.row(res, n, alone)[1] for n in names)
    # one shared call: each run's rows on its own tensor's entries, its own block's product back
    gen = torch.Generator().manual_seed(5)
    asked = {
        n: (torch.randn(2, res.param_size(n), generator=gen, dtype=torch.float64), None) for n in names[:4]
    }
    sizes = {n: res.param_size(n) for n in res.products.layout(names[:4]).names}
    P = sum(sizes.values())
    buffers = (torch.zeros(8, P, dtype=torch.float64), torch.empty(8, P, dtype=torch.float64))
    got = lockstep._shared_products(res, "full", asked, sizes, {}, buffers)
    assert not buffers[0].any()  # zeroed again after the call
    for n, (V, _) in asked.items():
        want = res.matvec(V.T, rows=(n,), cols=(n,)).T
        assert (got[n] - want).norm() <= TIGHT * want.norm()
    # the CPU's call: each run's rows swept alone (its own nodes), the head once for all, every term,
    # into a run's own ``out`` where it gave one
    assert lockstep.splits(res, names[:4]) and len(res.products.parts) >= 2
    for term in ("full", "outer", "functional"):
        dest = {n: torch.full_like(V, float("nan")) for n, (V, _) in asked.items()}
        given = {n: (V, dest[n] if i % 2 else None) for i, (n, (V, _)) in enumerate(asked.items())}
        lays = {n: res.products.layout((n,)).stack for n in asked}
        split = lockstep._split_products(res, term, given, lays)
        for i, (n, (V, _)) in enumerate(asked.items()):
            want = res.matvec(V.T, term, rows=(n,), cols=(n,)).T
            assert (split[n] - want).norm() <= TIGHT * want.norm()
            assert (split[n] is dest[n]) == bool(i % 2)


def test_lockstep_runs_with_the_residual_check_match_eigenpairs(folders):
    """With the residual test and ``check`` (one more product of the Ritz vector, its rows handed
    over as a request like any), each lockstep run is :func:`hessviz.matfree.eigenpairs`' run."""
    from hessviz.whole import lockstep

    res = table_problem(folders)
    names = res._names(("l1.W_O", "l1.W_1"))
    grads = res.stack_gradient(names)
    starts = {n: grads[n].reshape(-1) for n in names}
    got = lockstep.top_values(
        res, names, "full", tol=1e-8, seed=2, bound="residual", starts=starts, check=True
    )
    for n in names:
        ref = matfree.eigenpairs(
            res, "full", 1, names=(n,), seed=2, tol=1e-8, start=starts[n], solver="torch", check=True
        )
        assert abs(float(got[n].values[0]) - float(ref.values[-1])) <= 1e-12 * abs(float(ref.values[-1]))
        assert got[n].matvecs == ref.matvecs and got[n].converged
        assert float(got[n].residuals[0]) == pytest.approx(float(ref.residuals[-1]), rel=1e-6, abs=1e-12)


def test_the_own_next_token_product_is_not_probed_a_subclass_is(folders, monkeypatch):
    """The build probes a callable curvature (two columns through the head) unless it is hessviz's own
    ``NextToken`` product, checked here against double backward; a subclass of one's own keeps it."""
    from hessviz.losses import custom
    from hessviz.losses import next_token as nt

    monkeypatch.setattr(nt, "TOKEN_WISE_MAX_D", 0)  # the product, not the token-wise blocks
    calls: list[str] = []
    probe = custom._probe
    monkeypatch.setattr(custom, "_probe", lambda name, *a: calls.append(name) or probe(name, *a))

    class Mine(hv.NextToken):
        pass

    ids = IDS[0]
    loss_of = lambda m: m(input_ids=ids[None], labels=ids[None]).loss  # noqa: E731
    res = check_products(folders["llama"], "llama", ids, hv.NextToken(), ("l1.W_G",), loss_of, LOOSE)
    assert res.value is not None and calls == []
    hv.model_hessian(hv.load_model(folders["llama"]), ids, objective=Mine(), wrt=("l1.W_G",)).matvec(
        torch.ones(res.size, dtype=torch.float64)
    )
    assert calls == ["hess_Z"]
