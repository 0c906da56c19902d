"""Which view of the app shows each claim: claim id -> page path and query (the app's URL keys).

The claims of :mod:`hessviz.experiments` do not know the app; this table is where the app
links them. :func:`link` gives the relative URL the Claims page opens.
"""

from __future__ import annotations

CLAIM_VIEWS: dict[str, str] = {
    "xnorm6": "scaling?norm=attention&sc_axis=xnorm&sc_blk=W_Q,W_Q",
    "placement": "scaling?norm=pre&sc_axis=xnorm&sc_blk=W_Q,W_Q",
    "seqlen": "scaling?norm=attention&sc_axis=L&sc_blk=W_Q,W_Q",
    "nonconvex": "spectrum?norm=post",
    "ln_collapse": "layernorm_collapse?lnc_view=block",
    "bounds": "bounds?bd_view=attention",
    "gini": "optimization?opt_view=gradients",
    "optimizers": "optimization?opt_view=training",
    "depth": "depth?dp_blk=W_Q,W_Q&dp_term=outer",
    "modern": "scaling?norm=pre&ntype=rmsnorm&sc_axis=xnorm&sc_blk=W_Q,W_Q",
    "growth_protocol": "scaling?norm=none&causal=true&wo=true&sc_axis=xnorm&sc_blk=W_Q,W_Q",
    "gini_protocol": "optimization?opt_view=protocol",
    "optimizers_protocol": "optimization?opt_view=protocol",
}
"""Claim id -> ``page?query`` of the view that shows it."""


def link(claim_id: str) -> str:
    """``./page?query`` for ``claim_id`` (``./`` alone when the claim has no view)."""
    return f"./{CLAIM_VIEWS.get(claim_id, '')}"
