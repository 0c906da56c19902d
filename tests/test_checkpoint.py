"""``hv.model_hessian(..., checkpoint=True)`` (:mod:`hessviz.products.checkpoint`): each layer rebuilt
per product from its input, against the products of the whole tape kept, in float64.

Three-layer models, so that a layer has one below and one above it: GPT-2 (LayerNorm, GELU,
next-token loss through the final norm and the tied head), Llama (RMSNorm, rotary, gated MLP) and
BERT (Post-LN, a classifier); a batch of two sequences and a single one; every term; blocks whose
rows lie below, above and on their columns; the gradient; and the top eigenvalues.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hessviz as hv
from hessviz import matfree
from hessviz.errors import InputError
from tests.test_pretrained import randomise

transformers = pytest.importorskip("transformers")

D, HEADS, FF, VOCAB, POSITIONS, LAYERS = 12, 3, 20, 30, 16, 3
IDS = torch.tensor([[3, 17, 5, 29, 11, 2], [7, 1, 22, 9, 14, 4]])
EXACT = 1e-12
SLICES = ("l1.W_Q[1]", "l0.W_2", "l2.ln1_gamma")


def _configs() -> dict[str, object]:
    common = dict(vocab_size=VOCAB, num_attention_heads=HEADS, max_position_embeddings=POSITIONS)
    return {
        "gpt2": transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                vocab_size=VOCAB, n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=FF, n_positions=POSITIONS
            )
        ),
        "llama": transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                hidden_size=D,
                intermediate_size=FF,
                num_hidden_layers=LAYERS,
                num_key_value_heads=HEADS,
                tie_word_embeddings=False,
                **common,
            )
        ),
        "bert": transformers.BertModel(
            transformers.BertConfig(
                hidden_size=D, num_hidden_layers=LAYERS, intermediate_size=FF, hidden_act="gelu", **common
            )
        ),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, hv.Model]:
    root = tmp_path_factory.mktemp("checkpoint")
    out = {}
    for i, (name, model) in enumerate(_configs().items()):
        randomise(model, seed=20 + i)
        model.save_pretrained(root / name)
        out[name] = hv.load_model(Path(root / name))
    return out


def objective(name: str, batch: int) -> object:
    if name != "bert":
        return "next_token"
    gen = torch.Generator().manual_seed(3)
    W = torch.randn(D, 4, generator=gen, dtype=torch.float64)
    return hv.Classifier(W, 0.1 * torch.randn(4, generator=gen, dtype=torch.float64), [1, 3][:batch], "cls")


def pair(models, name: str, batch: int, wrt=None) -> tuple[hv.ModelHessian, hv.ModelHessian]:
    ids = IDS[:batch]
    kept = hv.model_hessian(models[name], ids, objective(name, batch), wrt=wrt)
    rebuilt = hv.model_hessian(models[name], ids, objective(name, batch), wrt=wrt, checkpoint=True)
    return kept, rebuilt


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name, batch", [("gpt2", 2), ("gpt2", 1), ("llama", 2), ("bert", 2)])
def test_every_term_and_the_gradient_equal_the_whole_tapes(models, name, batch):
    kept, rebuilt = pair(models, name, batch)
    assert float(rebuilt.value) == pytest.approx(float(kept.value), rel=1e-14)
    V = torch.randn(kept.size, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for term in ("full", "outer", "functional"):
        assert relative(rebuilt.matvec(V, term), kept.matvec(V, term)) <= EXACT, term
    g, h = rebuilt.gradient(), kept.gradient()
    assert g.keys() == h.keys()
    flat = lambda grads: torch.cat([t.reshape(-1) for t in grads.values()])  # noqa: E731 (b_K's is round-off)
    assert relative(flat(g), flat(h)) <= EXACT
    # the layers' tapes are rebuilt per sweep, never kept
    assert all("tape" not in part.products.__dict__ for part in rebuilt.parts)


@pytest.mark.parametrize(
    "rows, cols",
    [
        (SLICES, SLICES),
        (("l1.W_Q[1]",), ("l2.W_1",)),  # rows below their columns: the sweep starts above the rows
        (("l2.W_1",), ("l0.W_K",)),  # rows above: the reverse stops at layer 2
        (("l0.ln1_gamma", "l2.W_2"), ("l1.W_V[0]",)),
    ],
)
def test_blocks_between_layers_equal_the_whole_tapes(models, rows, cols):
    kept, rebuilt = pair(models, "gpt2", 2)
    for term in ("full", "functional"):
        a, b = kept.operator(term).block(rows, cols), rebuilt.operator(term).block(rows, cols)
        v = torch.randn(a.shape[1], 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        assert relative(b @ v, a @ v) <= EXACT, (rows, cols, term)


def test_named_weights_and_the_top_eigenvalues_equal_the_whole_tapes(models):
    kept, rebuilt = pair(models, "llama", 2, wrt=SLICES)
    assert rebuilt.names == kept.names
    ours = matfree.top_eigenvalues(rebuilt, "full", k=3, seed=0)
    theirs = matfree.top_eigenvalues(kept, "full", k=3, seed=0)
    assert torch.allclose(torch.as_tensor(ours), torch.as_tensor(theirs), rtol=1e-10, atol=0)
    # the dense terms build the whole tape when asked, the same numbers
    assert relative(rebuilt.dense("functional"), kept.dense("functional")) <= EXACT


def test_checkpoint_must_be_a_bool(models):
    with pytest.raises(InputError, match="checkpoint must be True or False"):
        hv.model_hessian(models["gpt2"], IDS, checkpoint="yes")
