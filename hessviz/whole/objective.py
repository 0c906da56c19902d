"""A loaded model's own objective on a text: :func:`objective_of`.

The objectives themselves live in :mod:`hessviz.losses` (:class:`~hessviz.losses.NextToken`,
:class:`~hessviz.losses.Classifier`), and a name becomes one of them in one place,
:func:`hessviz.losses.names.whole_objective`, at :func:`hessviz.model_hessian`'s entry. Each places
itself at one sequence's last hidden states (``sequence_terms(Z, ids, index, head)``) and hands the
stack machinery its gradient and curvature as a :class:`~hessviz.losses.CustomLoss`, its value and,
for a classifier, its head terms.
"""

from __future__ import annotations

from hessviz.errors import InputError
from hessviz.losses import Classifier, NextToken


def objective_of(model, ids: list[int]) -> tuple[object, list[int], str]:
    """``(objective, ids used, what it is in words)`` of ``model`` (a :class:`hessviz.Model`) on the
    token ids of a text: a decoder's own next-token loss through its final norm and LM head; for an
    encoder, a :class:`~hessviz.losses.Classifier` on the last hidden state whose ``W`` is the tied
    word embedding (and ``b`` the MLM decoder's bias when the checkpoint has one), predicting the
    text's last token from the tokens before it. The Whole model page and the SmolLM2 claims use it."""
    if model.head is not None:
        return (
            NextToken(),
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
