r"""Which objective each model family was trained with, in the words of the app's Loss control.

The names of losses and the objects they name live in one place, :mod:`hessviz.losses.names`
(``"synthetic"``, ``"next_token"``, ``"cosine:<sentence>"``, and the words ``"next token"`` and
``"sentence similarity"`` the app's control shows); this module only says which of them is a family's
own (:data:`OWN_OBJECTIVES`, a table over :data:`~hessviz.pretrained.families.FAMILIES`).

>>> own_objective("gpt2"), own_objective("bert"), own_objective("t5")
('next token', 'sentence similarity', None)
"""

from __future__ import annotations

from hessviz.losses import names
from hessviz.pretrained.families import FAMILIES

SIMILARITY, NEXT = names.WORDS[names.COSINE], names.WORDS[names.NEXT_TOKEN]
"""The objectives' names in words (what a reader chooses)."""
OWN_OBJECTIVES = {
    "bert": SIMILARITY,
    "roberta": SIMILARITY,
    **{t: NEXT for f in FAMILIES if f.has_head() for t in f.model_types},
}
"""``model_type`` (``config.json``) -> the objective the family was trained with: sentence
similarity for the sentence-transformers encoders (all-MiniLM-L6-v2's training objective), the
next token for every decoder family whose head hessviz reads (GPT-2, Llama, Mistral, Qwen, GPT-NeoX,
OPT)."""


def own_objective(model_type: str) -> str | None:
    """The name (:data:`SIMILARITY`, :data:`NEXT`) of the family's own objective; None: it has none here."""
    return OWN_OBJECTIVES.get(model_type)
