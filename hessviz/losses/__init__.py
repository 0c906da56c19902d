r"""Every loss hessviz differentiates, as objects with one interface (:class:`Loss`).

=======================  ==========================================================================
:class:`MSE`             ``‖Z − Y‖²_F / (L d)`` against a target ``Y (L, d)`` (``cfg.loss = "mse"``)
:class:`CrossEntropy`    ``(1/L) Σ_t −log softmax(Z_t)[y_t]`` against classes ``y (L,)`` (``"ce"``)
:class:`CustomLoss`      a loss given by its gradient and curvature in ``Z`` (may couple tokens)
:class:`NextToken`       a decoder's next-token cross-entropy through its final norm and LM head
:class:`Classifier`      a classification head on a pooled last hidden state
:class:`Cosine`          ``1 − cos`` of the mean-pooled ``Z`` and another sentence's embedding
=======================  ==========================================================================

At a point ``Z (L, d)`` each gives its ``value``, its gradient ``grad (L, d)``, its token curvature
``token_curvature() (L, d, d)`` (the Gauss–Newton middle factor ``N = ∇²_Z ℓ`` block by block, when
the loss is a sum over tokens: ``token_wise``) and the product ``product(dZ)``, ``N Ż`` for
``Ż (k, L, d)``: :mod:`hessviz.losses.base`. A block's ``cfg.loss`` string becomes an object in one
place, :func:`block_loss`; a model's objective's name (``"next_token"``, ``"cosine:<sentence>"``) in
one place too, :mod:`hessviz.losses.names`, for the app, the CLI and ``hv.model_hessian``.
"""

from __future__ import annotations

from torch import Tensor

from hessviz.errors import ConfigError
from hessviz.losses.base import Loss
from hessviz.losses.classifier import HEAD_B, HEAD_NAMES, HEAD_W, Classifier, HeadTerms
from hessviz.losses.cosine import Cosine, mean_pooled
from hessviz.losses.cross_entropy import CrossEntropy
from hessviz.losses.custom import CustomLoss
from hessviz.losses.mse import MSE
from hessviz.losses.next_token import LMHead, NextToken
from hessviz.losses.objective import ModelObjective

BLOCK_LOSSES: dict[str, type[Loss]] = {"mse": MSE, "ce": CrossEntropy}
"""``cfg.loss`` -> the loss it names, built from the target."""


def block_loss(kind: str, target: Tensor | Loss) -> Loss:
    """The loss of a block: ``kind`` (``cfg.loss``) against the target ``target`` (``MSE(Y)``,
    ``CrossEntropy(y)``), or ``target`` itself when it is already a :class:`Loss` (a custom loss).
    The one place a loss's name becomes an object; the target is checked before it
    (:func:`hessviz.block.inputs.check_Y`)."""
    if isinstance(target, Loss):
        return target
    if kind not in BLOCK_LOSSES:
        raise ConfigError(f"loss must be one of {', '.join(map(repr, BLOCK_LOSSES))}, got {kind!r}")
    return BLOCK_LOSSES[kind](target)


def gradient(kind: str, Z: Tensor, Y: Tensor | Loss) -> Tensor:
    """``∇_Z ℓ (L, d)`` of :func:`block_loss` at ``Z``."""
    return block_loss(kind, Y).at(Z).grad


def hessian(kind: str, Z: Tensor, Y: Tensor | Loss) -> Tensor:
    """``(L, d, d)``: the token curvature of :func:`block_loss` at ``Z``."""
    return block_loss(kind, Y).at(Z).token_curvature()


__all__ = [
    "BLOCK_LOSSES",
    "HEAD_B",
    "HEAD_NAMES",
    "HEAD_W",
    "Classifier",
    "Cosine",
    "CrossEntropy",
    "CustomLoss",
    "HeadTerms",
    "LMHead",
    "Loss",
    "MSE",
    "ModelObjective",
    "NextToken",
    "block_loss",
    "gradient",
    "hessian",
    "mean_pooled",
]
