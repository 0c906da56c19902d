"""A whole model: the embeddings, every layer as one stack, the final norm and the head.

>>> import hessviz as hv
>>> model = hv.load_model("pydoc-llama")
>>> model.cfg.n_layers == len(model), model.names[0]
(True, 'l0.ln1_gamma')
>>> cfg, params = model[0]                       # as before: (cfg, params) of one layer per item

``hv.load_model(source)`` returns a :class:`Model`. It is also the sequence of ``(cfg, params)``
pairs of every layer that :func:`hessviz.pretrained.load.load_model` returns (the same tensors,
not copies), so ``hidden_states(source, text, layers=model)`` and ``for cfg, params in model``
keep working.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from hessviz.block.config import BlockConfig, layer_name
from hessviz.errors import CheckpointError, ConfigError, InputError, ModelRangeError
from hessviz.losses import Classifier, LMHead
from hessviz.pretrained import load
from hessviz.pretrained.families import Family
from hessviz.pretrained.objectives import lm_head


@dataclass(frozen=True, eq=False)
class Model(Sequence):
    """A loaded checkpoint.

    ``cfg``: the stack of ``n_layers`` blocks (``seq_len`` the model's positions; fitted to
    the ids by :func:`hessviz.model_hessian`), each layer's own ``window`` and ``rope_theta`` kept
    (``cfg.layer(i)``, :meth:`~hessviz.block.config.BlockConfig.stack_of`); ``params``: every layer
    weight by its stack name (``l{i}.W_Q``; the bare block names for a one-layer model, as
    ``BlockConfig`` spells them);
    ``head``: the final norm and the LM head of a decoder, ``None`` for an encoder (BERT);
    ``family``: the checkpoint's reader (the embeddings ``ids -> X0`` come from it).
    """

    source: str
    cfg: BlockConfig
    params: dict[str, Tensor] = field(repr=False)
    head: LMHead | None = field(repr=False)
    family: Family = field(repr=False)
    layers: list[tuple[BlockConfig, dict[str, Tensor]]] = field(repr=False)
    """The ``(cfg, params)`` pair of each layer (the old ``load_model`` result)."""

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i):
        return self.layers[i]

    def __iter__(self) -> Iterator[tuple[BlockConfig, dict[str, Tensor]]]:
        return iter(self.layers)

    @property
    def name(self) -> str:
        return self.family.ckpt.name

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.params.values())).dtype

    @property
    def device(self) -> torch.device:
        """Where the weights are (every layer's and the head's): :meth:`embed` puts its states there."""
        return next(iter(self.params.values())).device

    def to(self, device: torch.device | str) -> Model:
        """This model with every weight on ``device``: each layer's, the head's (final norm and
        unembedding) and so the products'; :meth:`embed` and :meth:`classifier` give their tensors there
        too. The same model (not a copy) when it is there already; the checkpoint is not read again."""
        device = checked_device(device)
        if self.device == device:
            return self
        layers = [(cfg, {n: p.to(device) for n, p in ps.items()}) for cfg, ps in self.layers]
        head = None if self.head is None else _head_to(self.head, device)
        return replace(self, params=_stack_params(layers), head=head, layers=layers)

    @property
    def names(self) -> tuple[str, ...]:
        """Every layer weight, ``l{i}.…``, in θ order."""
        return tuple(layer_name(i, n) for i in range(len(self)) for n in self.cfg.block.param_names)

    @property
    def causal(self) -> bool:
        return bool(self.cfg.causal)

    def check_ids(self, ids: object, need: int = 1) -> Tensor:
        """``ids`` as a ``(B, L)`` int64 tensor, checked: shape, range of the vocabulary, ``L``
        within the model's positions (and its sliding window), ``L ≥ need``."""
        if isinstance(ids, (list, tuple)):
            try:
                ids = torch.tensor(ids)
            except (TypeError, ValueError) as e:
                raise InputError(
                    f"ids must be (L,) or (B, L) integers of equal-length sequences: {e}"
                ) from None
        if (
            not isinstance(ids, Tensor)
            or ids.is_floating_point()
            or ids.is_complex()
            or ids.dtype == torch.bool
        ):
            raise InputError(
                f"ids must be an integer tensor of shape (L,) or (B, L), got "
                f"{getattr(ids, 'dtype', type(ids).__name__)}"
            )
        if ids.dim() not in (1, 2) or ids.numel() == 0:
            raise InputError(
                f"ids must have shape (L,) or (B, L) (a batch of equal-length sequences), got "
                f"{tuple(ids.shape)}"
            )
        ids = ids.reshape(-1, ids.shape[-1]).to(torch.int64)
        L, V, top = ids.shape[1], self.family.vocab_size, self.family.max_positions
        if not need <= L <= top:
            raise ModelRangeError(
                f"ids must have a sequence length L in [{need}, {top}] ({self.name!r} has "
                f"{top} positions), got L = {L}"
            )
        if bool(((ids < 0) | (ids >= V)).any()):
            raise InputError(f"ids must be token ids in [0, {V - 1}] ({self.name!r} has {V} tokens)")
        self.family.check_length(L)
        return ids

    def classifier(self, labels: Tensor | list[int]) -> Classifier:
        """The model's own sequence-classification head as an :class:`~hessviz.Classifier` for ``labels``:
        a ``…ForSequenceClassification``'s ``score (C, d)`` gives ``W = scoreᵀ (d, C)``, ``b`` its bias (0
        where it has none) and ``pooling="last"`` (the token ``transformers`` pools when no padding is
        present), after the model's final norm. :class:`CheckpointError` where the source has no such
        head, or one that is not linear in the pooled state (BERT's pooler, ``dense`` + tanh)."""
        tensors = self.family.ckpt.tensors
        if "score.weight" not in tensors:
            pooler = [k for k in tensors if "pooler.dense" in k]
            behind = bool(pooler) and "classifier.weight" in tensors
            why = (
                (
                    f"its classifier sits behind {pooler[0].rsplit('.', 1)[0]!r} (dense + tanh), which "
                    "hv.Classifier's linear head does not compute"
                )
                if behind
                else "it has no score head (score.weight)"
            )
            raise CheckpointError(f"source {self.name!r}: no hv.Classifier can be read: {why}")
        problem = self.family.config.get("problem_type")
        if problem not in (None, "single_label_classification"):
            raise CheckpointError(
                f"source {self.name!r}: config problem_type = {problem!r} is not "
                "supported; hv.Classifier is the single-label cross-entropy"
            )
        keys = ["score.weight"] + (["score.bias"] if "score.bias" in tensors else [])
        w = self.family.ckpt.read(keys, self.dtype)
        W = w["score.weight"].T.contiguous()
        b = w.get("score.bias", W.new_zeros(W.shape[1]))
        return Classifier(W.to(self.device), b.to(self.device), labels, pooling="last")

    def embed(self, ids: Tensor) -> list[Tensor]:
        """``[X0_b (L, d)]``: the hidden state entering layer 0, per sequence of checked ``ids (B, L)``,
        on the model's device."""
        return [self.family.embed(row.tolist(), self.dtype).to(self.device) for row in ids]


