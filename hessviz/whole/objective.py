"""A whole model's objective at one sequence of a batch: ``"next_token"`` or an ``hv.Classifier``.

The objectives themselves live in :mod:`hessviz.losses` (:class:`~hessviz.losses.NextToken`,
:class:`~hessviz.losses.Classifier`); this module places the batch's objective at sequence ``b``'s
last hidden states and hands the stack machinery its gradient and curvature as a
:class:`~hessviz.losses.CustomLoss`; :func:`objective_of` is a loaded model's own objective on a text.
"""

from __future__ import annotations

from torch import Tensor

from hessviz.errors import InputError
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


def objective_of(model, ids: list[int]) -> tuple[object, list[int], str]:
    """``(objective, ids used, what it is in words)`` of ``model`` (a :class:`hessviz.Model`) on the
    token ids of a text: a decoder's own next-token loss through its final norm and LM head; for an
    encoder, a :class:`~hessviz.losses.Classifier` on the last hidden state whose ``W`` is the tied
    word embedding (and ``b`` the MLM decoder's bias when the checkpoint has one), predicting the
    text's last token from the tokens before it. The Whole model page and the SmolLM2 claims use it."""
    if model.head is not None:
        return (
            "next_token",
            ids,
            (
                "the model's own next-token loss: the mean cross-entropy of each "
                "position predicting the next token, through the final norm and the LM "
                "head"
            ),
        )
    if len(ids) < 2:
        raise InputError(f"text must be at least 2 tokens long (the last one is the label), got {len(ids)}")
    fam = model.family
    emb = next(k for k in fam.embedding_shapes() if k.endswith("word_embeddings.weight"))
    keys = [emb] + [k for k in fam.ckpt.tensors if k.endswith("predictions.bias")]
    w = fam.ckpt.read(keys, model.dtype)
    E = w[emb]
    b = w[keys[1]] if len(keys) > 1 else E.new_zeros(E.shape[0])
    head = Classifier(E.T.contiguous(), b, [ids[-1]], pooling="last")
    return (
        head,
        ids[:-1],
        (
            "a classification head on the last hidden state: the tied word embedding "
            "and the decoder bias (the BERT LM head's transform is not read), predicting "
            "the text's last token from the tokens before it"
        ),
    )
