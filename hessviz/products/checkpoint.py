r"""A batch's products with each layer's tape rebuilt when a sweep reaches it: the memory of one layer.

A stack's tape (:mod:`hessviz.products.block`) keeps, for every layer, its values, first-order
adjoints and node factors (GELU's ``φ'``, the attention weights ``A``, LayerNorm's ``1/σ`` …):
about 2.2 MB per token at GPT-2 small's size, 1.1 GiB for ``4 × 128`` tokens, 2.4× the weights.
Checkpointed, a sequence keeps only, for each layer ``i`` of ``N``, its input ``X_i (L, d)`` and the
first-order adjoint of its output ``Ḡ_{i+1} = ∂ℓ/∂X_{i+1} (L, d)``, and a product rebuilds each
layer from them (:func:`~hessviz.products.block.layer_nodes`), the ``B`` sequences side by side
(:func:`hessviz.products.tape.tangents` and
:func:`~hessviz.products.tape.adjoint_tangents`, the tape's own loop over ``B`` lanes):

1. **forward**, ``i = 0 … N−1``: layer ``i``'s nodes from ``X_i``, their tangents from ``Ẋ_i``
   and the weights' ``θ̇``; ``Ẋ_{i+1} (k, L, d)`` is kept, then ``Ż = Ẋ_N`` seeds
   ``Z̄̇ = ∇²_Z ℓ · Ż`` (:data:`hessviz.block.terms.SWEEP_RULES`);
2. **reverse**, ``i = N−1 … 0``: layer ``i``'s :class:`~hessviz.products.tape.Tape` from ``X_i``
   with its first-order sweep seeded by ``Ḡ_{i+1}``, its tangents again from ``Ẋ_i``, and the
   tangent of its reverse sweep from ``X̄̇_{i+1}``: the products of layer ``i``'s weights and
   ``X̄̇_i``.

Every rule is the tape's, so the products are those of the whole tape (the order of a few sums
aside: ``tests/test_checkpoint.py``, 1e-12 in float64). The last layer's tape is built in step 1
and kept for step 2, and a sweep starts at the first layer with a tangent and stops at the first
layer with a wanted weight.

**Work.** Per linear map and product, a forward GEMM and a first-order one (``ȳ Wᵀ``) and the two of
the tangent again on top of the six every exact product does: about 1.8× the time of the whole
tape's sweep. **Memory.** The ``B`` tapes of one layer at a time, plus ``2 N`` ``(L, d)`` tensors per
sequence and the ``(k, L, d)`` tangents of the layer inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from hessviz.block.config import BlockConfig
from hessviz.block.terms import SWEEP_RULES
from hessviz.losses import CustomLoss
from hessviz.ops.base import Maybe, Node
from hessviz.products import tape as sweeps
from hessviz.products.block import layer_nodes
from hessviz.products.tape import Tape, output_seed

INPUT = "X"
"""The name of a rebuilt layer's input value (:func:`~hessviz.products.block.layer_nodes`)."""


def _no_loss(dZ: Tensor) -> Tensor:
    raise AssertionError("a layer's tape below the last has no loss to seed")  # never called: seeds are given