def checked_device(device: torch.device | str) -> torch.device:
    """``device`` as a :class:`torch.device` that this torch can put tensors on; a
    :class:`~hessviz.errors.ConfigError` saying why not (a name torch does not know, CUDA asked for
    where there is none)."""
    try:
        out = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"device {device!r} is not a torch device (cpu, cuda, cuda:1, mps, …)") from e
    if out.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: this torch sees no CUDA device (torch {torch.__version__})")
    if out.type == "cuda" and out.index is not None and out.index >= torch.cuda.device_count():
        raise ConfigError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return out


def _stack_params(layers: list[tuple[BlockConfig, dict[str, Tensor]]]) -> dict[str, Tensor]:
    """The stack's weights by name (``l{i}.W_Q``; a one-layer model's bare block names), the layers'
    own tensors."""
    if len(layers) == 1:
        return dict(layers[0][1])
    return {layer_name(i, n): p for i, (_, ps) in enumerate(layers) for n, p in ps.items()}


def _head_to(head: LMHead, device: torch.device) -> LMHead:
    """``head`` with its tensors (final norm, unembedding) on ``device``."""
    moved = {k: getattr(head, k) for k in ("gamma", "beta", "embedding")}
    return replace(head, **{k: None if v is None else v.to(device) for k, v in moved.items()})


def load_model(
    source: load.Source, *, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> Model:
    """The checkpoint ``source`` as a :class:`Model`: every layer (checked, then read), the
    final norm and the LM head of a decoder (``head = None`` for an encoder).

    ``source`` may be a folder, a ``.gguf`` file, a bundled name or a ``transformers`` model object
    (read where it is; its weights are copied now, so later changes to the module are not seen: load
    again). A decoder object without an LM head keeps its final norm, with no unembedding
    (``"next_token"`` is refused; :meth:`Model.classifier` reads a ``…ForSequenceClassification``'s head).
    ``device`` (``"cuda"``, say): every weight is moved there after reading (:meth:`Model.to`), and
    :func:`hessviz.model_hessian` computes there; ``None``: the CPU, where the checkpoint is read."""
    fam = load._open(source)
    pairs = load.load_model(source, dtype=dtype)
    cfg = BlockConfig.stack_of([c for c, _ in pairs])  # layers may differ in window and rope_theta
    params = _stack_params(pairs)
    try:
        head = lm_head(source, dtype)
    except CheckpointError:
        if fam.has_head():  # a decoder whose head is missing or malformed
            head = _final_norm_only(fam, dtype)
        else:
            head = None
    name = str(source) if isinstance(source, (str, os.PathLike)) else fam.ckpt.name
    model = Model(name, cfg, params, head, fam, pairs)
    return model if device is None else model.to(device)


def _final_norm_only(fam: Family, dtype: torch.dtype) -> LMHead:
    """A decoder without an LM head (a base model or a ``…ForSequenceClassification`` object): its
    final norm, with an empty ``(0, d)`` unembedding, so an :class:`Classifier` goes through the norm
    and ``"next_token"`` is refused. The original :class:`CheckpointError` when the norm is missing too."""
    h = fam.head()
    norm = {k: (fam.block.d_model,) for k in (h.gamma, h.beta) if k is not None}
    if h.unembedding in fam.ckpt.tensors or any(k not in fam.ckpt.tensors for k in norm):
        fam.ckpt.require(fam.head_shapes())  # raises the error naming what is wrong
    w = fam.ckpt.read(list(norm), dtype)
    return LMHead(
        None if h.gamma is None else w[h.gamma] + h.shift,
        None if h.beta is None else w[h.beta],
        fam.block.ln_eps,
        torch.zeros(0, fam.block.d_model, dtype=dtype),
        h.norm_type,
    )
