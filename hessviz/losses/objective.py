r"""A model's own objective: a :class:`~hessviz.losses.base.Loss` of its last hidden states
``Z (L, d)`` with what a real model's Hessian needs beside: :class:`ModelObjective`.

:class:`~hessviz.losses.NextToken`, :class:`~hessviz.losses.Classifier` and
:class:`~hessviz.losses.Cosine` are these. Each

* is placed at one text by :meth:`ModelObjective.at_text` ``(Z, ids, head, index)``, which hands it
  what it may read besides ``Z``: the text's token ids (the next-token targets), the model's head (an
  :class:`~hessviz.losses.next_token.LMHead`: the final norm and the unembedding, read only where
  :attr:`~ModelObjective.reads_head`), and the text's index in a batch (a classifier's label);
* hands its gradient and curvature to the stack's products as a :class:`~hessviz.losses.CustomLoss`
  (:meth:`~ModelObjective.custom_loss`): the ``(L, d, d)`` blocks when token-wise and wanted, else its
  product ``Ż ↦ N Ż``;
* gives a whole model's Hessian (:func:`hessviz.model_hessian`) its terms at one sequence,
  :meth:`~ModelObjective.sequence_terms`: that loss, the value and the head terms of a loss with
  parameters of its own (a classifier's ``W`` and ``b``).

A name becomes one of these in one place, :mod:`hessviz.losses.names`.
"""

from __future__ import annotations

from torch import Tensor

from hessviz.losses.base import Loss
from hessviz.losses.custom import CustomLoss


class ModelObjective(Loss):
    """A loss of a model's last hidden states, placed at one text (module docstring)."""

    reads_head: bool = False
    """Whether :meth:`at_text` reads the model's LM head (the unembedding), not only its final norm."""
    head_terms: object = None
    """What the Hessian needs when the loss has parameters of its own (a classifier's ``W``, ``b``:
    :class:`~hessviz.losses.classifier.HeadTerms`); ``None``: it has none."""

    exact_curvature: bool = False
    """Whether this class's curvature is hessviz's own closed form, checked against autograd by the
    test suite (:class:`~hessviz.losses.NextToken`): a whole model's
    build then does not probe its product (:meth:`hessviz.losses.CustomLoss.checked`); a subclass of
    one's own keeps the probe."""

    @property
    def prefers_blocks(self) -> bool:
        """Whether :meth:`custom_loss` hands a token-wise curvature over as its ``(L, d, d)`` blocks
        when not told (rather than as :meth:`product`)."""
        return True

    def custom_loss(self, blocks: bool | None = None) -> CustomLoss:
        """``g`` and ``N`` at the point as ``hv.CustomLoss(grad, N)``: ``N`` as the token-wise blocks
        (:meth:`token_curvature`) when the loss is token-wise and ``blocks`` (``None``:
        :attr:`prefers_blocks`), else as :meth:`product`. ``blocks=False`` suits a gradient (it needs no
        curvature) and a few product columns through a large head (``O(L V d)`` each against
        ``O(L V d²)`` for the blocks)."""
        use = self.prefers_blocks if blocks is None else blocks
        return CustomLoss(self.grad, self.token_curvature() if self.token_wise and use else self.product)

    def at_text(self, Z: Tensor, ids: Tensor, head: object = None, index: int = 0) -> ModelObjective:
        """This objective at one text's last hidden states ``Z (L, d)``, given its token ``ids (L,)``,
        the model's ``head`` (an :class:`~hessviz.losses.next_token.LMHead`, or ``None``) and the
        text's ``index`` in a batch; a loss that reads none of them is :meth:`at` ``Z``."""
        return self.at(Z)

    def sequence_terms(
        self, Z: Tensor, ids: Tensor, index: int, head: object = None
    ) -> tuple[CustomLoss, Tensor, object]:
        """As a whole model's objective, at sequence ``index`` (:meth:`at_text`): its curvature as a
        :class:`~hessviz.losses.CustomLoss` (:meth:`custom_loss`), its value and its
        :attr:`head_terms`."""
        at = self.at_text(Z, ids, head, index)
        return at.custom_loss(), at.value, at.head_terms
