"""Model objects in memory as sources: a ``transformers`` model, or ``torch.nn.TransformerEncoderLayer``.

* A ``transformers.PreTrainedModel`` of a supported family (a base model, a ``…ForCausalLM`` or a
  ``…ForSequenceClassification``) is read as a folder would be, with its ``config`` as
  ``config.json`` and its ``state_dict()`` as the weights: the same family, the same checks, the same
  :class:`~hessviz.errors.CheckpointError` for a config hessviz cannot compute. Nothing is written to
  disk; nothing is tokenised (a model object has no tokenizer: pass token ids).
* ``torch.nn.TransformerEncoderLayer`` (:func:`encoder_layer`) is one block for ``hv.load_layer``:
  ``norm_first`` (Pre-LN, else Post-LN), the activation (ReLU, GELU, GELU-tanh), ``bias`` (every
  projection and the LayerNorms' β; without it β is held at 0), ``layer_norm_eps`` and the heads of
  ``self_attn``; ``batch_first`` only orders the module's inputs, ``X (L, d)`` is one sequence. No mask
  is read: the block is bidirectional, as the module without ``src_mask``/``is_causal``.

**Later changes to the module's weights.** Each ``load_*`` call reads the weights the module holds
at that moment and copies them (in the ``dtype`` asked for): a result loaded earlier keeps the old
values, so load again after training a step.

Refused, with a clear error: another class, a module in training mode with dropout on (call
``model.eval()``, or set every dropout to 0), and tensors on the meta device (load real weights first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hessviz.block.config import BlockConfig
from hessviz.errors import CheckpointError
from hessviz.pretrained.checkpoint import Checkpoint


def _dropouts(module: nn.Module, config: dict) -> list[str]:
    """``where = p`` of every dropout that is on while ``module`` trains."""
    on = [
        f"{name or type(module).__name__} (p = {m.p})"
        for name, m in module.named_modules()
        if isinstance(m, nn.Dropout) and m.p > 0
    ]
    on += [
        f"config.{k} = {v}"
        for k, v in config.items()
        if ("dropout" in k or "pdrop" in k)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v > 0
    ]
    return on


def check_module(module: nn.Module, config: dict | None = None) -> None:
    """Refuse a module whose forward is random (dropout in training mode) or whose tensors are on
    the meta device (no values)."""
    what = type(module).__name__
    if module.training:
        on = _dropouts(module, config or {})
        if on:
            raise CheckpointError(
                f"source: the {what} object is in training mode with dropout on "
                f"({', '.join(on[:3])}{' …' if len(on) > 3 else ''}); its outputs are "
                "random, so its Hessian is not defined: call model.eval() first"
            )
    meta = [n for n, t in module.state_dict().items() if t.is_meta]
    if meta:
        raise CheckpointError(
            f"source: the {what} object's tensor {meta[0]!r} is on the meta device (it has "
            "no values); load or materialise its weights first"
        )


@dataclass(frozen=True)
class ModuleCheckpoint(Checkpoint):
    """A ``transformers`` model object as a :class:`Checkpoint`: ``config`` is ``model.config.to_dict()``,
    ``tensors`` its ``state_dict()`` names and shapes, ``folder`` a label (``<LlamaForCausalLM in
    memory>``); :meth:`read` copies the tensors the module holds now."""

    module: nn.Module | None = field(default=None, repr=False)

    @classmethod
    def of(cls, model: nn.Module) -> ModuleCheckpoint:
        config = model.config.to_dict()
        check_module(model, config)
        state = model.state_dict()
        tensors = {k: ("<memory>", tuple(t.shape)) for k, t in state.items()}
        return cls(Path(f"<{type(model).__name__} in memory>"), config, tensors, model)

    @property
    def name(self) -> str:
        return type(self.module).__name__

    def read(self, keys, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        for key in keys:
            self.shape(key)
        state = self.module.state_dict()
        return {k: state[k].detach().to("cpu", dtype=dtype or state[k].dtype, copy=True) for k in keys}

    def read_rows(self, key: str, rows: list[int], dtype: torch.dtype) -> Tensor:
        self.shape(key)
        table = self.module.state_dict()[key].detach()
        return table[torch.tensor(rows, device=table.device)].to("cpu", dtype=dtype, copy=True)

    def build_tokenizer(self):
        raise CheckpointError(
            f"source: a {self.name} object has no tokenizer, so a text cannot be "
            "tokenised; pass token ids instead of a text"
        )

    has_tokenizer = False


def open_object(source: object) -> Checkpoint:
    """A model object as a checkpoint; :class:`CheckpointError` for any other object."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # no transformers: no transformers model
        PreTrainedModel = ()  # noqa: N806
    if PreTrainedModel and isinstance(source, PreTrainedModel):
        return ModuleCheckpoint.of(source)
    if isinstance(source, nn.TransformerEncoderLayer):
        raise CheckpointError(
            "source: a torch.nn.TransformerEncoderLayer is one block: only hv.load_layer"
            "(layer, 0, seq_len=L) reads it (it has no embeddings, tokenizer or head)"
        )
    raise CheckpointError(
        f"source must be a checkpoint folder, a .gguf file, a bundled model name, a "
        "transformers model object or (for hv.load_layer) a "
        f"torch.nn.TransformerEncoderLayer; got a {type(source).__name__}"
    )


