"""The one map of the weights: where each global parameter enters the block.

Operations address their parameters by local names (``query.weight``, ``fc1.bias``,
``gamma``), as BackPACK modules do; :data:`WEIGHT_MAP` is the only place that says which
global name (``W_Q``, ``b_1``, ``ln2_gamma``) is which component's which local parameter.
The dense forward record (:mod:`hessviz.dense.record`) hands each operation its weights through this
table, and the assembler (:mod:`hessviz.dense.assembly`) translates the component references
back to rows and columns of the Hessian through it. A new weight is a new row here.

A *unit* is what the engine computes alone: a whole unheaded weight, or one head of a
headed one (``W_Q[3]``). A requested name is one unit, or, for a whole headed weight with
``H`` heads, ``H`` units whose entries interleave in ``vec_r`` (heads are column blocks,
row blocks for ``W_O``); :meth:`Unit.view` finds a unit's entries as a strided view.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from hessviz.block.config import HEADED, BlockConfig, layer_name, parse_name
from hessviz.ops.contributions import Ref

WEIGHT_MAP: dict[str, tuple[str, str]] = {
    "W_Q": ("attention", "query.weight"),
    "b_Q": ("attention", "query.bias"),
    "q_norm_gamma": ("attention", "query.norm"),
    "W_K": ("attention", "key.weight"),
    "b_K": ("attention", "key.bias"),
    "k_norm_gamma": ("attention", "key.norm"),
    "W_V": ("attention", "value.weight"),
    "b_V": ("attention", "value.bias"),
    "W_O": ("attention", "out.weight"),
    "b_O": ("attention", "out.bias"),
    "ln1_gamma": ("ln1", "gamma"),
    "ln1_beta": ("ln1", "beta"),
    "ln1_out_gamma": ("ln1_out", "gamma"),
    "ln1_out_beta": ("ln1_out", "beta"),
    "W_G": ("ffn", "gate.weight"),
    "b_G": ("ffn", "gate.bias"),
    "W_1": ("ffn", "fc1.weight"),
    "b_1": ("ffn", "fc1.bias"),
    "W_2": ("ffn", "fc2.weight"),
    "b_2": ("ffn", "fc2.bias"),
    "ln2_gamma": ("ln2", "gamma"),
    "ln2_beta": ("ln2", "beta"),
    "ln2_out_gamma": ("ln2_out", "gamma"),
    "ln2_out_beta": ("ln2_out", "beta"),
}
"""global name -> (component, local name)."""

GLOBAL_NAME: dict[tuple[str, str], str] = {v: k for k, v in WEIGHT_MAP.items()}


def component_weights(cfg: BlockConfig, params: dict[str, Tensor], component: str) -> dict[str, Tensor]:
    """``local name -> tensor`` of one component, for the weights that ``cfg`` has."""
    return {
        local: params[name]
        for name, (comp, local) in WEIGHT_MAP.items()
        if comp == component and name in cfg.param_shapes
    }


def layer_params(cfg: BlockConfig, params: dict[str, Tensor], layer: int) -> dict[str, Tensor]:
    """The weights of layer ``layer`` of a stack under the block's own names (``l1.W_Q -> W_Q``);
    ``params`` itself for one block."""
    if not cfg.is_stack:
        return params
    return {n: params[layer_name(layer, n)] for n in cfg.block.param_names}


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """A vector ``(n,)`` is the row ``(1, n)``; a matrix keeps its shape."""
    return (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])


@dataclass(frozen=True)
class Unit:
    """One unit of a requested name.

    ``split``: the name's ``vec_r`` as ``(outer, heads, inner)`` with the heads at
    ``head_dim`` (0 for the row blocks of ``W_O``, 1 otherwise); ``index``: this unit's head
    there. ``shape``: the unit as a matrix ``(rows, cols)``.
    """

    name: str
    ref: Ref
    split: tuple[int, int, int]
    head_dim: int
    index: int

    @property
    def shape(self) -> tuple[int, int]:
        s = list(self.split)
        del s[self.head_dim]
        return (s[0], s[1])

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def rows_of(self, M: Tensor, dim: int) -> Tensor:
        """The view of ``M`` whose dim ``dim`` (indexing the name) is this unit's ``(rows, cols)``."""
        return M.unflatten(dim, self.split).select(dim + self.head_dim, self.index)

    @staticmethod
    def view(region: Tensor, a: Unit, b: Unit) -> Tensor:
        """The 4-d view ``(α, β, α', β')`` of the block ``(a, b)`` inside ``region``, the
        ``(|name_a|, |name_b|)`` block of the two names."""
        return a.rows_of(b.rows_of(region, 1), 0)


def units_of(cfg: BlockConfig, name: str) -> list[Unit]:
    """The units of a whole name or head slice, in ``vec_r`` order of their first entries."""
    base, head = parse_name(cfg.check_name(name))
    component, local = WEIGHT_MAP[base]
    if base not in HEADED:
        rows, cols = matrix_shape(cfg.param_shapes[base])
        return [Unit(name, (component, local, None), (rows, 1, cols), 1, 0)]
    if head is not None:
        rows, cols = matrix_shape(cfg.shape_of(name))
        return [Unit(name, (component, local, head), (rows, 1, cols), 1, 0)]
    H = cfg.heads_of(base)
    rows, cols = matrix_shape(cfg.param_shapes[base])
    if len(cfg.param_shapes[base]) == 2 and HEADED[base] == 0:  # W_O: heads are row blocks
        split, head_dim = (H, rows // H, cols), 0
    else:  # column blocks
        split, head_dim = (rows, H, cols // H), 1
    return [Unit(name, (component, local, h), split, head_dim, h) for h in range(H)]


def units(cfg: BlockConfig, names: tuple[str, ...]) -> list[Unit]:
    """Every unit of ``names``, name by name."""
    return [u for n in names for u in units_of(cfg, n)]
