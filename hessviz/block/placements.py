r"""The placements as data: one recipe per ``norm``, run once as the tape's nodes.

A recipe is the block's forward pass as a list of :class:`Step` over named values, starting
from ``X``; the last step's output is ``Z``. Four operations:

* ``attention``: ``SA(x)``, the multi-head self-attention with its weights;
* ``norm``: ``ln1(x)``, ``ln2(x)`` (``peri`` also ``ln1_out``, ``ln2_out``), a LayerNorm or an
  RMSNorm (``cfg.norm_type``; ``γ, β`` of that name when ``ln_affine``, ``γ`` alone for RMSNorm);
* ``ffn``: ``FFN(x) = φ(x W_1 + b_1) W_2 + b_2``, or the gated ``(φ(x W_G + b_G) ⊙ (x W_1 + b_1)) W_2 + b_2``
  (``cfg.mlp``);
* ``add``: ``a + b``, a residual sum.

======== ==================================== ==========================================
norm     ``Z1``                               ``Z``
======== ==================================== ==========================================
post     ``ln1(X + SA(X))``                   ``ln2(Z1 + FFN(Z1))``
pre      ``X + SA(ln1(X))``                   ``Z1 + FFN(ln2(Z1))``
none     ``X + SA(X)``                        ``Z1 + FFN(Z1)``
attention —                                   ``SA(X)``
parallel  —                                   ``X + SA(ln1(X)) + FFN(ln2(X))`` (GPT-NeoX)
peri     ``X + ln1_out(SA(ln1(X)))``          ``Z1 + ln2_out(FFN(ln2(Z1)))`` (Gemma 2, 3)
======== ==================================== ==========================================

The tape (:func:`hessviz.products.block.build`) is the one reader of a recipe: it appends one group
of nodes per step, by the step's rule in :data:`hessviz.products.block.STEP_RULES`, and keeps, per
layer, which step appended which nodes. The dense engine (:func:`hessviz.dense.record.fold`, a rule
per op in :data:`hessviz.dense.record.FOLD_RULES`) folds over those steps and their tape values as
``SA = attention(X_a)``, ``Z = T(SA) + B(X)`` with ``T`` and ``B`` token-wise: a norm before the
attention is attention's input (its ``γ, β`` are input parameters), every step after it
composes ``T``, and ``a + b`` with ``b`` a branch of ``a`` is the residual ``a ↦ a + branch(a)``.
Steps on ``X`` that do not feed the attention (``parallel``'s ``ln2`` and ``FFN``) compose the
branch ``B``, added to ``T(SA)`` by the recipe's last step (``B = 0`` in the other placements).
The dense engine needs the attention once, with every parameterised step before it on ``X``,
after it, or in the branch ``B``; a new placement that keeps that shape is one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """``out = op(*inputs)``; ``which`` names a norm's weights (``"ln1"``, ``"ln2"``, ``"ln1_out"`` …:
    ``{which}_gamma``, ``{which}_beta``)."""

    op: str
    out: str
    inputs: tuple[str, ...]
    which: str = ""


def attention(out: str, x: str) -> Step:
    return Step("attention", out, (x,))


def norm(out: str, x: str, which: str) -> Step:
    return Step("norm", out, (x,), which)


def ffn(out: str, x: str) -> Step:
    return Step("ffn", out, (x,))


def add(out: str, a: str, b: str) -> Step:
    return Step("add", out, (a, b))


PLACEMENTS: dict[str, tuple[Step, ...]] = {
    "post": (
        attention("SA", "X"),
        add("R1", "X", "SA"),
        norm("Z1", "R1", "ln1"),
        ffn("F", "Z1"),
        add("R2", "Z1", "F"),
        norm("Z", "R2", "ln2"),
    ),
    "pre": (
        norm("X_ln", "X", "ln1"),
        attention("SA", "X_ln"),
        add("Z1", "X", "SA"),
        norm("Z1_ln", "Z1", "ln2"),
        ffn("F", "Z1_ln"),
        add("Z", "Z1", "F"),
    ),
    "none": (attention("SA", "X"), add("Z1", "X", "SA"), ffn("F", "Z1"), add("Z", "Z1", "F")),
    "attention": (attention("SA", "X"),),
    "parallel": (
        norm("X_ln", "X", "ln1"),
        attention("SA", "X_ln"),
        norm("X_ln2", "X", "ln2"),
        ffn("F", "X_ln2"),
        add("R", "X", "SA"),
        add("Z", "R", "F"),
    ),
    "peri": (
        norm("X_ln", "X", "ln1"),
        attention("SA", "X_ln"),
        norm("SA_ln", "SA", "ln1_out"),
        add("Z1", "X", "SA_ln"),
        norm("Z1_ln", "Z1", "ln2"),
        ffn("F", "Z1_ln"),
        norm("F_ln", "F", "ln2_out"),
        add("Z", "Z1", "F_ln"),
    ),
}
"""``cfg.norm`` -> its forward recipe."""


def where(recipe: tuple[Step, ...], step: Step) -> str:
    """How an error message names a norm's input: ``"ln1 input R1 = X + SA(X)"``."""
    by_out = {s.out: s for s in recipe}

    def expr(name: str) -> str:
        s = by_out.get(name)
        if s is None or s.op == "add" or (s.op == "norm" and s.inputs[0] in by_out):
            return name
        label = {"attention": "SA", "ffn": "FFN"}.get(s.op, s.which)
        return f"{label}({expr(s.inputs[0])})"

    x = step.inputs[0]
    source = by_out.get(x)
    if source is None:
        return f"{step.which} input {x}"
    shown = " + ".join(expr(i) for i in source.inputs) if source.op == "add" else expr(x)
    return f"{step.which} input {x} = {shown}"
