"""Figures: data -> ``plotly.graph_objects.Figure``. Pure functions, no Streamlit.

One vocabulary for the app's pages and the report of :mod:`hessviz.experiments`: the
same functions draw both. Every function takes numpy arrays (or plain dicts of them),
draws with the fonts, colours and template of :mod:`~hessviz.plots.style` for a
``theme`` (``"light"`` by default, ``"dark"``, or ``"host"``: the embedding app's),
puts signed matrices on the symmetric-log scale of :mod:`~hessviz.plots.scale` and
reduces large ones tile by tile.

* :mod:`~hessviz.plots.matrices`: the Hessian by blocks, one block, block norms, errors;
* :mod:`~hessviz.plots.eigen`: sorted eigenvalues and histograms;
* :mod:`~hessviz.plots.curves`: curves over seeds (centre and band), sweeps, fits, scatters;
* :mod:`~hessviz.plots.bars`: grouped bars and timings.
"""

from hessviz.plots.bars import (
    block_norm_bars,
    block_spectrum_bars,
    diagonal_norm_bars,
    grouped_bars,
    timing_bars,
)
from hessviz.plots.curves import (
    Guide,
    band_plot,
    collapse_plot,
    compare_plot,
    scatter_figure,
    side_by_side,
    sweep_plot,
    training_curves,
)
from hessviz.plots.eigen import spectral_density, spectrum_histogram, spectrum_sorted
from hessviz.plots.matrices import (
    attention_map,
    block_heatmap,
    block_norm_matrix,
    error_matrix,
    hessian_heatmap,
)
from hessviz.plots.scale import (
    MAX_CELLS,
    reduce_blocks,
    reduce_segments,
    reduction_factor,
    symlog,
    symlog_threshold,
    symlog_ticks,
    tile_extremes,
)
from hessviz.plots.style import (
    PALETTE,
    PLACEMENT_COLORS,
    PLACEMENT_NAMES,
    TERM_COLORS,
    THEMES,
    apply_theme,
    color_for,
    drawn_in,
    placement_name,
    pretty,
    signed,
)

__all__ = [
    "MAX_CELLS",
    "PALETTE",
    "PLACEMENT_COLORS",
    "PLACEMENT_NAMES",
    "TERM_COLORS",
    "THEMES",
    "Guide",
    "apply_theme",
    "attention_map",
    "band_plot",
    "collapse_plot",
    "block_heatmap",
    "block_norm_bars",
    "block_norm_matrix",
    "block_spectrum_bars",
    "color_for",
    "compare_plot",
    "diagonal_norm_bars",
    "drawn_in",
    "error_matrix",
    "grouped_bars",
    "hessian_heatmap",
    "placement_name",
    "pretty",
    "signed",
    "reduce_blocks",
    "reduce_segments",
    "reduction_factor",
    "scatter_figure",
    "side_by_side",
    "spectral_density",
    "spectrum_histogram",
    "spectrum_sorted",
    "sweep_plot",
    "symlog",
    "symlog_threshold",
    "symlog_ticks",
    "tile_extremes",
    "timing_bars",
    "training_curves",
]
