r"""Matrices as heatmaps: the whole Hessian by blocks, one block, block norms, relative errors.

Signed matrices use the symmetric-log colour scale of :mod:`hessviz.plots.scale`; matrices
larger than :data:`~hessviz.plots.scale.MAX_CELLS` are reduced tile by tile, and the figure
says so.

>>> import numpy as np
>>> fig = hessian_heatmap(np.eye(4), {"W_Q": slice(0, 2), "W_K": slice(2, 4)})
>>> np.asarray(fig.data[0].customdata).diagonal().tolist(), [s.x0 for s in fig.layout.shapes]
([1.0, 1.0, 1.0, 1.0], [1.5, -0.5])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hessviz.plots.scale import (
    MAX_CELLS,
    max_abs,
    reduce_blocks,
    reduce_segments,
    reduction_factor,
    symlog,
    symlog_threshold,
    symlog_ticks,
    tile_extremes,
)
from hessviz.plots.style import (
    DIVERGING,
    FONT_SIZE,
    PHONE_WIDTH,
    SEQUENTIAL,
    layout,
    pretty,
    text_width,
    wrap,
)

MIN_CELL_FONT = 10
"""Smallest font a heatmap cell's number is written in; below it, the number is in the hover only."""
NOTE_CHARS = 44
"""A note under a figure ("Reduced view …") wraps after about this many characters."""

# ----------------------------------------------------------------------------- Hessian heatmaps


def _matrix_axes(
    fig: go.Figure, *, square: bool = True, x: dict | None = None, y: dict | None = None
) -> None:
    """Axes that read a matrix as it is printed: columns along the top, rows downwards, no grid, square
    cells (``square``: the y axis scales with the x axis, within the plot's domain); ``x`` and ``y`` add
    to (or replace) each axis's settings."""
    fig.update_xaxes({"side": "top", "showgrid": False, **(x or {})})
    square_y = {"scaleanchor": "x"} if square else {}
    fig.update_yaxes(
        {"autorange": "reversed", "showgrid": False, **square_y, "constrain": "domain", **(y or {})}
    )


def _axis_labels(labels: list[tuple], axis: str) -> list[str]:
    word = "row" if axis == "y" else "col"
    out = []
    for name, first, last in labels:
        where = f"{first}" if first == last else f"{first}–{last}"
        out.append(f"{name} {word} {where}")
    return out


def _symlog_heatmap(
    H: np.ndarray, R: np.ndarray, decades: float, x: list[str], y: list[str], hover: str
) -> go.Heatmap:
    """The diverging symmetric-log heatmap of the cells ``R`` (a reduced view of ``H``: the threshold
    and the colour bar's ticks are ``H``'s, ``decades`` below its largest entry); hover shows ``R``'s
    value (``customdata``) with the labels ``x``/``y``."""
    c = symlog_threshold(H, decades)
    Z = symlog(R, c)
    zmax = float(np.max(np.abs(Z))) or 1.0
    tickvals, ticktext = symlog_ticks(max_abs(H), c)
    return go.Heatmap(
        z=Z.astype(np.float32),
        customdata=R.astype(np.float32),
        x=x,
        y=y,
        colorscale=DIVERGING,
        zmid=0,
        zmin=-zmax,
        zmax=zmax,
        colorbar={"title": {"text": "H (symlog)"}, "tickvals": tickvals, "ticktext": ticktext},
        hovertemplate=hover,
    )


