"""The classroom tour: five stops, each a page of the app with its settings and what to notice.

The Learn page steps through them (Back / Next, the story beside a live view of the stop); each
stop is also a plain link a teacher can paste into slides (:meth:`Stop.query`), and the browser
test opens every one and checks that it shows the view it names.
"""

from __future__ import annotations

from dataclasses import dataclass

from hessviz.app.address import Query, encode_query


@dataclass(frozen=True)
class Stop:
    """One stop: a ``title``, the page (its URL path), the URL keys it sets, and the story."""

    title: str
    page: str
    params: dict[str, str]
    notice: str

    def query(self, **flags: str) -> Query:
        """The stop's settings as a query, with lesson flags (``hide``, ``present``) added."""
        return {k: [v] for k, v in {**self.params, **flags}.items()}

    def link(self, **flags: str) -> str:
        """``page?key=value…``, relative to the app's root.

        >>> TOUR[0].link()
        'scaling?norm=attention&sc_axis=xnorm&sc_blk=W_Q%2CW_Q'
        """
        return f"{self.page}?{encode_query(self.query(**flags))}"


TOUR: tuple[Stop, ...] = (
    Stop("The ‖X‖⁶ law", "scaling", {"norm": "attention", "sc_axis": "xnorm", "sc_blk": "W_Q,W_Q"},
         "Self-attention alone, W_Q–W_Q block, swept over the input size. Notice that the outer curve is "
         "a straight line of slope close to 6 for small ‖X‖₂: doubling the input multiplies this curvature "
         "by about 64. It bends away once softmax stops being nearly uniform (‖X‖₂ around 1 and above)."),
    Stop("Pre-LN flattens it", "scaling", {"norm": "pre", "sc_axis": "xnorm", "sc_blk": "W_Q,W_Q"},
         "Same sweep, now look at the side-by-side view under the first chart. Attention alone climbs "
         "steeply, Post-LN less, and Pre-LN is almost flat: LayerNorm in front of attention removes the "
         "scale of X before it reaches the query and key weights, so the curvature no longer depends "
         "on ‖X‖₂."),
    Stop("Negative eigenvalues come from the functional term", "spectrum", {"norm": "post"},
         "The default Post-LN block. Notice that outer has no negative eigenvalue while full has hundreds, "
         "carrying a large share of the curvature: the loss is convex in the block's output, but the block "
         "bends the landscape into saddles. Switch the loss to cross-entropy: the picture stays."),
    Stop("1/L³ decay", "scaling", {"norm": "attention", "sc_axis": "L", "sc_blk": "W_Q,W_Q", "sc_seeds": "5"},
         "Attention alone at fixed ‖X‖₂, swept over the sequence length. Notice the outer W_Q–W_Q curve "
         "falling with a fitted slope near −3 (the theory's exponent): with more tokens, each token's row "
         "of X is smaller and softmax averages over more of them. The band shows the seed-to-seed "
         "spread; more seeds make the fit steadier."),
    Stop("LayerNorm curvature as row variance collapses", "layernorm_collapse",
         {"norm": "post", "xnorm": "0.01"},
         "A Post-LN block with a small input. LayerNorm divides each row by its standard deviation σ, so "
         "its Jacobian grows like 1/σ and its second derivative like 1/σ² as the rows flatten. Notice how "
         "the curvature explodes as σ shrinks with ε = 0, and how a positive ε (sidebar) caps it."),
)
"""The tour, in the order a 20-minute lesson takes it."""
