"""Page furniture: the header, explanations, guarded computation, the budget's verdict, charts and
downloads. The controls and the URL are :mod:`hessviz.app.controls`."""

from __future__ import annotations

import contextlib
import io
import weakref
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st

import hessviz as hv
from hessviz import plots
from hessviz.app import budget, cache, controls, progress, state
from hessviz.app.state import View
from hessviz.plots import modebar
from hessviz.runtime.memory import format_bytes

# ----------------------------------------------------------------------------- page furniture


def header(title: str, view: View | None = None, *, icon: str | None = None):
    """The page title and, under it, the block in words (every value, also those a lesson hides;
    none for the pages of a pretrained model, ``view=None``). Both sit in one container (key
    ``hv_header``) that :mod:`hessviz.app.styles` keeps on top when it lifts the first chart above
    the rest of the page; it is returned, so that a page that learns what it shows later (a model
    chosen further down) can write its caption there. Under it, outside presentation mode, one line
    links this view with ``present=1`` (:func:`hessviz.app.controls.present_hint`)."""
    box = st.container(key="hv_header", gap="small")
    with box:
        st.title(f"{icon + ' ' if icon else ''}{title}")
        if view is not None:
            st.caption(view.describe())
    controls.present_hint()  # under the header's captions, those a page writes later too
    return box


def formula_parts(formula: str) -> list[str]:
    r"""``formula`` split at its top-level ``\qquad`` (outside braces) into the
    equations it lines up, each without its trailing comma's space.

    >>> formula_parts(r"a = 1,\qquad \frac{b}{\qquad c}\qquad d")
    ['a = 1,', '\\frac{b}{\\qquad c}', 'd']
    """
    parts, depth, start, i = [], 0, 0, 0
    while i < len(formula):
        ch = formula[i]
        depth += (ch == "{") - (ch == "}")
        if depth == 0 and formula.startswith(r"\qquad", i):
            parts.append(formula[start:i])
            i = start = i + len(r"\qquad")
            continue
        i += 1
    parts.append(formula[start:])
    return [s.strip() for s in parts if s.strip()]


def explain(text: str, *formulas: str) -> None:
    """A short explanation for students, then the formulas; folded in presentation mode
    (``present=1``), so the chart comes first. The equations that a formula lines up with
    ``\\qquad`` sit side by side in a row that wraps, so on a narrow screen they stack instead of
    running off the page (and :mod:`hessviz.app.styles` sets them smaller on a phone)."""
    where = (
        st.expander("What this page shows", icon=":material/menu_book:")
        if controls.lesson().present
        else st.container()
    )
    with where:
        st.markdown(text)
        for f in formulas:
            parts = formula_parts(f)
            if len(parts) == 1:
                st.latex(parts[0])
                continue
            row = st.container(horizontal=True, wrap=True, gap="large", horizontal_alignment="center")
            for part in parts:
                row.latex(part)


def page(title: str, text: str, *formulas: str, stacks: bool = False) -> View:
    """The opening of a page on the sidebar's block: the shared controls
    (:func:`hessviz.app.controls.sidebar`; ``stacks``, whether the page draws stacks of layers), the
    title with the block in words (:func:`header`) and the explanation (:func:`explain`). Returns the
    view."""
    view = controls.sidebar(stacks=stacks)
    header(title, view)
    explain(text, *formulas)
    return view


@contextlib.contextmanager
def guard(what: str = "this computation", advice: str = "") -> Iterator[progress.Status]:
    """Compute inside: a hessviz error (bad size, bad input, over budget) becomes a message and
    stops the page, never a traceback. The error's own words are drawn as plain text (a sentence:
    :func:`hessviz.app.state.sentence`): a message may repeat a visitor's text (a loss key's
    sentence, a folder typed).
    ``advice``: what the visitor can change when it is too large or too slow (the page's own words;
    without it, the size controls). Yields the :class:`~hessviz.app.progress.Status` that shows the
    queue place and progress; the computation stops when the visitor leaves."""
    status = progress.open_status(what)
    try:
        yield status
    except progress.Cancelled:
        st.stop()  # nobody is watching: drop the run quietly
    except hv.SizeError as err:
        st.error(
            f"**Too large for this server: {what}.** {state.plain(state.sentence(err))}"
            + (f" {advice}" if advice else ""),
            icon=":material/memory:",
        )
        st.stop()
    except budget.OverBudget as err:
        words = f"{getattr(err, 'stopped', err)} {advice}" if advice else str(err)
        st.error(f"**Stopped: {what}.** {state.plain(state.sentence(words))}", icon=":material/speed:")
        st.stop()
    except hv.HessvizError as err:
        st.error(f"**Cannot compute {what}.** {state.plain(state.sentence(err))}", icon=":material/block:")
        st.stop()
    except MemoryError:
        st.error(
            f"**Out of memory: {what}.** " + (advice or "Lower d, d_ff or L."),
            icon=":material/memory:",
        )
        st.stop()
    finally:
        progress.close_status(status)


