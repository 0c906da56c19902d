"""Today's decoder families (``MODEL.md`` part 3, "Model families"): Llama, Mistral, Qwen2, Qwen3,
GPT-NeoX (Pythia) and OPT, each a tiny random model built from a ``transformers`` config and saved
with ``save_pretrained`` (safetensors; nothing downloaded).

For each: ``hv.load_layer`` / ``hv.layer_inputs`` against the model's own hidden states (every
layer's input and output, by hooks), the loaded layer's Hessian against autograd, the next-token
objective against autograd of the model's own final norm and head, and the ``CheckpointError``\\ s
of bad folders, configs and inputs.

``transformers`` computes RMSNorm and the rotary angles in float32 even for float64 weights, so the
rotary and RMSNorm families agree to about 1e-7 (``LOOSE``); OPT, with neither, to ``TIGHT``. The
reference runs with ``attn_implementation="sdpa"``: the eager attention takes its softmax in float32.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import hessviz as hv
from hessviz import pretrained as pt
from hessviz.errors import CheckpointError
from hessviz.pretrained import objectives as ob
from hessviz.pretrained.checkpoint import bundled_folder
from hessviz.reference import full_hessian
from tests.test_pretrained import randomise

transformers = pytest.importorskip("transformers")

N_LAYERS, D, HEADS, POSITIONS, VOCAB = 2, 16, 4, 24, 40
L = 7
TIGHT, LOOSE = 1e-10, 2e-6
IDS = [3, 17, 5, 29, 11, 2, 38][:L]

# family -> (model class, config, tolerance of the forward pass)
FAMILIES = {
    "llama": (
        "LlamaForCausalLM",
        lambda: transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=24,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            max_position_embeddings=POSITIONS,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 100.0},
            tie_word_embeddings=False,
        ),
        LOOSE,
    ),
    "mistral": (
        "MistralForCausalLM",
        lambda: transformers.MistralConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=24,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=1,
            max_position_embeddings=POSITIONS,
            sliding_window=L,
            tie_word_embeddings=True,
        ),
        LOOSE,
    ),
    "qwen2": (
        "Qwen2ForCausalLM",
        lambda: transformers.Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=24,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            max_position_embeddings=POSITIONS,
            tie_word_embeddings=False,
        ),
        LOOSE,
    ),
    "qwen3": (
        "Qwen3ForCausalLM",
        lambda: transformers.Qwen3Config(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=24,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            head_dim=6,
            max_position_embeddings=POSITIONS,
            tie_word_embeddings=True,
        ),
        LOOSE,
    ),
    "gpt_neox": (
        "GPTNeoXForCausalLM",
        lambda: transformers.GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=32,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=HEADS,
            max_position_embeddings=POSITIONS,
            rotary_pct=0.5,
            use_parallel_residual=True,
        ),
        LOOSE,
    ),
    "gpt_neox_sequential": (
        "GPTNeoXForCausalLM",
        lambda: transformers.GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=32,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=HEADS,
            max_position_embeddings=POSITIONS,
            rotary_pct=1.0,
            use_parallel_residual=False,
            attention_bias=False,
        ),
        LOOSE,
    ),
    "opt": (
        "OPTForCausalLM",
        lambda: transformers.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            ffn_dim=32,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=HEADS,
            max_position_embeddings=POSITIONS,
            word_embed_proj_dim=D,
            do_layer_norm_before=True,
        ),
        TIGHT,
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    out = {}
    for i, (family, (cls, config, _)) in enumerate(FAMILIES.items()):
        model = getattr(transformers, cls)(config())
        randomise(model, seed=i)
        model.save_pretrained(root / family)
        out[family] = root / family
    return out


def reference(folder: Path, family: str) -> torch.nn.Module:
    cls = FAMILIES[family][0]
    model = getattr(transformers, cls).from_pretrained(
        folder, dtype=torch.float64, attn_implementation="sdpa", local_files_only=True
    )
    return model.eval()


def decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The module that holds ``layers`` (``model.model``, ``model.gpt_neox``, ``model.model.decoder``)."""
    inner = model.base_model
    return getattr(inner, "decoder", inner)


