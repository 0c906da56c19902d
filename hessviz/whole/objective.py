"""A whole model's objective at one sequence of a batch: ``"next_token"`` or an ``hv.Classifier``.

The objectives themselves live in :mod:`hessviz.losses` (:class:`~hessviz.losses.NextToken`,
:class:`~hessviz.losses.Classifier`); this module places the batch's objective at sequence ``b``'s
last hidden states and hands the stack machinery its gradient and curvature as a
:class:`~hessviz.losses.CustomLoss`.
"""

from __future__ import annotations

from torch import Tensor

from hessviz.losses import Classifier, CustomLoss, HeadTerms, LMHead, NextToken


def sequence_terms(
    objective: str | Classifier, Z: Tensor, ids: Tensor, index: int, head: LMHead | None
) -> tuple[CustomLoss, Tensor, HeadTerms | None]:
    """The objective of sequence ``index`` (its ids ``(L,)`` and last hidden states ``Z (L, d)``):
    its curvature as a :class:`CustomLoss`, its value, and the classifier's :class:`HeadTerms`
    (None for ``"next_token"``)."""
    if isinstance(objective, Classifier):
        at = objective.at(Z, index, head)
        return at.custom_loss(), at.value, at.head_terms
    at = NextToken(Z, ids, head)
    return at.custom_loss(), at.value, None