def hessian_heatmap(
    H: np.ndarray,
    offsets: dict[str, slice],
    *,
    title: str | None = None,
    heads: dict[str, Sequence[np.ndarray]] | None = None,
    max_cells: int = MAX_CELLS,
    decades: float = 4.0,
    height: int = 720,
    max_ticks: int = 48,
    theme: str = "light",
) -> go.Figure:
    """The ``(P, P)`` matrix on a symmetric-log scale with block boundaries and labels.

    ``heads`` (optional): for a weight split by attention head, one index array per head
    (positions inside that weight's ``vec_r``, e.g. from ``BlockConfig.head_indices``). Its
    rows and columns are then drawn head by head, ``W_Q[0]`` first, with thin lines between
    heads and thick lines between weights; ticks name each head (each weight when there
    would be more than ``max_ticks``); blocks under 1/40 of the side are named in the hover only.

    Hover shows the block (row weight, column weight), the (row, column) inside the
    block and the value. When ``P > max_cells`` each cell shows the largest-magnitude
    entry of a tile inside one block (one head), and the figure says so.
    """
    H = np.asarray(H, dtype=np.float64)
    P = H.shape[0]
    factor = reduction_factor(P, max_cells)
    if heads:
        segments = []
        for name, sl in offsets.items():
            if name in heads:
                segments += [
                    (f"{name}[{h}]", sl.start + np.asarray(idx)) for h, idx in enumerate(heads[name])
                ]
            else:
                segments.append((name, np.arange(sl.start, sl.stop)))
        R, labels = reduce_segments(H, segments, factor)
    else:
        R, labels = reduce_blocks(H, offsets, factor)
    ylab, xlab = _axis_labels(labels, "y"), _axis_labels(labels, "x")
    n = len(labels)
    # categorical axes: each cell's label names its block and index (the hover text);
    # shapes still address cells by position (0 … n-1)
    fig = go.Figure(
        _symlog_heatmap(H, R, decades, xlab, ylab, "%{y}<br>%{x}<br>H = %{customdata:.4g}<extra></extra>")
    )
    bounds, centers, names = _block_geometry(labels)
    weights = [i for i, b in enumerate(bounds) if i == 0 or _weight(names[i]) != _weight(names[i - 1])]
    _block_lines(fig, [bounds[i] for i in weights], n, width=1.5)
    between_heads = [b for i, b in enumerate(bounds) if i not in weights]
    _block_lines(fig, [0, *between_heads], n, width=0.6, dash="dot")
    if len(names) > max_ticks:  # too many heads to name: one tick per weight
        ends = [*[bounds[i] for i in weights[1:]], n]
        centers = [(bounds[i] + e - 1) // 2 for i, e in zip(weights, ends)]
        names = [_weight(names[i]) for i in weights]
        bounds = [bounds[i] for i in weights]
    small = FONT_SIZE - 2 if len(names) <= 16 else FONT_SIZE - 6
    widths = np.diff([*bounds, n])
    texts = [pretty(m) for m in names]
    flat = spaced_labels(centers, [text_width(s, small) for s in texts], n, widths)
    stood = spaced_labels(centers, [1.3 * small] * len(names), n, widths)
    upright = len(stood) > len(flat)  # side by side fewer fit: stand the x labels up
    keep = stood if upright else flat
    under = _labels_under(fig, centers, texts, keep, n, widths, small)
    centers, names = [centers[i] for i in keep], [names[i] for i in keep]
    axis = {
        "tickmode": "array",
        "tickvals": [xlab[i] for i in centers],
        "ticktext": [pretty(m) for m in names],
        "showgrid": False,
        "tickfont": {"size": small},
    }
    _matrix_axes(
        fig,
        x={**axis, "constrain": "domain", "tickangle": -90 if upright else 0},
        y={**axis, "tickvals": [ylab[i] for i in centers]},
    )
    if factor > 1:
        fig.add_annotation(
            text=wrap(
                f"Reduced view: P = {P:,} > {max_cells} cells, so each cell is the largest-magnitude "
                f"entry of a {factor}×{factor} tile. Pick a block pair for full resolution.",
                NOTE_CHARS,
            ),
            xref="paper",
            yref="paper",
            x=0,
            y=-0.02,
            yshift=-1.4 * small if under else 0,  # below the names drawn under the map
            xanchor="left",
            yanchor="top",
            showarrow=False,
            font={"size": FONT_SIZE - 4},
            bgcolor="rgba(255,200,0,0.25)",
        )
    layout(fig, title, height, theme=theme)
    # The row of names under the map: inside the reduced view's margin (its note, three lines, leaves
    # room for it below the map), else added to the figure rather than taken from the map.
    below = int(1.4 * small) if under and factor == 1 else 0
    fig.update_layout(margin={"b": 130 if factor > 1 else 30 + below}, height=fig.layout.height + below)
    return fig


def _labels_under(
    fig: go.Figure,
    centers: Sequence[int],
    texts: Sequence[str],
    keep: Sequence[int],
    n: int,
    widths: Sequence[float],
    size: int,
) -> list[int]:
    """Name under the map the blocks whose labels do not fit on the top axis beside their
    neighbours (W_K between W_Q and W_V on a phone): a second row, spaced the same way
    (:func:`spaced_labels`), so every block that can be named on a phone is named on the figure,
    not only in the hover. Returns the indices named there."""
    rest = [i for i in range(len(centers)) if i not in keep]
    if not rest:
        return []
    fits = spaced_labels(
        [centers[i] for i in rest], [text_width(texts[i], size) for i in rest], n, [widths[i] for i in rest]
    )
    under = [rest[j] for j in fits]
    for i in under:
        fig.add_annotation(
            text=texts[i],
            x=centers[i],
            y=n - 0.5,  # the map's lower edge (the y axis runs downwards)
            xref="x",
            yref="y",
            yanchor="top",
            showarrow=False,
            font={"size": size},
            name="block label",
        )
    return under


def spaced_labels(
    centers: Sequence[float],
    extents: Sequence[float],
    n: int,
    widths: Sequence[float],
    *,
    side: float = PHONE_WIDTH - 160,
) -> list[int]:
    """Indices (in order) of the tick labels to draw on an axis of ``n`` cells drawn ``side``
    pixels long (a heatmap on a phone), so that no two overlap: label ``i`` at cell ``centers[i]``
    takes ``extents[i]`` pixels along the axis (its text width side by side, its line height when
    stacked or stood up). The widest blocks (``widths``, in cells) are named first; a label is kept
    when it is at least half its extent plus half each kept neighbour's (and 4 px) away from it.
    The others are named in the hover.

    >>> spaced_labels([64, 192, 384, 768, 1280], [30] * 5, 1536, [128, 128, 256, 512, 512])
    [0, 2, 3, 4]
    """
    keep: list[int] = []
    for i in sorted(range(len(centers)), key=lambda k: -widths[k]):
        apart = all(
            abs(centers[i] - centers[j]) / max(n, 1) * side >= (extents[i] + extents[j]) / 2 + 4 for j in keep
        )
        if apart:
            keep.append(i)
    return sorted(keep)


def _block_geometry(labels: list[tuple]) -> tuple[list[int], list[int], list[str]]:
    """Boundaries (cell index where a block starts), centre cell and name of each block."""
    bounds, names = [], []
    for i, (name, _, _) in enumerate(labels):
        if not names or names[-1] != name:
            bounds.append(i)
            names.append(name)
    ends = [*bounds[1:], len(labels)]
    centers = [(b + e - 1) // 2 for b, e in zip(bounds, ends)]
    return bounds, centers, names


def _weight(label: str) -> str:
    """The weight a segment label belongs to: ``"W_Q[2]" -> "W_Q"``."""
    return label.partition("[")[0]


def _block_lines(
    fig: go.Figure, bounds: list[int], n: int, width: float = 1.5, dash: str | None = None
) -> None:
    """Lines before each boundary but the first (the first entry of ``bounds`` is the start)."""
    for b in bounds[1:]:
        for kw in (
            {"x0": b - 0.5, "x1": b - 0.5, "y0": -0.5, "y1": n - 0.5},
            {"y0": b - 0.5, "y1": b - 0.5, "x0": -0.5, "x1": n - 0.5},
        ):
            fig.add_shape(
                type="line",
                xref="x",
                yref="y",
                **kw,
                line={"color": "black", "width": width, **({"dash": dash} if dash else {})},
            )


def block_heatmap(
    B: np.ndarray,
    row_name: str,
    col_name: str,
    *,
    row_shape: tuple[int, ...] | None = None,
    col_shape: tuple[int, ...] | None = None,
    row_index: np.ndarray | None = None,
    col_index: np.ndarray | None = None,
    title: str | None = None,
    max_cells: int = 1024,
    decades: float = 4.0,
    height: int = 640,
    theme: str = "light",
) -> go.Figure:
    """One block ``H[row_name, col_name]`` at full resolution (reduced only beyond ``max_cells``).

    Hover gives (row, column) inside the block and, when the weight shapes are given,
    the weight entries they stand for: ``W_Q[i, j]`` for a matrix ``(rows, cols)``, ``b_Q[i]``
    for a vector ``(n,)``. For a head slice (``W_Q[1]``) give the whole weight's shape and
    ``row_index``/``col_index``, the slice's positions inside the whole weight's ``vec_r``,
    so the hover names the entry of the whole weight.
    """
    B = np.asarray(B, dtype=np.float64)
    m, n = B.shape
    factor = max(reduction_factor(m, max_cells), reduction_factor(n, max_cells))
    if factor > 1:
        ri = np.arange(0, m, factor)
        ci = np.arange(0, n, factor)
        R = tile_extremes(B, ri, ci)
        rows, cols = ri, ci
    else:
        R, rows, cols = B, np.arange(m), np.arange(n)

    def entry(name: str, shape: tuple[int, ...], index: np.ndarray | None, k: np.ndarray) -> list[str]:
        base = name.partition("[")[0]
        pos = k if index is None else np.asarray(index)[k]
        if len(shape) == 1:
            return [f"{base}[{i}]" for i in pos]
        return [f"{base}[{i // shape[1]}, {i % shape[1]}]" for i in pos]

    ylab = (
        [f"row {i} ({e})" for i, e in zip(rows, entry(row_name, row_shape, row_index, rows))]
        if row_shape
        else [f"row {i}" for i in rows]
    )
    xlab = (
        [f"col {j} ({e})" for j, e in zip(cols, entry(col_name, col_shape, col_index, cols))]
        if col_shape
        else [f"col {j}" for j in cols]
    )
    hover = f"block {row_name} × {col_name}<br>%{{y}}<br>%{{x}}<br>H = %{{customdata:.4g}}<extra></extra>"
    fig = go.Figure(_symlog_heatmap(B, R, decades, xlab, ylab, hover))
    _matrix_axes(
        fig,
        square=m == n,
        x={
            "showticklabels": False,
            "title": {"text": f"{pretty(col_name)} (columns)"},
            "constrain": "domain",
        },
        y={"showticklabels": False, "title": {"text": f"{pretty(row_name)} (rows)"}},
    )
    if factor > 1:
        note = wrap(
            f"Reduced view: {m}×{n} block, each cell is the largest-magnitude entry "
            f"of a {factor}×{factor} tile",
            NOTE_CHARS,
        )
        fig.add_annotation(
            text=note,
            xref="paper",
            yref="paper",
            x=0,
            y=-0.02,
            xanchor="left",
            yanchor="top",
            showarrow=False,
            font={"size": FONT_SIZE - 4},
            bgcolor="rgba(255,200,0,0.25)",
        )
    title = title or f"Block {pretty(row_name)} × {pretty(col_name)} ({m} × {n})"
    return layout(fig, title, height, theme=theme)


def short_number(v: float) -> str:
    """A cell's number in at most five characters: two significant digits between 0.01 and 1000
    (``0.44``, ``12``), else one digit and the exponent (``2e-4``, ``3e+5``); ``0`` for zero.

    >>> [short_number(v) for v in (0.4412, 0.0123, 0.00023, 12.3, 0.0, 4.5e5)]
    ['0.44', '0.012', '2e-4', '12', '0', '4e+5']
    """
    if v == 0 or not np.isfinite(v):
        return "0" if v == 0 else str(v)
    if 0.01 <= abs(v) < 1000:
        return f"{v:.2g}"
    mantissa, exponent = f"{v:.0e}".split("e")
    return f"{mantissa}e{int(exponent):+d}"


def cell_font(
    n_cols: int, texts: Sequence[str], *, height: int, panels: int = 1, reserved: int = 160
) -> int | None:
    """The font size at which every one of ``texts`` fits the cells of a square heatmap of
    ``n_cols`` columns (in one of ``panels`` side-by-side panels) drawn :data:`PHONE_WIDTH` wide and
    ``height`` tall, ``reserved`` pixels of the width going to tick labels, margins and the colour
    bar; capped at ``FONT_SIZE - 4``. ``None`` when that is under :data:`MIN_CELL_FONT`: the
    numbers would overprint, so they stay in the hover.

    A cell is ``side / n_cols`` wide with ``side = min(height − 150, (PHONE_WIDTH − reserved) /
    panels)``; text of ``k`` characters at size ``s`` is ``k · s · CHAR_WIDTH`` wide.

    >>> cell_font(5, ["0.44"], height=480), cell_font(16, ["0.44"], height=480)
    (14, None)
    """
    side = min(height - 150, (PHONE_WIDTH - reserved) / panels)
    cell = side / max(n_cols, 1)
    widest = max((text_width(s, 1.0) for s in texts), default=0.0)
    size = min(FONT_SIZE - 4, int(0.85 * cell / widest)) if widest else FONT_SIZE - 4
    return size if size >= MIN_CELL_FONT else None


def _square_heatmap(z: np.ndarray, labels: list[str], *, axes: dict | None = None, **trace) -> go.Figure:
    """An ``(n, n)`` matrix ``z`` on the sequential colour scale, ``labels`` on both axes, read as printed
    (:func:`_matrix_axes`, with ``axes``); ``trace`` goes to the ``go.Heatmap``."""
    fig = go.Figure(go.Heatmap(z=z, x=labels, y=labels, colorscale=SEQUENTIAL, **trace))
    _matrix_axes(fig, **(axes or {}))
    return fig


def block_norm_matrix(
    norms: np.ndarray,
    names: Sequence[str],
    *,
    kind: str = "spectral",
    title: str | None = None,
    height: int = 480,
    theme: str = "light",
) -> go.Figure:
    """The ``(n, n)`` matrix of block norms, log colour scale. Each value is written in its cell
    (:func:`short_number`) at a font that fits the cell on a phone (:func:`cell_font`); when no
    readable font fits (many weights), the values are in the hover only."""
    norms = np.asarray(norms, dtype=np.float64)
    positive = norms[norms > 0]
    floor = float(positive.min()) / 10 if positive.size else 1e-300
    Z = np.log10(np.maximum(norms, floor))
    text = [[short_number(v) for v in row] for row in norms]
    size = cell_font(len(names), [s for row in text for s in row], height=height)
    label = {"spectral": "‖·‖₂", "fro": "‖·‖_F"}.get(kind, kind)
    fig = _square_heatmap(
        Z,
        [pretty(n) for n in names],
        text=text,
        texttemplate="%{text}" if size else None,
        textfont={"size": size or MIN_CELL_FONT},
        customdata=norms,
        colorbar={"title": {"text": f"log₁₀ {label}"}},
        hovertemplate=f"block %{{y}} × %{{x}}<br>{label} = %{{customdata:.4g}}<extra></extra>",
    )
    return layout(fig, title or f"Block norms {label}", height, theme=theme)


def attention_map(
    A: np.ndarray, tokens: Sequence[str], *, title: str | None = None, height: int = 560, theme: str = "light"
) -> go.Figure:
    """One head's ``(L, L)`` attention weights: row ``i`` (a query token) spreads 1 over the
    columns (the key tokens); both axes are labelled with the tokens, ``#i`` added so that
    repeated tokens stay distinct."""
    A = np.asarray(A, dtype=np.float64)
    small = {"size": FONT_SIZE - 4}
    fig = _square_heatmap(
        A,
        [f"{t} #{i}" for i, t in enumerate(tokens)],
        axes={
            "x": {"tickangle": -90, "title": {"text": "key (attended to)"}, "tickfont": small},
            "y": {"title": {"text": "query"}, "tickfont": small},
        },
        zmin=0.0,
        zmax=float(A.max()) if A.size else 1.0,
        colorbar={"title": {"text": "weight"}},
        hovertemplate="query %{y}<br>key %{x}<br>weight = %{z:.3f}<extra></extra>",
    )
    fig = layout(fig, title or "Attention weights", height, theme=theme)
    fig.update_layout(margin={"b": 20})  # the keys are read at the top: no axis below to make room for
    return fig.update_xaxes(tickfont={"size": FONT_SIZE - 4}).update_yaxes(tickfont={"size": FONT_SIZE - 4})


# ----------------------------------------------------------------------------- verify


def error_matrix(
    errors: dict[str, np.ndarray],
    names: Sequence[str],
    *,
    title: str | None = "Relative error, closed form vs autograd",
    height: int = 440,
    wide: bool = False,
    theme: str = "light",
) -> go.Figure:
    """One panel per term: ``log10`` relative error of every block pair, value in each cell.

    ``wide``: drawn for a wide screen only (presentation mode, ``present=1``): narrower gaps between
    the panels and a narrower left margin (the block names are short and written once), so that at
    1280 px each panel is 300 px wide; on a phone the panels' tick labels would then touch."""
    terms = list(errors)
    fig = make_subplots(
        rows=1, cols=len(terms), subplot_titles=terms, horizontal_spacing=0.015 if wide else 0.06
    )
    ticks = [pretty(n) for n in names]
    allv = np.concatenate([np.asarray(e).ravel() for e in errors.values()])
    floor = 1e-17
    zmin, zmax = -17.0, max(-8.0, float(np.log10(max(allv.max(), floor))))
    texts = {t: [[f"{v:.0e}" if v > 0 else "0" for v in row] for row in np.asarray(errors[t])] for t in terms}
    size = cell_font(
        len(names),
        [s for rows in texts.values() for row in rows for s in row],
        height=height,
        panels=len(terms),
    )
    for k, t in enumerate(terms, start=1):
        E = np.asarray(errors[t], dtype=np.float64)
        fig.add_trace(
            go.Heatmap(
                z=np.log10(np.maximum(E, floor)),
                x=ticks,
                y=ticks,
                customdata=E,
                text=texts[t],
                texttemplate="%{text}" if size else None,
                textfont={"size": size or MIN_CELL_FONT},
                colorscale="Greens_r",
                zmin=zmin,
                zmax=zmax,
                showscale=k == len(terms),
                colorbar={"title": {"text": "log₁₀ rel. err."}},
                hovertemplate=f"{t}: block %{{y}} × %{{x}}<br>"
                "relative error %{customdata:.2e}<extra></extra>",
            ),
            row=1,
            col=k,
        )
        fig.update_yaxes(autorange="reversed", showticklabels=k == 1, row=1, col=k)  # rows named once
        if k > 1:
            fig.update_yaxes(ticks="", row=1, col=k)  # and no tick marks in the gaps
        fig.update_xaxes(side="bottom", row=1, col=k)
    fig.update_annotations(font={"size": FONT_SIZE - 2})
    fig = layout(fig, title, height, theme=theme)
    if wide:
        fig.update_layout(margin={"l": 40})
    return fig.update_xaxes(tickfont={"size": FONT_SIZE - 4}).update_yaxes(tickfont={"size": FONT_SIZE - 4})