def size_advice(view: View) -> str:
    """Which controls to lower, naming the biggest weights."""
    return budget.size_advice(view.cfg)


def verdict(view: View, kind: str, *, cfg: hv.BlockConfig | None = None, **extra: float) -> budget.Verdict:
    """The budget's verdict on a view, without drawing anything (to choose between two methods)."""
    cfg = cfg or view.cfg
    return budget.check(budget.cost(kind, cfg, **extra), cache.LIMITS, cfg)


def long_note(c: budget.Cost) -> None:
    """Over :data:`hessviz.app.budget.LONG_SECONDS` of estimated work, say so before it runs: how long,
    that a progress bar follows, and that moving on stops it (:func:`hessviz.app.budget.long_words`)."""
    words = budget.long_words(c)
    if words:
        st.info(words, icon=":material/hourglass_top:")


def afford(
    view: View,
    kind: str,
    *,
    stop: bool = True,
    advice: str | None = None,
    cfg: hv.BlockConfig | None = None,
    **extra: float,
) -> bool:
    """Ask the budget (:func:`hessviz.app.budget.check`, the one place every page asks) whether this
    server can afford the view. If not, say why and what to change, and stop the page (or,
    with ``stop=False``, return False after a one-line note). ``kind``: one of
    :data:`hessviz.app.budget.KINDS`; ``extra``: seeds, points, cases, steps… of the view;
    ``cfg``: the block actually computed when it is not the sidebar's."""
    cfg = cfg or view.cfg
    verdict = budget.check(budget.cost(kind, cfg, **extra), cache.LIMITS, cfg, advice)
    if verdict.ok:
        long_note(verdict.cost)
        return True
    if not stop:
        st.caption(f"(Not drawn here: {verdict.message})")
        return False
    st.warning(f"**Too much for this server.** {state.sentence(verdict.message)}", icon=":material/speed:")
    st.stop()
    return False


def table(rows: Sequence[dict], container=None) -> None:
    """A small table of ``rows`` (dicts with the same keys, the header) as text that wraps: a
    narrow column cuts neither a header ("theory") nor a value, as a data-frame grid's fixed
    columns did. None is shown as "—"."""
    if not rows:
        return
    names = list(rows[0])

    def cell(v) -> str:
        return "—" if v is None else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(cell(r.get(n)) for n in names) + " |" for r in rows]
    (container or st).markdown("\n".join(lines))


# ----------------------------------------------------------------------------- downloads


def figure_html(fig: go.Figure) -> str:
    """A self-contained interactive HTML file of ``fig`` in the light theme (plotly.js inlined, works
    offline): the app's own theme is Streamlit's and means nothing outside it."""
    return plots.apply_theme(go.Figure(fig), "light").to_html(include_plotlyjs=True, full_html=True)


def csv_bytes(columns: dict[str, Sequence | np.ndarray]) -> bytes:
    """CSV of equal-length columns, header first."""
    import csv

    names = list(columns)
    cols = [np.asarray(columns[n]).ravel() for n in names]
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(names)
    for row in zip(*cols):
        w.writerow([f"{v:.17g}" if isinstance(v, float | np.floating) else v for v in row])
    return out.getvalue().encode()


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed ``.npz`` (compressing float64 noise saves little and took seconds)."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


class Detached:
    """Arrays for a download, held without pinning anything else.

    Streamlit keeps a download's callable for as long as the session lives (two minutes after
    the tab closes by default), and a callable written in a page holds that page's whole run
    (every Hessian it drew). So the page's callable is run when the button is drawn, and only
    its arrays are held: small ones (≤ 1 MiB) copied, large ones by a weak reference to the
    cached array they view, so the server-wide cache alone decides how long a Hessian lives.
    """

    SMALL = 1 << 20

    def __init__(self, arrays: dict):
        self.items: dict[str, tuple] = {}
        self.nbytes = 0
        for name, value in arrays.items():
            a = np.asarray(value)
            self.nbytes += a.nbytes
            if a.nbytes <= self.SMALL or a.dtype == object:
                self.items[name] = ("copy", np.array(a, copy=True))
                continue
            root = a
            while isinstance(root.base, np.ndarray):
                root = root.base
            offset = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
            self.items[name] = ("view", weakref.ref(root), offset, a.shape, a.strides, a.dtype)

    def arrays(self) -> dict[str, np.ndarray] | None:
        """The arrays again, or None when a large one has left the cache since."""
        out = {}
        for name, item in self.items.items():
            if item[0] == "copy":
                out[name] = item[1]
                continue
            _, ref, offset, shape, strides, dtype = item
            root = ref()
            if root is None:
                return None
            out[name] = np.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)
        return out

    def npz(self) -> bytes:
        arrays = self.arrays()
        if arrays is None:
            arrays = {
                "expired": np.array(
                    "This view's data has left the server's memory since the page "
                    "was drawn; reload the page and download again."
                )
            }
        return npz_bytes(arrays)


