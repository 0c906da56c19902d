"""The page registry: every page of the app, its script, title, icon and URL path.

:func:`hessviz.app.main.main` builds ``st.navigation`` from :data:`SECTIONS`; the browser test and the
Learn page read the same list, so a page is declared once, here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PAGES = Path(__file__).resolve().parent / "pages"
"""The folder of the page scripts, inside the package (an install serves the same pages as a checkout)."""


@dataclass(frozen=True)
class PageSpec:
    script: str
    """The page's script in :data:`PAGES`, e.g. ``spectrum.py``."""
    title: str
    icon: str
    url_path: str
    """The URL path (``/spectrum``); the default page is also served at ``/``."""
    summary: str
    default: bool = False

    @property
    def path(self) -> Path:
        """The page script's absolute path (what ``st.Page`` runs)."""
        return PAGES / self.script


EXPLORE = (
    PageSpec(
        "hessian_map.py",
        "Hessian map",
        ":material/grid_on:",
        "hessian_map",
        "the full, outer or functional Hessian as a heatmap, block by block",
        default=True,
    ),
    PageSpec(
        "spectrum.py",
        "Spectrum",
        ":material/equalizer:",
        "spectrum",
        "eigenvalues of each term and how many are negative",
    ),
    PageSpec(
        "heterogeneity.py",
        "Heterogeneity",
        ":material/bar_chart:",
        "heterogeneity",
        "top eigenvalue and trace of every weight's and every head's Hessian block, matrix-free",
    ),
    PageSpec(
        "real_model.py",
        "Real model",
        ":material/psychology:",
        "real_model",
        "a pretrained layer on your text: attention, a head's exact Hessian, per-block curvature",
    ),
    PageSpec(
        "whole_model.py",
        "Whole model",
        ":material/account_tree:",
        "whole_model",
        "a whole pretrained model under its own objective: curvature and gradient of every tensor",
    ),
    PageSpec(
        "depth.py",
        "Depth",
        ":material/layers:",
        "depth",
        "stacks of blocks: the Hessian layer by layer, Post-LN and Pre-LN side by side",
    ),
    PageSpec(
        "scaling.py",
        "Scaling laws",
        ":material/show_chart:",
        "scaling",
        "block norms against ‖X‖₂, L and d on log–log axes, with fitted slopes",
    ),
    PageSpec(
        "verify.py",
        "Verify & speed",
        ":material/verified:",
        "verify",
        "closed form against autograd: relative error and timings",
    ),
    PageSpec("learn.py", "Learn", ":material/school:", "learn", "equations, papers, and a classroom tour"),
)

CLAIMS = (
    PageSpec(
        "optimization.py",
        "Optimization lens",
        ":material/trending_down:",
        "optimization",
        "what the curvature means for training",
    ),
    PageSpec(
        "layernorm_collapse.py",
        "LayerNorm collapse",
        ":material/compress:",
        "layernorm_collapse",
        "LayerNorm curvature as row variance collapses",
    ),
    PageSpec(
        "bounds.py",
        "Spectral bounds",
        ":material/vertical_align_top:",
        "bounds",
        "bounds on block spectral norms against the exact values",
    ),
    PageSpec(
        "claims.py",
        "Claims",
        ":material/fact_check:",
        "claims",
        "the papers' claims, checked one by one",
    ),
)

SECTIONS: dict[str, tuple[PageSpec, ...]] = {"Explore": EXPLORE, "Paper claims": CLAIMS}
ALL_PAGES: tuple[PageSpec, ...] = EXPLORE + CLAIMS


def spec(url_path: str) -> PageSpec:
    """The page registered under ``url_path``."""
    for p in ALL_PAGES:
        if p.url_path == url_path:
            return p
    raise KeyError(f"no page with url_path {url_path!r}; known: {[p.url_path for p in ALL_PAGES]}")
