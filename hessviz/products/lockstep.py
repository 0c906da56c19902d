r"""A batch's products in one sweep: the tapes of ``B`` sequences swept node by node, side by side.

A whole model's product is ``(1/B) Σ_β H_β V`` (:mod:`hessviz.whole.hessian`), each ``H_β V`` a
sweep of sequence ``β``'s tape (:func:`hessviz.products.tape.sweep` of one tape). The tapes have the
same nodes (same names, same weights), only their values differ. A linear map is token-wise: its
``B`` nodes are one map on the ``B·L`` stacked rows (:meth:`~hessviz.ops.linear.Linear.stacked`),
so running the tapes in lockstep turns ``B`` sets of GEMMs into one:

.. math::
    \dot y = \dot x W + x \dot W + \dot b \text{ on } B L \text{ rows}, \qquad
    \textstyle\sum_β \dot{\bar W}_β = [X; \dot X]^\top [\dot{\bar Y}; \bar Y]
    \text{ over } 2 B L \text{ rows},

the weight's product of the whole batch written once, scaled by ``alpha`` (``1/B``), into its
place in the output; every other node (attention, norms, activations) runs per sequence, and its
parameter products are summed over the sequences. The loop is the tape's own
(:func:`hessviz.products.tape.sweep`, written once over ``B ≥ 1`` tapes, called with the batch's
tapes): this module only checks that the tapes can share it (:func:`same_nodes`). Only the order
of the floating-point sums differs from ``B`` separate sweeps.
"""

from __future__ import annotations

from collections.abc import Sequence

from hessviz.products.tape import Tape


def same_nodes(tapes: Sequence[Tape]) -> bool:
    """Whether the tapes have the same nodes in the same order (names, kinds, output)."""
    first = tapes[0]
    return all(
        len(t.nodes) == len(first.nodes)
        and t.output == first.output
        and all(
            type(a) is type(b) and a.output == b.output and a.inputs == b.inputs and a.params == b.params
            for a, b in zip(t.nodes, first.nodes)
        )
        for t in tapes[1:]
    )
