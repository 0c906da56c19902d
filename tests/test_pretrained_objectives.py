"""Real objectives in ``Z`` (hessviz.pretrained.objectives): closed form against autograd, and the
GPT-2 head read from a tiny checkpoint against ``GPT2LMHeadModel``'s own loss."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, hessian

from hessviz import pretrained as pt
from hessviz.errors import CheckpointError, InputError
from hessviz.pretrained import objectives as ob

L, D, V = 5, 6, 11
V_SIZE = V
TOL = 1e-10


def random_head(seed: int = 0) -> ob.LMHead:
    g = torch.Generator().manual_seed(seed)
    return ob.LMHead(
        1 + 0.3 * torch.randn(D, generator=g, dtype=torch.float64),
        0.2 * torch.randn(D, generator=g, dtype=torch.float64),
        1e-5,
        torch.randn(V, D, generator=g, dtype=torch.float64),
    )


def head_loss(head: ob.LMHead, targets: torch.Tensor, weights: torch.Tensor):
    """The same loss written with torch ops, for autograd."""

    def f(Z: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.layer_norm(Z, (D,), head.gamma, head.beta, head.eps)
        logp = torch.log_softmax(h @ head.embedding.T, -1)
        return -(weights * logp.gather(1, targets[:, None]).squeeze(1)).sum()

    return f


def check(obj: ob.Objective, f, Z: torch.Tensor) -> None:
    assert abs(obj.value.item() - f(Z).item()) <= TOL
    assert (obj.grad - grad(f)(Z)).abs().max().item() <= TOL
    ref = hessian(f)(Z).reshape(L * D, L * D)
    err = (obj.dense_hessian() - ref).abs().max().item()
    assert err <= TOL * max(1.0, ref.abs().max().item()), f"{obj.name}: Hessian error {err:.2e}"


def test_cosine_loss_matches_autograd():
    g = torch.Generator().manual_seed(1)
    Z = torch.randn(L, D, generator=g, dtype=torch.float64)
    other = torch.randn(D, generator=g, dtype=torch.float64)
    obj = ob.cosine_loss(Z, other)
    assert not obj.token_wise and obj.hess.shape == (L * D, L * D)
    check(obj, lambda Z: 1 - torch.nn.functional.cosine_similarity(Z.mean(0), other, dim=0), Z)


def test_next_token_and_last_token_losses_match_autograd():
    g = torch.Generator().manual_seed(2)
    Z = torch.randn(L, D, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (L,), generator=g)
    head = random_head()
    obj = ob.next_token_loss(Z, ids, head)
    assert obj.token_wise and obj.hess.shape == (L, D, D)
    w = torch.full((L,), 1 / (L - 1), dtype=torch.float64)
    w[-1] = 0
    check(obj, head_loss(head, torch.cat([ids[1:], ids[:1]]), w), Z)
    last = ob.last_token_loss(Z, 7, head)
    w = torch.zeros(L, dtype=torch.float64)
    w[-1] = 1
    check(last, head_loss(head, torch.full((L,), 7), w), Z)
    assert last.hess[:-1].abs().max().item() == 0.0


def test_bad_inputs_are_named():
    Z, head = torch.zeros(L, D, dtype=torch.float64) + 1.0, random_head()
    with pytest.raises(InputError, match="other"):
        ob.cosine_loss(Z, torch.zeros(D, dtype=torch.float64))
    with pytest.raises(InputError, match="ids"):
        ob.next_token_loss(Z, [1, 2], head)
    with pytest.raises(InputError, match="token ids"):
        ob.last_token_loss(Z, V, head)
    with pytest.raises(InputError, match="Z"):
        ob.cosine_loss(torch.zeros(D), torch.ones(D))


def test_gpt2_head_gives_transformers_loss(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tests.test_pretrained import TEXT, build

    folder = build(tmp_path / "gpt2", "gpt2")
    ids = pt.token_ids(folder, TEXT)
    Z = pt.hidden_states(folder, ids)[-1]
    ours = ob.next_token_loss(Z, ids, ob.lm_head(folder)).value
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
        ob.cosine_loss(Z, torch.randn(D, generator=g, dtype=torch.float64)),
        ob.next_token_loss(Z, torch.randint(0, V_SIZE, (L,), generator=g), random_head()),
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
    obj = ob.cosine_loss(hv.forward(cfg, params, X), other)
    name, idx = "b_V[1]", cfg.head_indices("b_V[1]")
    ours = hv.hessian(cfg, params, X, loss=obj.custom_loss(), wrt=(name,)).full

    def f(w: torch.Tensor) -> torch.Tensor:
        b = params["b_V"].clone()
        b[idx] = w
        Z = torch_forward(cfg, {**params, "b_V": b}, X)
        return 1 - torch.nn.functional.cosine_similarity(Z.mean(0), other, dim=0)

    ref = hessian(f)(params["b_V"][idx])
    assert (ours - ref).abs().max().item() <= 1e-9 * ref.abs().max().item()


def test_the_loss_key_protocol_is_the_librarys():
    """``synthetic``, ``next-token`` and ``cosine:<sentence>``: named by the library, read back by
    it, and anything else refused naming ``loss``; the families' own objectives are one table."""
    from hessviz.errors import ConfigError
    from hessviz.pretrained import loss_keys as ob

    assert ob.loss_key(ob.SIMILARITY, "A ship.") == "cosine:A ship."
    assert ob.parse_loss(ob.loss_key(ob.SIMILARITY, "A ship.")) == ob.LossChoice("cosine", "A ship.")
    assert ob.parse_loss("cosine:") == ob.LossChoice("cosine", "")
    assert ob.parse_loss(ob.loss_key(ob.NEXT)).own and not ob.parse_loss(ob.loss_key("synthetic")).own
    for bad in ("cosine", "next token", "mse", ""):
        with pytest.raises(ConfigError, match="loss must be"):
            ob.parse_loss(bad)
    with pytest.raises(ConfigError, match="loss must be"):
        ob.loss_key("similarity")
    own = [ob.own_objective(t) for t in ("bert", "gpt2", "t5")]
    assert own == [ob.SIMILARITY, ob.NEXT, None]
