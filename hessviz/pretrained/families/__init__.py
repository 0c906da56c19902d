"""Model families: how a Hugging Face checkpoint's config and tensors map to hessviz blocks.

A family states five things about its checkpoints (:class:`~hessviz.pretrained.families.base.Family`):

* the :class:`~hessviz.BlockConfig` of one layer, from ``config.json`` (:meth:`Family.layer_block`
  when layers differ, Gemma's local and global layers);
* where each hessviz weight of layer ``i`` is stored, one :class:`Source` row per weight
  (the table the loader reads; a new weight is a new row);
* how many positions and tokens the model has;
* its embeddings, ``ids (L,) -> X (L, d)``, the hidden state entering layer 0;
* for a decoder, its final norm and LM head (:meth:`Family.head`).

One module per kind of family: :mod:`.base` (what they share), :mod:`.classic` (BERT, GPT-2,
GPT-NeoX, OPT), :mod:`.llama` (Llama, Mistral, Qwen2, Qwen3), :mod:`.gemma` (Gemma 2 and 3). Each
decoder names its head (:class:`Head`): the final norm and the unembedding, the token embedding when
``tie_word_embeddings``. A config value that changes the math and is not computed is a
:class:`~hessviz.errors.CheckpointError` naming the key.
"""

from __future__ import annotations

from hessviz.errors import CheckpointError
from hessviz.pretrained.bounded import shown
from hessviz.pretrained.checkpoint import Checkpoint
from hessviz.pretrained.families.base import HF_ACTIVATIONS, MAX_POSITIONS, Family, Head, Source
from hessviz.pretrained.families.classic import GPT2, OPT, Bert, GPTNeoX
from hessviz.pretrained.families.gemma import Gemma2, Gemma3
from hessviz.pretrained.families.llama import Llama, Mistral, Qwen2, Qwen3

FAMILIES: tuple[type[Family], ...] = (
    Bert,
    GPT2,
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    GPTNeoX,
    OPT,
    Gemma3,
    Gemma2,
)
SUPPORTED = tuple(t for f in FAMILIES for t in f.model_types)


def family_of(ckpt: Checkpoint) -> Family:
    """The :class:`Family` that reads ``ckpt``, from ``config.json``'s ``model_type``."""
    model_type = ckpt.config.get("model_type")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family(ckpt)
    raise CheckpointError(
        f"config.json: model_type {shown(model_type)} is not supported; hessviz loads "
        f"{', '.join(map(repr, SUPPORTED))} checkpoints"
    )


__all__ = [
    "FAMILIES",
    "HF_ACTIVATIONS",
    "MAX_POSITIONS",
    "SUPPORTED",
    "GPT2",
    "OPT",
    "Bert",
    "Family",
    "Gemma2",
    "Gemma3",
    "GPTNeoX",
    "Head",
    "Llama",
    "Mistral",
    "Qwen2",
    "Qwen3",
    "Source",
    "family_of",
]
