r"""What a real model's own objectives read from its checkpoint: the LM head and a sentence's embedding.

The objectives themselves are losses in :mod:`hessviz.losses` (value, gradient, curvature and its
product in the last hidden states ``Z (L, d)``, closed form, no autograd):

* a decoder's next-token loss, :class:`hessviz.losses.NextToken` ``(Z, ids, head)``, through the head
  :func:`lm_head` reads (the family's final norm and its unembedding ``E (V, d)``, tied to the token
  embedding or not: GPT-2's ``ln_f`` and ``wte``, Llama's RMSNorm ``norm`` and ``lm_head``, GPT-NeoX's
  ``final_layer_norm`` and ``embed_out``, OPT's ``final_layer_norm``; OPT with
  ``do_layer_norm_before = false`` has no final norm). Positions ``0 … L−2`` predict the next token of
  the text and the loss is their mean, as ``GPT2LMHeadModel(labels=ids)``; ``NextToken(Z, head=head,
  target=y)`` is the last position alone predicting ``y``;
* sentence similarity (all-MiniLM-L6-v2's training objective), :class:`hessviz.losses.Cosine`
  ``(other).at(Z)``, against the mean-pooled embedding of the other sentence, :func:`sentence_embedding`.

``loss.custom_loss()`` is what ``hv.hessian(…, loss=…)`` takes.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from hessviz.losses import LMHead, mean_pooled


def lm_head(source: str | os.PathLike, dtype: torch.dtype = torch.float64) -> LMHead:
    """The next-token head of the decoder checkpoint ``source``: its final norm (LayerNorm or
    RMSNorm, ``None`` where it has none) and its unembedding (the token embedding when tied);
    :class:`~hessviz.errors.CheckpointError` for an encoder (BERT), whose head is not read."""
    from hessviz.pretrained.load import _open

    fam = _open(source)
    h, shapes = fam.head(), fam.head_shapes()
    fam.ckpt.require(shapes)
    w = fam.ckpt.read(list(shapes), dtype)
    return LMHead(
        None if h.gamma is None else w[h.gamma] + h.shift,
        None if h.beta is None else w[h.beta],
        fam.block.ln_eps,
        w[h.unembedding],
        h.norm_type,
        softcap=h.softcap,
    )


def sentence_embedding(source: str | os.PathLike, text: str, dtype: torch.dtype = torch.float64) -> Tensor:
    """``(d,)``: the mean-pooled last hidden state of ``text`` (the other sentence of
    :class:`~hessviz.losses.Cosine`)."""
    from hessviz.pretrained.load import hidden_states

    return mean_pooled(hidden_states(source, text, dtype=dtype)[-1])