def final_head(model: torch.nn.Module):
    """``Z ↦ logits`` through the model's own final norm and LM head modules."""
    inner = decoder(model)
    norm = next(
        getattr(inner, n) for n in ("norm", "final_layer_norm") if getattr(inner, n, None) is not None
    )
    return lambda Z: model.get_output_embeddings()(norm(Z))


def layer_states(model: torch.nn.Module, ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(inputs, outputs)`` of every decoder layer, each ``(L, d)``, by forward hooks."""
    inputs, outputs = [], []

    def record(mod: torch.nn.Module, args: tuple, kwargs: dict, out: object) -> None:
        inputs.append((args[0] if args else kwargs["hidden_states"])[0])
        outputs.append((out[0] if isinstance(out, tuple) else out)[0])

    hooks = [layer.register_forward_hook(record, with_kwargs=True) for layer in decoder(model).layers]
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return inputs, outputs


def scaled_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1.0)).item()


@pytest.mark.parametrize("family", FAMILIES)
def test_layers_match_transformers(folders, family):
    folder, tol = folders[family], FAMILIES[family][2]
    inputs, outputs = layer_states(reference(folder, family), IDS)
    states = pt.hidden_states(folder, IDS)
    assert len(states) == N_LAYERS + 1
    for i in range(N_LAYERS):
        X = hv.layer_inputs(folder, IDS, layer=i)
        assert scaled_error(X, inputs[i]) <= tol, f"layer {i} input"
        cfg, params = hv.load_layer(folder, layer=i, seq_len=L)
        assert scaled_error(hv.forward(cfg, params, X), outputs[i]) <= tol, f"layer {i} output"
        assert scaled_error(states[i + 1], outputs[i]) <= tol


def test_family_blocks_are_the_contracts(folders):
    """Each family's block: the fields of ``MODEL.md`` part 3's table, from its config."""
    want = {
        "llama": dict(
            norm="pre",
            norm_type="rmsnorm",
            mlp="gated",
            activation="silu",
            rope=True,
            n_kv_heads=2,
            bias=False,
            causal=True,
            rope_theta=100.0,
            d_k=4,
        ),
        "mistral": dict(norm="pre", norm_type="rmsnorm", mlp="gated", n_kv_heads=1),
        "qwen2": dict(norm="pre", norm_type="rmsnorm", bias=("Q", "K", "V"), n_kv_heads=2),
        "qwen3": dict(qk_norm=True, d_k=6, norm_type="rmsnorm"),
        "gpt_neox": dict(
            norm="parallel", norm_type="layernorm", rotary_dim=2, bias=True, ln_affine=True, activation="gelu"
        ),
        "gpt_neox_sequential": dict(norm="pre", rotary_dim=None, bias=("1", "2")),
        "opt": dict(norm="pre", activation="relu", bias=True, rope=False, causal=True),
    }
    for family, fields in want.items():
        cfg, params = hv.load_layer(folders[family], layer=0, seq_len=L)
        got = {k: getattr(cfg, k) for k in fields}
        assert got == fields, family
        assert tuple(params) == cfg.param_names


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_hessian_matches_autograd(folders, family):
    cfg, params, X = hv.layer_for_text(folders[family], IDS[:5], layer=1)
    assert cfg.seq_len == 5 and X.shape == (5, D)
    Y = torch.randn(X.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    base = {"gpt_neox": "ln1_gamma", "gpt_neox_sequential": "W_1", "opt": "ln1_beta"}.get(family, "W_G")
    wrt = cfg.sort_names(("W_Q[1]", "W_K[0]", "W_O[2]", base))
    res = hv.hessian(cfg, params, X, Y, wrt=wrt)
    ref = full_hessian(cfg, params, X, Y, res.names)
    assert (res.full - ref).abs().max().item() <= 1e-9 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("family", FAMILIES)
def test_next_token_objective_matches_the_models_head(folders, family):
    """Value, gradient and Hessian in ``Z`` against autograd of the model's own final norm and
    LM head (``jacrev`` of ``grad``: ``torch.func.hessian`` is wrong through a LayerNorm with a weight)."""
    folder, tol = folders[family], FAMILIES[family][2]
    model = reference(folder, family)
    Z = pt.hidden_states(folder, IDS)[-1]
    obj = hv.NextToken(Z, IDS, ob.lm_head(folder))
    head, targets = final_head(model), torch.tensor(IDS[1:])

    def f(Z: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(head(Z)[:-1], targets)

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([IDS])).logits[0]
    assert abs(obj.value.item() - torch.nn.functional.cross_entropy(logits[:-1], targets).item()) <= tol
    assert abs(obj.value.item() - f(Z).item()) <= tol
    g = torch.func.grad(f)(Z)
    assert scaled_error(obj.grad, g) <= tol
    H = torch.func.jacrev(torch.func.grad(f))(Z).reshape(L * D, L * D)
    assert scaled_error(obj.dense_hessian(), H) <= tol


def test_head_is_tied_or_not(folders):
    for family, tied in (("llama", False), ("mistral", True), ("opt", True), ("gpt_neox", False)):
        head = ob.lm_head(folders[family])
        model = reference(folders[family], family)
        assert torch.equal(head.embedding, model.get_output_embeddings().weight.detach()), family
        assert (
            model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
        ) == tied
        assert head.norm_type == ("rmsnorm" if family in ("llama", "mistral") else "layernorm")
        assert (head.beta is None) == (head.norm_type == "rmsnorm")


def test_gpt_neox_packed_heads(folders):
    """``query_key_value``'s rows are ``[q_h; k_h; v_h]`` per head: head 1 of ``W_K`` is rows
    ``3·d_k + d_k … 3·d_k + 2·d_k − 1`` of the stored weight, transposed."""
    from safetensors.torch import load_file

    key = "gpt_neox.layers.0.attention.query_key_value.weight"
    stored = load_file(str(folders["gpt_neox"] / "model.safetensors"))[key]
    cfg, params = hv.load_layer(folders["gpt_neox"], layer=0)
    dk = cfg.d_k
    assert torch.equal(params["W_K"][:, dk : 2 * dk], stored[3 * dk + dk : 3 * dk + 2 * dk].T.double())


# ----------------------------------------------------------------------------- bad input


def changed(folders, tmp_path: Path, family: str, change: dict, drop: tuple[str, ...] = ()) -> Path:
    """A copy of ``family``'s folder whose config.json has ``change`` merged (and ``drop`` removed)."""
    folder = tmp_path / f"{family}-changed"
    folder.mkdir()
    config = json.loads((folders[family] / "config.json").read_text()) | change
    for key in drop:
        config.pop(key, None)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").symlink_to(folders[family] / "model.safetensors")
    return folder


@pytest.mark.parametrize(
    "family, change, message",
    [
        (
            "llama",
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
            "rope_parameters with rope_type 'linear'",
        ),
        (
            "llama",
            {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
            "rope_scaling with rope_type 'dynamic'",
        ),
        (
            "llama",
            {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
            "rope_parameters must be one object",
        ),
        ("llama", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ("llama", {"hidden_act": "quick_gelu"}, "hidden_act"),
        ("llama", {"num_key_value_heads": 3}, "num_key_value_heads = 3 must divide"),
        ("opt", {"word_embed_proj_dim": 8}, "word_embed_proj_dim .*project_in/project_out"),
        ("opt", {"_remove_final_layer_norm": True}, "_remove_final_layer_norm"),
        ("qwen3", {"head_dim": None}, "head_dim is missing"),
    ],
)
def test_unsupported_config_values_are_named(folders, tmp_path, family, change, message):
    with pytest.raises(CheckpointError, match=f"config.json: {message}"):
        hv.load_layer(changed(folders, tmp_path, family, change), layer=0)


def test_sliding_window_shorter_than_the_text_is_refused(folders, tmp_path):
    assert hv.layer_inputs(folders["mistral"], IDS, layer=1).shape == (L, D)  # L = sliding_window: exact
    with pytest.raises(CheckpointError, match=f"sliding_window = {L} is shorter than the {L + 1} tokens"):
        hv.layer_inputs(folders["mistral"], IDS + [1], layer=1)
    with pytest.raises(CheckpointError, match="sliding_window"):
        hv.load_layer(folders["mistral"], layer=0, seq_len=L + 1)
    qwen = changed(folders, tmp_path, "qwen2", {"use_sliding_window": True, "sliding_window": 4})
    with pytest.raises(CheckpointError, match="sliding_window = 4"):
        hv.layer_for_text(qwen, IDS, layer=0)


def test_bad_folders_and_inputs_are_checkpoint_errors(folders, tmp_path):
    pickle_only = tmp_path / "pickle"
    pickle_only.mkdir()
    shutil.copy(folders["llama"] / "config.json", pickle_only / "config.json")
    (pickle_only / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match="pytorch_model.bin, a pickle file"):
        hv.load_layer(pickle_only, layer=0)
    with pytest.raises(CheckpointError, match="model_type 'gemma' is not supported.*'llama'.*'opt'"):
        hv.load_layer(changed(folders, tmp_path, "llama", {"model_type": "gemma"}), layer=0)
    with pytest.raises(CheckpointError, match=f"{POSITIONS + 1} tokens long, more than .* {POSITIONS}"):
        hv.layer_inputs(folders["opt"], [1] * (POSITIONS + 1), layer=0)
    with pytest.raises(CheckpointError, match=rf"layer must be an integer in \[0, {N_LAYERS - 1}\]"):
        hv.load_layer(folders["qwen3"], layer=N_LAYERS)
    with pytest.raises(CheckpointError, match=rf"layer must be an integer in \[0, {N_LAYERS - 1}\]"):
        hv.layer_for_text(folders["qwen3"], IDS, layer=-1)
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        hv.layer_for_text(folders["gpt_neox"], "a text", layer=0)
    untied = changed(folders, tmp_path, "mistral", {"tie_word_embeddings": False})  # its lm_head is not saved
    with pytest.raises(CheckpointError, match="no tensor 'lm_head.weight'"):
        ob.lm_head(untied)


# ----------------------------------------------------------------------------- the command line


def test_cli_takes_a_model(folders, tmp_path, capsys):
    from hessviz.cli import main

    folder, ids = str(folders["llama"]), [str(t) for t in IDS[:4]]
    assert (
        main(["verify", "--model", folder, "--layer", "1", "--ids", *ids, "--wrt", "W_Q[1]", "W_K[0]"]) == 0
    )
    text = capsys.readouterr().out
    assert "layer 1 (Llama)" in text and "W_Q[1]–W_K[0]" in text and "OK" in text
    out = tmp_path / "next"
    assert (
        main(
            [
                "compute",
                "--model",
                folder,
                "--layer",
                str(N_LAYERS - 1),
                "--ids",
                *ids,
                "--objective",
                "next-token",
                "--wrt",
                "W_O[0]",
                "--terms",
                "full",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["model"] == "llama" and summary["ids"] == IDS[:4] and summary["names"] == ["W_O[0]"]
    cfg, params, X = hv.layer_for_text(folder, IDS[:4], layer=N_LAYERS - 1)
    obj = hv.NextToken(hv.forward(cfg, params, X), IDS[:4], ob.lm_head(folder))
    want = hv.hessian(cfg, params, X, wrt=("W_O[0]",), loss=obj.custom_loss(blocks=True)).full
    got = torch.from_numpy(np.load(out.with_suffix(".npz"))["full"])
    assert (got - want).abs().max().item() <= 1e-12 * max(1.0, want.abs().max().item())
    assert (
        main(
            [
                "spectrum",
                "--model",
                folder,
                "--layer",
                "0",
                "--ids",
                *ids,
                "--top",
                "2",
                "--out",
                str(tmp_path / "spec"),
            ]
        )
        == 0
    )
    assert len(json.loads((tmp_path / "spec.json").read_text())["top"]["values"]) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["verify", "--text", "a b"], "--text, --ids and --objective need --model"),
        (["verify", "--model", "{llama}"], "exactly one of --text and --ids"),
        (
            ["compute", "--model", "{llama}", "--ids", "1", "2", "--objective", "next-token"],
            f"use --layer {N_LAYERS - 1}",
        ),
        (
            ["verify", "--model", "{llama}", "--ids", "1", "2", "--layer", "5"],
            r"layer must be an integer in \[0, 1\]",
        ),
        (["verify", "--model", "{llama}", "--text", "a b"], "no tokenizer.json"),
    ],
)
def test_cli_bad_model_input_is_a_message(folders, capsys, argv, message):
    from hessviz.cli import main

    assert main([a.format(llama=folders["llama"]) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and re.search(message, err), err


def test_cli_lists_models_and_families(capsys):
    from hessviz.cli import main
    from hessviz.pretrained.families import FAMILIES as READ

    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "pydoc-preln: GPT-2 (Pre-LN)" in text
    assert all(f"{f.title}: {f.blurb}" in text for f in READ)


def test_bundled_pydoc_llama_is_its_llama_checkpoint():
    """``pydoc-llama`` (``hessviz/data/models/``) opens by name and is the LlamaForCausalLM ``transformers``
    reads."""
    text = "def add(a, b):\n    return a + b"
    info = pt.model_info("pydoc-llama")
    assert (info.model_type, info.n_layers, info.block.kv_heads, info.block.mlp) == ("llama", 4, 2, "gated")
    assert "pydoc-llama" in pt.available_models()
    ids = pt.token_ids("pydoc-llama", text)
    folder = bundled_folder("pydoc-llama")
    model = transformers.LlamaForCausalLM.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="sdpa", local_files_only=True
    )
    inputs, outputs = layer_states(model.eval(), ids)
    states = pt.hidden_states("pydoc-llama", text)
    for i in range(info.n_layers):
        assert scaled_error(states[i], inputs[i]) <= LOOSE
        assert scaled_error(states[i + 1], outputs[i]) <= LOOSE
    obj = hv.NextToken(states[-1], ids, ob.lm_head("pydoc-llama"))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    ref = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    assert abs(obj.value.item() - ref.item()) <= LOOSE


def test_the_pairs_layers_differ_only_in_the_placement():
    """What hessviz/data/models/README.md says of the pair: inside a layer, only ``norm`` differs."""
    post, _ = hv.load_layer("pydoc-postln", layer=0)
    pre, _ = hv.load_layer("pydoc-preln", layer=0)
    assert (post.norm, pre.norm) == ("post", "pre")
    assert dataclasses.replace(post, norm="pre") == pre


def test_real_model_page_opens_pydoc_llama_and_its_grouped_heads():
    """The Real model page lists pydoc-llama and draws a key head of a grouped-query layer: query
    head 3 reads key/value head 1, so the slice drawn is ``W_K[1]``."""
    from tests.test_app_pages import drawn, run_page, titles

    at = run_page(
        "pages/real_model.py",
        rm_model="pydoc-llama",
        rm_text="def add(a, b):",
        rm_layer="1",
        rm_rows="1",
        rm_head="3",
        rm_w="W_K",
    )
    assert not at.error, [e.value for e in at.error]
    assert "pydoc-llama" in at.selectbox(key="rm_model").options
    assert "2 key/value" in drawn(" ".join(c.value for c in at.main.get("caption")))
    assert any("Hessian of W_K[1], rows 0…0 (32 × 32)" in t for t in titles(at))
    from hessviz import plots
    from tests.test_app_pages import figures

    bars = [x for f in figures(at) for d in f["data"] for x in (d.get("x") or []) if isinstance(x, str)]
    assert {plots.pretty(n) for n in ("W_G", "W_1", "W_2", "W_K", "ln1_gamma")} <= set(bars)  # gradients


@pytest.mark.parametrize("family", ["qwen3", "gpt_neox", "opt"])
def test_load_model_runs_the_same_states(folders, family):
    stack = hv.load_model(folders[family])
    assert len(stack) == N_LAYERS and all(tuple(p) == stack[0][0].param_names for _, p in stack)
    kept = pt.hidden_states(folders[family], IDS, layers=stack)
    fresh = pt.hidden_states(folders[family], IDS)
    assert all(torch.equal(a, b) for a, b in zip(kept, fresh))
    assert pt.model_info(folders[family]).describe().startswith(f"{family}: {FAMILY_TITLES[family]} (")


FAMILY_TITLES = {"qwen3": "Qwen3", "gpt_neox": "GPT-NeoX", "opt": "OPT"}