class Checkpoints:
    """The products of ``B`` sequences through the stack ``cfg``, each layer rebuilt per sweep.

    ``X0[β] (L, d)`` is sequence ``β``'s input to the first layer; ``loss_at(β, Z)`` its objective
    at its last layer's output (:class:`~hessviz.losses.CustomLoss`). Built here: one forward pass
    (keeping each layer's input) and one first-order reverse pass (keeping each layer output's
    adjoint), both rebuilding a layer at a time."""

    def __init__(
        self,
        cfg: BlockConfig,
        params: dict[str, Tensor],
        X0: Sequence[Tensor],
        loss_at: Callable[[int, Tensor], CustomLoss],
    ):
        self.cfg, self.params = cfg, params
        self.layers = cfg.n_layers
        self.inputs: list[list[Tensor]] = [[x] for x in X0]
        """``inputs[β][i]``: ``X_i (L, d)`` of sequence ``β``."""
        for i in range(self.layers):
            for seq, (_, values, out) in zip(self.inputs, self._nodes(i)):
                seq.append(values[out])
        self.losses = [loss_at(b, seq.pop()) for b, seq in enumerate(self.inputs)]
        g = [loss.grad for loss in self.losses]
        self.adjoints: list[list[Tensor]] = [[gi] * self.layers for gi in g]  # each entry set below
        """``adjoints[β][i]``: ``Ḡ_{i+1} = ∂ℓ/∂`` (layer ``i``'s output) of sequence ``β``."""
        for i in reversed(range(self.layers)):
            for seq, gi in zip(self.adjoints, g):
                seq[i] = gi
            if i > 0:
                g = [_input_adjoint(t) for t in self.tapes(i)]

    def _nodes(self, i: int) -> list[tuple[list[Node], dict[str, Tensor], str]]:
        """Layer ``i`` of every sequence as nodes, the concatenated weights shared."""
        fused: dict = {}
        return [layer_nodes(self.cfg, self.params, seq[i], i, fused) for seq in self.inputs]

    def tapes(self, i: int) -> list[Tape]:
        """Layer ``i``'s tape of every sequence, its first-order sweep seeded by ``Ḡ_{i+1}`` (the last
        layer's tape seeds its products from the objective)."""
        last = i == self.layers - 1
        return [
            Tape(nodes, values, out, adj[i], loss.product if last else _no_loss)
            for (nodes, values, out), adj, loss in zip(self._nodes(i), self.adjoints, self.losses)
        ]

    def sweep(
        self,
        dparams: dict[str, Tensor],
        term: str,
        wanted: Sequence[str],
        into: dict[str, Tensor],
        alpha: float,
    ) -> dict[str, Maybe]:
        """``Σ_β θ̄̇_β`` of the ``wanted`` weights, as :func:`hessviz.products.tape.sweep` gives it
        for the whole tapes (``into``, ``alpha``: the same), each layer rebuilt (see the module)."""
        seed_curvature, second = SWEEP_RULES[term]
        N, B = self.layers, len(self.inputs)
        first = min((self.cfg.layer_of(p)[0] for p in dparams), default=N)
        lowest = min((self.cfg.layer_of(p)[0] for p in wanted), default=N)
        dX: list[Maybe] = [None] * B
        tangents_in: list[list[Maybe]] = [[None] * B for _ in range(N)]
        kept = None  # the last layer's tapes and tangents, from step 1 for step 2
        for i in range(first, N):  # 1. forward: the tangents of the layers' inputs
            tangents_in[i] = dX
            tapes = self.tapes(i) if i == N - 1 else None
            nodes = [n for n, _, _ in self._nodes(i)] if tapes is None else [t.nodes for t in tapes]
            dvals = sweeps.tangents(nodes, [{INPUT: d} for d in dX], dparams)
            dX = [d[nodes[0][-1].output] for d in dvals]
            if tapes is not None:
                kept = tapes, dvals
        dbar = [output_seed(loss.product, dZ, seed_curvature) for loss, dZ in zip(self.losses, dX)]
        out: dict[str, Maybe] = {}
        for i in reversed(range(lowest, N)):  # 2. reverse: the products, layer by layer
            if kept is not None:  # i = N − 1
                (tapes, dvals), kept = kept, None
            else:
                tapes = self.tapes(i)
                dvals = (
                    sweeps.tangents([t.nodes for t in tapes], [{INPUT: d} for d in tangents_in[i]], dparams)
                    if i >= first
                    else [{} for _ in tapes]
                )
            seeds = [{t.output: d} for t, d in zip(tapes, dbar)]
            inputs = (INPUT,) if i > lowest else ()
            got, dins = sweeps.adjoint_tangents(
                tapes, tapes[0].whole, dvals, dparams, seeds, second, wanted, inputs, into, alpha
            )
            out |= got
            dbar = [d.get(INPUT) for d in dins]
            del tapes, dvals
        return out


def _input_adjoint(tape: Tape) -> Tensor:
    """``∂ℓ/∂X`` of a layer's tape (zeros when nothing reads its input)."""
    g = tape.adjoints.get(INPUT)
    return g if g is not None else tape.values[INPUT].new_zeros(tape.values[INPUT].shape)
