r"""The strings that name a loss, and the loss objects they name: the one place a name becomes an
object, read by the app, the CLI and :func:`hessviz.model_hessian` alike (a block's ``cfg.loss``,
``"mse"`` or ``"ce"``, is read by :func:`hessviz.losses.block_loss`).

========================  ======================================  =========================================
key                       object (:func:`objective`)              written by
========================  ======================================  =========================================
``"next_token"``          :class:`~hessviz.losses.NextToken` ()   ``hv.model_hessian(…, objective=…)``
                                                                  (``MODEL.md`` part 3), the CLI's
                                                                  ``--objective``, the app's cache keys
``"cosine:<sentence>"``   :class:`~hessviz.losses.Cosine` (the    the app's Real model page
                          sentence's embedding, ``embed``)
``"synthetic"``           ``None``: the block's own ``cfg.loss``  the app and the CLI (the default)
                          against a seeded target
========================  ======================================  =========================================

Other spellings are read as the same key (:data:`SPELLINGS`): ``"next-token"`` (the CLI's
``--objective`` value and the app's cache keys before the keys were one vocabulary) and the words of
the app's Loss control (:data:`WORDS`: ``"next token"``, which the app's links carry as
``rm_loss=next+token``, and ``"sentence similarity"`` with the other sentence).

>>> key("next token"), key("sentence similarity", "A ship."), key("next-token")
('next_token', 'cosine:A ship.', 'next_token')
>>> objective("next_token"), objective("synthetic")
(NextToken(), None)
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from hessviz.errors import ConfigError, InputError
from hessviz.losses.base import Loss
from hessviz.losses.classifier import Classifier
from hessviz.losses.cosine import Cosine
from hessviz.losses.next_token import NextToken

SYNTHETIC = "synthetic"
"""A synthetic target: the block's ``cfg.loss`` against a seeded ``Y`` (no objective of the model)."""
NEXT_TOKEN = "next_token"
""":class:`~hessviz.losses.NextToken`: a decoder's next-token loss through its final norm and LM head."""
COSINE = "cosine"
"""``"cosine:<other sentence>"``: :class:`~hessviz.losses.Cosine` against that sentence's embedding."""
WORDS = {SYNTHETIC: SYNTHETIC, NEXT_TOKEN: "next token", COSINE: "sentence similarity"}
"""Each kind in words: the options of the app's Loss control (and so its links' ``rm_loss``)."""
SPELLINGS = {"next-token": NEXT_TOKEN, WORDS[NEXT_TOKEN]: NEXT_TOKEN, WORDS[COSINE]: COSINE}
"""Other spellings a reader may have (a CLI script, an app link) -> the kind they name."""
CHOICES = f"{SYNTHETIC!r}, {NEXT_TOKEN!r} or '{COSINE}:<sentence>'"


def canonical(spelling: str) -> str:
    """``spelling`` in the one vocabulary (``"next-token"`` -> ``"next_token"``); unknown: as given."""
    return SPELLINGS.get(spelling, spelling)


def kind(spelling: str) -> str:
    """The kind of loss ``spelling`` names (:data:`SYNTHETIC`, :data:`NEXT_TOKEN`, :data:`COSINE`);
    a :class:`ConfigError` naming ``loss`` otherwise."""
    head, sep, _ = str(spelling).partition(":")
    if sep and head == COSINE:
        return COSINE
    found = canonical(spelling)
    if found not in (SYNTHETIC, NEXT_TOKEN):
        raise ConfigError(f"loss must be {CHOICES}, got {spelling!r}")
    return found


def key(spelling: str, other: str = "") -> str:
    """The one key of the loss ``spelling``: :data:`SYNTHETIC`, :data:`NEXT_TOKEN`, or
    ``"cosine:<other>"`` (``"sentence similarity"`` against the sentence ``other``; a key that holds
    its sentence keeps it). What a cache key holds and :func:`objective` reads."""
    if spelling in (COSINE, WORDS[COSINE]):
        return f"{COSINE}:{other}"
    k = kind(spelling)
    return spelling if k == COSINE else k


def own(spelling: str) -> bool:
    """Is it a model's own objective (a function of the last hidden states), not a synthetic target?"""
    return kind(spelling) != SYNTHETIC


def objective(spelling: str | Loss, embed: Callable[[str], Tensor] | None = None) -> Loss | None:
    """The loss object ``spelling`` names: ``NextToken()``, ``Cosine(embed(sentence))`` (``embed``:
    a sentence -> its ``(d,)`` embedding, called for a cosine key only) or ``None`` for
    :data:`SYNTHETIC`; a :class:`~hessviz.losses.Loss` is itself."""
    if isinstance(spelling, Loss):
        return spelling
    k = kind(spelling)
    if k == NEXT_TOKEN:
        return NextToken()
    if k == COSINE:
        if embed is None:
            raise ConfigError(f"loss {spelling!r} needs the model to embed its other sentence")
        return Cosine(embed(str(spelling).partition(":")[2]))
    return None


def whole_objective(spelling: object) -> NextToken | Classifier:
    """A whole model's objective (:func:`hessviz.model_hessian`) as an object: a spelling of
    :data:`NEXT_TOKEN` is ``NextToken()``; an ``hv.NextToken()`` without a point or an
    ``hv.Classifier`` is itself. Anything else is an :class:`InputError` naming it."""
    if isinstance(spelling, str) and canonical(spelling) == NEXT_TOKEN:
        return NextToken()
    if isinstance(spelling, Classifier) or (isinstance(spelling, NextToken) and spelling.Z is None):
        return spelling
    raise InputError(
        "objective must be 'next_token', hv.NextToken() or an hv.Classifier(W, b, labels, pooling), "
        f"got {spelling!r}"
    )


def name(loss: NextToken | Classifier) -> str:
    """A whole model's objective in a few words: ``next_token`` or ``Classifier(pooling)``."""
    return f"Classifier({loss.pooling})" if isinstance(loss, Classifier) else NEXT_TOKEN
