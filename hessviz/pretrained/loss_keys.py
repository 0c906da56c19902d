r"""Which loss a view of a real layer is drawn under, named by a short key (no Streamlit).

A key is a plain string, so that a cache key, a URL and the precomputed file can hold it:

* ``"synthetic"`` (:data:`SYNTHETIC`): the block's own ``cfg.loss`` against a seeded synthetic target;
* ``"next-token"`` (:data:`NEXT_TOKEN`): the model's language-modelling loss through its LM head
  (:func:`hessviz.pretrained.objectives.next_token_loss`);
* ``"cosine:<other sentence>"`` (:data:`COSINE`): sentence similarity against the other sentence's
  mean-pooled embedding (:func:`hessviz.pretrained.objectives.cosine_loss`).

:func:`loss_key` writes a key from the objective's name in words, :func:`parse_loss` reads one
back (a :class:`ConfigError` naming ``loss`` otherwise), :func:`objective_at` builds the
objective at the last hidden states, and :func:`own_objective` says which objective a family was
trained with (:data:`OWN_OBJECTIVES`).

>>> parse_loss(loss_key(SIMILARITY, "A ship."))
LossChoice(kind='cosine', other='A ship.')
>>> own_objective("gpt2"), parse_loss("next-token").own
('next token', True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from hessviz.errors import ConfigError
from hessviz.pretrained.families import FAMILIES
from hessviz.pretrained.objectives import LMHead, Objective, cosine_loss, mean_pooled, next_token_loss

SYNTHETIC = "synthetic"
"""The key of a synthetic target (``cfg.loss`` against a seeded ``Y``): no objective of the model."""
NEXT_TOKEN = "next-token"
"""The key of :func:`~hessviz.pretrained.objectives.next_token_loss` through the model's LM head."""
COSINE = "cosine"
"""``"cosine:<other sentence>"``: :func:`~hessviz.pretrained.objectives.cosine_loss` against that sentence."""
SIMILARITY, NEXT = "sentence similarity", "next token"
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


def loss_key(name: str, other: str = "") -> str:
    """The key of the loss named ``name`` (``"synthetic"``, :data:`SIMILARITY` against the sentence
    ``other``, or :data:`NEXT`): what :func:`parse_loss` reads and a cache key holds."""
    keys = {SYNTHETIC: SYNTHETIC, NEXT: NEXT_TOKEN, SIMILARITY: f"{COSINE}:{other}"}
    if name not in keys:
        raise ConfigError(f"loss must be one of {', '.join(map(repr, keys))}, got {name!r}")
    return keys[name]


@dataclass(frozen=True)
class LossChoice:
    """A parsed loss key: ``kind`` is :data:`SYNTHETIC`, :data:`NEXT_TOKEN` or :data:`COSINE`
    (then ``other`` is the other sentence)."""

    kind: str
    other: str = ""

    @property
    def own(self) -> bool:
        """Is it the model's own objective (a function of the last hidden states)?"""
        return self.kind != SYNTHETIC


def parse_loss(key: str) -> LossChoice:
    """``"synthetic"``, ``"next-token"`` or ``"cosine:<sentence>"`` as a :class:`LossChoice`
    (raises :class:`ConfigError` naming ``loss`` otherwise)."""
    kind, sep, other = str(key).partition(":")
    if key in (SYNTHETIC, NEXT_TOKEN) or (sep and kind == COSINE):
        return LossChoice(kind, other)
    raise ConfigError(f"loss must be 'synthetic', 'cosine:<sentence>' or 'next-token', got {key!r}")


def objective_at(
    choice: LossChoice,
    Z: Tensor,
    ids: Sequence[int],
    last_states: Callable[[str], Tensor],
    head: Callable[[], LMHead],
) -> Objective:
    """The model's own objective ``choice`` at its last hidden states ``Z (L, d)`` of the text
    ``ids``: :func:`~hessviz.pretrained.objectives.cosine_loss` against the mean-pooled
    ``last_states(other)`` (the other sentence's last hidden states), or
    :func:`~hessviz.pretrained.objectives.next_token_loss` through ``head()``. The callables let a
    caller supply what it has cached."""
    if choice.kind == COSINE:
        return cosine_loss(Z, mean_pooled(last_states(choice.other)))
    if choice.kind == NEXT_TOKEN:
        return next_token_loss(Z, list(ids), head())
    raise ConfigError(f"loss {choice.kind!r} is not an objective of the model (a synthetic target)")
