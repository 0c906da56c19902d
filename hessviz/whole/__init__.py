"""Whole models under their own objectives (``MODEL.md`` part 3, "Whole models").

* :func:`load_model` ``(source) -> Model``: embeddings, every layer as one stack, final norm, head;
* :func:`model_hessian` ``(model, ids, objective, wrt) -> ModelHessian``: products through every
  layer, the final norm and the head, under :class:`NextToken` (or the string ``"next_token"``) or a
  :class:`Classifier`;
* :func:`tensor_table`: per tensor, the top eigenvalue and trace of its diagonal block and its
  gradient norm, in tasks of several tensors on any ``concurrent.futures.Executor``.
"""

from hessviz.losses import Classifier
from hessviz.whole.hessian import ModelHessian, model_hessian
from hessviz.whole.model import Model, load_model

__all__ = ["Classifier", "Model", "ModelHessian", "load_model", "model_hessian"]
