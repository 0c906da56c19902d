"""Real models' objectives in ``Z`` (hessviz.losses' Cosine and NextToken, with what
hessviz.pretrained.objectives reads): closed form against autograd, the GPT-2 head read from a tiny
checkpoint against ``GPT2LMHeadModel``'s own loss, and the one vocabulary of their names
(hessviz.losses.names)."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, hessian

from hessviz import pretrained as pt
from hessviz.errors import CheckpointError, InputError
from hessviz.losses import Cosine, LMHead, Loss, NextToken, names
from hessviz.pretrained import objectives as ob

L, D, V = 5, 6, 11
V_SIZE = V
TOL = 1e-10


def random_head(seed: int = 0) -> LMHead:
    g = torch.Generator().manual_seed(seed)
    return LMHead(
        1 + 0.3 * torch.randn(D, generator=g, dtype=torch.float64),
        0.2 * torch.randn(D, generator=g, dtype=torch.float64),
        1e-5,
        torch.randn(V, D, generator=g, dtype=torch.float64),
    )


def head_loss(head: LMHead, targets: torch.Tensor, weights: torch.Tensor):
    """The same loss written with torch ops, for autograd."""

    def f(Z: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.layer_norm(Z, (D,), head.gamma, head.beta, head.eps)
        logp = torch.log_softmax(h @ head.embedding.T, -1)
        return -(weights * logp.gather(1, targets[:, None]).squeeze(1)).sum()

    return f


def check(obj: Loss, f, Z: torch.Tensor) -> None:
    assert abs(obj.value.item() - f(Z).item()) <= TOL
    assert (obj.grad - grad(f)(Z)).abs().max().item() <= TOL
    ref = hessian(f)(Z).reshape(L * D, L * D)
    err = (obj.dense_hessian() - ref).abs().max().item()
    assert err <= TOL * max(1.0, ref.abs().max().item()), f"{obj!r}: Hessian error {err:.2e}"


def test_cosine_loss_matches_autograd():
    g = torch.Generator().manual_seed(1)
    Z = torch.randn(L, D, generator=g, dtype=torch.float64)
    other = torch.randn(D, generator=g, dtype=torch.float64)
    obj = Cosine(other).at(Z)
    assert not obj.token_wise and obj.dense_hessian().shape == (L * D, L * D)
    check(obj, lambda Z: 1 - torch.nn.functional.cosine_similarity(Z.mean(0), other, dim=0), Z)


def test_next_token_and_last_token_losses_match_autograd():
    g = torch.Generator().manual_seed(2)
    Z = torch.randn(L, D, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (L,), generator=g)
    head = random_head()
    obj = NextToken(Z, ids, head)
    assert obj.token_wise and obj.token_curvature().shape == (L, D, D)
    w = torch.full((L,), 1 / (L - 1), dtype=torch.float64)
    w[-1] = 0
    check(obj, head_loss(head, torch.cat([ids[1:], ids[:1]]), w), Z)
    last = NextToken(Z, head=head, target=7)
    w = torch.zeros(L, dtype=torch.float64)
    w[-1] = 1
    check(last, head_loss(head, torch.full((L,), 7), w), Z)
    assert last.token_curvature()[:-1].abs().max().item() == 0.0


def test_bad_inputs_are_named():
    Z, head = torch.zeros(L, D, dtype=torch.float64) + 1.0, random_head()
    with pytest.raises(InputError, match="other"):
        Cosine(torch.zeros(D, dtype=torch.float64)).at(Z)
    with pytest.raises(InputError, match="ids"):
        NextToken(Z, [1, 2], head)
    with pytest.raises(InputError, match="token ids"):
        NextToken(Z, head=head, target=V)
    with pytest.raises(InputError, match="Z"):
        Cosine(torch.ones(D)).at(torch.zeros(D))
    with pytest.raises(InputError, match="mean-pooled embedding is zero"):
        Cosine(torch.ones(D)).at(torch.zeros(L, D))


def test_gpt2_head_gives_transformers_loss(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tests.test_pretrained import TEXT, build

    folder = build(tmp_path / "gpt2", "gpt2")
    ids = pt.token_ids(folder, TEXT)
    Z = pt.hidden_states(folder, ids)[-1]
    ours = NextToken(Z, ids, ob.lm_head(folder)).value
    model = transformers.GPT2LMHeadModel.from_pretrained(
        folder, dtype=torch.float64, local_files_only=True
    ).eval()
    with torch.no_grad():  # its labels= loss upcasts to float32: take the logits
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    ref = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    assert abs(ours.item() - ref.item()) <= TOL
    with pytest.raises(CheckpointError, match="BERT model.*decoder families only"):
        ob.lm_head("pydoc-postln")


def test_products_are_the_hessians():
    g = torch.Generator().manual_seed(4)
    Z = torch.randn(L, D, generator=g, dtype=torch.float64)
    V = torch.randn(3, L, D, generator=g, dtype=torch.float64)
    for obj in (
        Cosine(torch.randn(D, generator=g, dtype=torch.float64)).at(Z),
        NextToken(Z, torch.randint(0, V_SIZE, (L,), generator=g), random_head()),
    ):
        dense = obj.dense_hessian() @ V.reshape(3, -1).T
        assert (obj.product(V).reshape(3, -1) - dense.T).abs().max().item() <= TOL


def test_cosine_objective_through_a_real_layer_matches_autograd():
    """MiniLM's objective on the last layer of the trained Post-LN model: the Hessian of a head's
    value bias through hv.hessian(loss=CustomLoss(…)) against autograd of the whole composition."""
    import dataclasses

    import hessviz as hv
    from hessviz.reference import torch_forward

    model, text = "pydoc-postln", "def add(a, b):"
    last = pt.model_info(model).n_layers - 1
    cfg, params = pt.load_layer(model, last)
    X = pt.layer_inputs(model, text, last)
    cfg = dataclasses.replace(cfg, seq_len=X.shape[0])
    other = ob.sentence_embedding(model, "import sys")
    obj = Cosine(other).at(hv.forward(cfg, params, X))
    name, idx = "b_V[1]", cfg.head_indices("b_V[1]")
    ours = hv.hessian(cfg, params, X, loss=obj.custom_loss(), wrt=(name,)).full

    def f(w: torch.Tensor) -> torch.Tensor:
        b = params["b_V"].clone()
        b[idx] = w
        Z = torch_forward(cfg, {**params, "b_V": b}, X)
        return 1 - torch.nn.functional.cosine_similarity(Z.mean(0), other, dim=0)

    ref = hessian(f)(params["b_V"][idx])
    assert (ours - ref).abs().max().item() <= 1e-9 * ref.abs().max().item()


def test_one_vocabulary_names_every_objective():
    """``synthetic``, ``next_token`` and ``cosine:<sentence>``: the app's words, the CLI's and old
    links' ``next-token`` and ``model_hessian``'s ``next_token`` are read in one place
    (:mod:`hessviz.losses.names`); anything else is refused naming ``loss``; the families' own
    objectives are one table."""
    from hessviz.errors import ConfigError
    from hessviz.pretrained import loss_keys

    assert names.key(loss_keys.SIMILARITY, "A ship.") == "cosine:A ship."
    assert names.key("cosine:A ship.") == "cosine:A ship." and names.key("cosine:") == "cosine:"
    for spelling in ("next_token", "next-token", "next token", loss_keys.NEXT):
        assert names.key(spelling) == "next_token" and names.own(spelling)
        assert isinstance(names.objective(spelling), NextToken) and names.objective(spelling).Z is None
        assert isinstance(names.whole_objective(spelling), NextToken)
    assert names.key("synthetic") == "synthetic" and not names.own("synthetic")
    assert names.objective("synthetic") is None
    other = torch.ones(D, dtype=torch.float64)
    got = names.objective("cosine:A ship.", lambda sentence: other if sentence == "A ship." else None)
    assert isinstance(got, Cosine) and got.target is other
    for bad in ("cosine", "next", "mse", ""):
        with pytest.raises(ConfigError, match="loss must be"):
            names.objective(bad)
    with pytest.raises(ConfigError, match="loss must be"):
        names.key("similarity")
    with pytest.raises(ConfigError, match="embed"):
        names.objective("cosine:A ship.")
    with pytest.raises(InputError, match="objective must be 'next_token'"):
        names.whole_objective("synthetic")
    own = [loss_keys.own_objective(t) for t in ("bert", "gpt2", "t5")]
    assert own == [loss_keys.SIMILARITY, loss_keys.NEXT, None]


def test_no_module_but_the_names_compares_a_spelling_of_next_token():
    """The app, the CLI and ``hessviz/whole/`` hold loss objects or keys, and ask
    :mod:`hessviz.losses.names` what a string names: no other module compares a string with
    ``next_token``, ``next-token`` or ``next token``."""
    import ast

    from tests.test_imports import ROOT, _compared_strings

    spellings = {names.NEXT_TOKEN, *names.SPELLINGS}
    found = {
        str(p.relative_to(ROOT)): hits
        for p in ROOT.rglob("*.py")
        if p.name != "names.py"
        and (hits := [line for line, s in _compared_strings(ast.parse(p.read_text())) if s in spellings])
    }
    assert found == {}