def block_columns(blocks: np.ndarray | dict[str, np.ndarray], names: Sequence[str], value: str) -> dict:
    """The CSV columns of an ``(n, n)`` matrix of blocks, one line per block: ``row`` and ``col`` (of
    ``names``) and ``value``; a dict of such matrices (term -> matrix) adds a first column ``term``."""
    rows, cols = [a for a in names for _ in names], [b for _ in names for b in names]
    if not isinstance(blocks, dict):
        return {"row": rows, "col": cols, value: np.asarray(blocks).ravel()}
    return {
        "term": [t for t in blocks for _ in rows],
        "row": rows * len(blocks),
        "col": cols * len(blocks),
        value: np.concatenate([np.asarray(m).ravel() for m in blocks.values()]),
    }


DOWNLOADS = {
    "html": ("Figure (HTML)", "text/html", ":material/download:"),
    "csv": ("Data (CSV)", "text/csv", ":material/table:"),
    "npz": ("Data (NPZ)", "application/octet-stream", ":material/data_array:"),
}
"""File ending -> the download button's label, MIME type and icon."""


def downloads(
    name: str,
    fig: go.Figure | None = None,
    *,
    csv: Callable[[], dict] | None = None,
    npz: Callable[[], dict] | None = None,
    key: str | None = None,
) -> None:
    """Download buttons in one row: the figure (HTML) and its data (CSV columns or NPZ arrays).

    ``csv``/``npz`` are callables returning the columns/arrays. They run when the buttons are
    drawn (views of cached arrays, cheap); the files are built only when a button is clicked,
    and nothing but the arrays is kept (:class:`Detached`). An NPZ over the server's download
    limit is not offered. The buttons are as wide as their labels and wrap onto a second line
    when the row is narrow (a horizontal container, not fixed columns that cut "Figure (HTML)").
    """
    key = key or name
    row = st.container(horizontal=True, gap="small", wrap=True)

    def button(ext: str, data: Callable[[], bytes], **extra) -> None:
        label, mime, icon = DOWNLOADS[ext]
        row.download_button(
            label, data, f"{name}.{ext}", mime, key=f"dl_{ext}_{key}", on_click="ignore", icon=icon, **extra
        )

    if fig is not None:
        button("html", lambda: figure_html(fig))
    if csv is not None:
        columns = {
            k: np.array(v, copy=True) if isinstance(v, np.ndarray) else list(v) for k, v in csv().items()
        }
        button("csv", lambda: csv_bytes(columns))
    if npz is not None:
        held = Detached(npz())
        limit = cache.LIMITS.download_bytes
        too_big = held.nbytes > limit
        button(
            "npz",
            held.npz,
            disabled=too_big,
            help=(
                f"{format_bytes(held.nbytes)}: over this server's download limit of "
                f"{format_bytes(limit)}; zoom into a block, or "
                + (
                    "run the app on your own machine (`streamlit run app.py`)"
                    if cache.LIMITS.profile == "hosted"
                    else "start this server with a larger `HESSVIZ_DOWNLOAD_LIMIT`"
                )
            )
            if too_big
            else None,
        )


PRESENT_HEIGHT = 560
"""Pixels: the tallest figure in presentation mode. A page's first chart starts 142 px down at
1280×720 (99 px without the block's caption), so the whole chart is on a projector's first screen;
and the heatmaps a page opens with get at least 300 px (at 360 px the Hessian map was 130 px wide and
the Real model's attention map 85 px tall: issue 44)."""

EMBEDDED_HEIGHT = 440
"""Pixels: the tallest figure in presentation mode inside another page's frame (the Learn page's
live tour view, 560 px tall, which shows no title above its chart)."""


def chart(
    fig: go.Figure,
    name: str,
    *,
    csv: Callable[[], dict] | None = None,
    npz: Callable[[], dict] | None = None,
    key: str | None = None,
    height: int | None = None,
    container=None,
) -> None:
    """Draw ``fig`` in the app's light or dark theme, and its download buttons under it. In
    presentation mode a figure is at most :data:`PRESENT_HEIGHT` pixels tall, so that it fits a
    projector's 720 rows under the title (:data:`EMBEDDED_HEIGHT` in the tour's frame).

    ``fig`` is never changed: a page's figures are shared by every visitor from the server's store
    (:func:`hessviz.app.cache.view`), so one laid out in another theme is copied before it is themed."""
    where = container or st
    if getattr(fig, "_hessviz_theme", None) != "host":
        fig = plots.apply_theme(go.Figure(fig), "host")
    if controls.lesson().present:
        tall = height or fig.layout.height or PRESENT_HEIGHT
        height = min(tall, EMBEDDED_HEIGHT if st.context.is_embedded else PRESENT_HEIGHT)
    with where.container():
        st.plotly_chart(
            fig,
            key=f"chart_{key or name}",
            height=height or "content",
            config=modebar.config(name),
        )
        downloads(name, fig, csv=csv, npz=npz, key=key)