# ------------------------------------------------------------------ torch.nn.TransformerEncoderLayer


def _activation(layer: nn.TransformerEncoderLayer) -> str:
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    if isinstance(act, nn.GELU) and act.approximate == "tanh":
        return "gelu_tanh"
    raise CheckpointError(
        f"source: TransformerEncoderLayer activation {act!r} is not supported; hessviz "
        "reads relu, gelu and GELU(approximate='tanh')"
    )


def encoder_layer(
    layer: nn.TransformerEncoderLayer, seq_len: int | None, dtype: torch.dtype
) -> tuple[BlockConfig, dict[str, Tensor]]:
    """``(cfg, params)`` of a ``torch.nn.TransformerEncoderLayer``: ``W_Q, W_K, W_V`` the row blocks
    of ``in_proj_weight (3d, d)`` transposed, ``W_O = out_projᵀ``, ``W_1 = linear1ᵀ``, ``W_2 = linear2ᵀ``,
    ``ln1``/``ln2`` = ``norm1``/``norm2``; ``seq_len`` is required (the module has no positions)."""
    check_module(layer)
    attn = layer.self_attn
    if not attn._qkv_same_embed_dim or attn.bias_k is not None or attn.add_zero_attn:
        raise CheckpointError(
            "source: TransformerEncoderLayer self_attn with kdim/vdim, add_bias_kv or "
            "add_zero_attn is not supported"
        )
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise CheckpointError(
            f"seq_len must be given as an integer >= 1 for a TransformerEncoderLayer "
            f"(it has no positions of its own), got {seq_len!r}"
        )
    n1, n2 = layer.norm1, layer.norm2
    if n1.eps != n2.eps:
        raise CheckpointError(
            f"source: TransformerEncoderLayer norm1.eps = {n1.eps} differs from "
            f"norm2.eps = {n2.eps}; hessviz computes one LayerNorm ε per block"
        )
    affine = n1.weight is not None
    bias = attn.in_proj_bias is not None
    d, H = attn.embed_dim, attn.num_heads
    cfg = BlockConfig(
        seq_len=seq_len,
        d_model=d,
        d_k=d // H,
        d_ff=layer.linear1.out_features,
        norm="pre" if layer.norm_first else "post",
        activation=_activation(layer),
        ln_eps=float(n1.eps),
        n_heads=H,
        out_proj=True,
        bias=bias,
        ln_affine=affine,
    )

    def t(x: Tensor) -> Tensor:
        return x.detach().to("cpu", dtype=dtype, copy=True)

    Wq, Wk, Wv = attn.in_proj_weight.detach().chunk(3, dim=0)
    params = {
        "W_Q": t(Wq.T),
        "W_K": t(Wk.T),
        "W_V": t(Wv.T),
        "W_O": t(attn.out_proj.weight.T),
        "W_1": t(layer.linear1.weight.T),
        "W_2": t(layer.linear2.weight.T),
    }
    if bias:
        bq, bk, bv = attn.in_proj_bias.detach().chunk(3)
        params |= {
            "b_Q": t(bq),
            "b_K": t(bk),
            "b_V": t(bv),
            "b_O": t(attn.out_proj.bias),
            "b_1": t(layer.linear1.bias),
            "b_2": t(layer.linear2.bias),
        }
    if affine:
        for name, norm in (("ln1", n1), ("ln2", n2)):
            params[f"{name}_gamma"] = t(norm.weight)
            params[f"{name}_beta"] = t(norm.bias) if norm.bias is not None else torch.zeros(d, dtype=dtype)
    return cfg, {n: params[n] for n in cfg.param_names}
