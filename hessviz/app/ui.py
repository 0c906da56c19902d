"""Sidebar, URL state, page header, guarded computation, downloads, page controls."""

from __future__ import annotations

import contextlib
import io
import weakref
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st

import hessviz as hv
from hessviz import budget, plots
from hessviz.app import cache, progress, state
from hessviz.app.state import DEFAULTS, View
from hessviz.config import SECTIONS, SETTINGS, Setting
from hessviz.memory import format_bytes

_BIND = "query-params"
_VIEW = "_hv_view"
_EXTRA = "_hv_link_extra"
_LINK = "_hv_link_slot"
_RUN = "_hv_run"
_DRAWN = "_hv_sidebar_run"

# ----------------------------------------------------------------------------- sidebar


def begin_run() -> None:
    """Mark a new script run (``app.py`` calls it first), so :func:`sidebar` draws once per run."""
    st.session_state[_RUN] = object()


def _control(where, s: Setting, disabled: bool) -> object:
    """One sidebar widget for the setting ``s``, bound to the URL under ``s.url``."""
    common = {"key": s.url, "bind": _BIND, "help": s.help, "disabled": disabled}
    if s.choices:   # URL-bound choice widgets show the raw option (the URL value), e.g. ``norm=pre``
        return where.segmented_control(s.label, s.choices, default=s.default, required=True, **common)
    if s.kind is bool:
        return where.toggle(s.label, value=s.default, **common)
    if s.grid is not None:
        return where.select_slider(s.label, s.grid, value=s.default, format_func=lambda v: f"{v:g}",
                                   **common)
    lo, hi = s.app_range
    if hi - lo > 256:  # a wide range (the seed) is typed, not slid
        return int(where.number_input(s.label, lo, hi, s.default, step=1, **common))
    return where.slider(s.label, lo, hi, s.default, **common)


def _settle_url() -> None:
    """Clamp or refuse what the URL asks of the shared controls before they are drawn, so each
    control starts from an allowed value, and say so in one line per key (escaped)."""
    notes = []
    for key in state.APP_SETTINGS:
        texts = st.query_params.get_all(key)
        if not texts:
            continue
        value, note = state.settle_shared(key, texts)
        if note is not None:
            notes.append(note)
            st.query_params[key] = state.APP_SETTINGS[key].format(value)
            st.session_state[key] = value        # the control starts from the settled value
    _show_notes(notes)


def _show_notes(notes: list[str], container=None) -> None:
    if notes:
        (container or st).warning("  \n".join(notes), icon=":material/link_off:")


def _settle_page_key(key: str, default: object, container=None, **allowed) -> None:
    """:func:`hessviz.app.state.settle` for a page control's URL key (options, range, multi)."""
    texts = st.query_params.get_all(key)
    if not texts:
        return
    value, note = state.settle(key, texts, default, **allowed)
    if note is None:
        return
    if isinstance(value, list):
        st.query_params[key] = [str(v) for v in value]
    else:
        st.query_params[key] = str(value)
    st.session_state[key] = value                # the control starts from the settled value
    _show_notes([note], container)


def sidebar(*, stacks: bool = False) -> View:
    """Draw the shared controls (bound to the URL) and return the current :class:`View`.

    The controls come from :data:`hessviz.config.SETTINGS`, section by section; a control
    that does not apply to the chosen block (``d_ff`` for attention alone) is disabled.
    A setting marked ``stacks_only`` (the depth, URL key ``layers``) is drawn only on pages
    that show stacks (``stacks=True``); every other page shows one block.
    Call it once near the top of a page. When the controls describe an invalid block
    (e.g. LayerNorm with ``d = 1`` and ``ε = 0``) it shows the reason and what to change,
    and stops the page.
    """
    run = st.session_state.get(_RUN)
    if run is not None and st.session_state.get(_DRAWN) is run and _VIEW in st.session_state:
        return st.session_state[_VIEW]
    st.session_state[_DRAWN] = run
    _settle_url()
    sb = st.sidebar
    st.session_state[_EXTRA] = {}
    values: dict[str, object] = {}
    by_name = {s.name: s.default for s in SETTINGS}
    for section, title in SECTIONS.items():
        settings = [s for s in SETTINGS if s.in_app and s.section == section
                    and (stacks or not s.stacks_only)]
        if settings:
            sb.markdown(f"### {title}")
        for s in settings:
            values[s.url] = by_name[s.name] = _control(sb, s, disabled=not s.relevant(by_name))
    sb.markdown("### This view")
    st.session_state[_LINK] = sb.empty()
    try:
        view = View.from_values(values)
    except hv.HessvizError as err:
        _refresh_link(values)
        st.error(f"**These controls do not describe a valid block.** {err}", icon=":material/block:")
        st.stop()
    st.session_state[_VIEW] = view
    _refresh_link(values)
    _size_panel(view)
    return view


def _size_panel(view: View) -> None:
    P = view.num_params
    sb = st.sidebar
    lim = cache.LIMITS
    sb.markdown(f"**Device:** {state.device_label()}  \n**Hessian:** P = {P:,} parameters, "
                f"{P:,} × {P:,} = {format_bytes(view.term_bytes)} per term (float64)")
    sb.caption(f"Server ({lim.profile} profile): results of all visitors ≤ {format_bytes(lim.results_bytes)} "
               f"(cached now: {format_bytes(cache.LEDGER.cached)}), ≤ {lim.max_seconds:g} s of work per "
               f"view, {lim.heavy} heavy computation{'s' if lim.heavy > 1 else ''} at once.")
    if lim.profile == "local" and sb.button("Clear cached results", icon=":material/delete_sweep:",
                                            help="drop every cached result of this server"):
        cache.clear()


def _link(values: dict[str, object], extra: dict[str, object]) -> str:
    base = None
    with contextlib.suppress(Exception):
        base = st.context.url
    qs = state.query_string(values, extra)
    base = base or ""
    if base and base.count("/") < 3:  # "http://host:port" -> "http://host:port/"
        base += "/"
    return f"{base}{'?' + qs if qs else ''}" or "./"


def _refresh_link(values: dict[str, object] | None = None) -> None:
    slot = st.session_state.get(_LINK)
    if slot is None:
        return
    if values is None:
        view = st.session_state.get(_VIEW)
        values = view.values if view is not None else DEFAULTS
    url = _link(values, st.session_state.get(_EXTRA, {}))
    with slot.container():
        st.markdown("**Link to this view** (copy it to share this page with these settings)")
        st.code(url, language=None, wrap_lines=True)


# ----------------------------------------------------------------------------- page furniture


def header(title: str, view: View, *, icon: str | None = None) -> None:
    """The page title and, under it, the block in words."""
    st.title(f"{icon + ' ' if icon else ''}{title}")
    st.caption(view.describe())


NARROW_MATH_CSS = ("<style>@media (max-width: 640px) { [data-testid='stMarkdownContainer'] .katex-display "
                   "{ font-size: 0.78em; overflow-x: auto; overflow-y: hidden; } }</style>")
"""On a phone, display math is set smaller and scrolls sideways rather than being cut off."""


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
    """A short explanation for students, then the formulas. The equations that a formula lines up
    with ``\\qquad`` sit side by side in a row that wraps, so on a narrow screen they stack instead of
    running off the page; on a phone each is set smaller (:data:`NARROW_MATH_CSS`)."""
    st.markdown(text)
    st.html(NARROW_MATH_CSS)
    for f in formulas:
        parts = formula_parts(f)
        if len(parts) == 1:
            st.latex(parts[0])
            continue
        row = st.container(horizontal=True, wrap=True, gap="large", horizontal_alignment="center")
        for part in parts:
            row.latex(part)


@contextlib.contextmanager
def guard(what: str = "this computation") -> Iterator[progress.Status]:
    """Compute inside: a hessviz error (bad size, bad input, over budget) becomes a message and
    stops the page, never a traceback. Yields the :class:`~hessviz.app.progress.Status` that
    shows the queue place and progress; the computation stops when the visitor leaves."""
    status = progress.open_status(what)
    try:
        yield status
    except progress.Cancelled:
        st.stop()                      # nobody is watching: drop the run quietly
    except hv.SizeError as err:
        st.error(f"**{what[0].upper() + what[1:]} is too large for this server.** {err}",
                 icon=":material/memory:")
        st.stop()
    except hv.HessvizError as err:
        st.error(f"**Cannot compute {what}.** {err}", icon=":material/block:")
        st.stop()
    except MemoryError:
        st.error(f"**{what[0].upper() + what[1:]} ran out of memory.** Lower d, d_ff or L.",
                 icon=":material/memory:")
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


def afford(view: View, kind: str, *, stop: bool = True, advice: str | None = None,
           cfg: hv.BlockConfig | None = None, **extra: float) -> bool:
    """Ask the budget (:func:`hessviz.budget.check`, the one place every page asks) whether this
    server can afford the view. If not, say why and what to change, and stop the page (or,
    with ``stop=False``, return False after a one-line note). ``kind``: one of
    :data:`hessviz.budget.KINDS`; ``extra``: seeds, points, cases, steps… of the view;
    ``cfg``: the block actually computed when it is not the sidebar's."""
    cfg = cfg or view.cfg
    verdict = budget.check(budget.cost(kind, cfg, **extra), cache.LIMITS, cfg, advice)
    if verdict.ok:
        return True
    if not stop:
        st.caption(f"(Not drawn here: {verdict.message})")
        return False
    st.warning(f"**Too much for this server.** {verdict.message}", icon=":material/speed:")
    st.stop()
    return False


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
            arrays = {"expired": np.array("This view's data has left the server's memory since the page "
                                          "was drawn; reload the page and download again.")}
        return npz_bytes(arrays)


def downloads(name: str, fig: go.Figure | None = None, *,
              csv: Callable[[], dict] | None = None, npz: Callable[[], dict] | None = None,
              key: str | None = None) -> None:
    """Download buttons in one row: the figure (HTML) and its data (CSV columns or NPZ arrays).

    ``csv``/``npz`` are callables returning the columns/arrays. They run when the buttons are
    drawn (views of cached arrays, cheap); the files are built only when a button is clicked,
    and nothing but the arrays is kept (:class:`Detached`). An NPZ over the server's download
    limit is not offered. The buttons are as wide as their labels and wrap onto a second line
    when the row is narrow (a horizontal container, not fixed columns that cut "Figure (HTML)").
    """
    key = key or name
    row = st.container(horizontal=True, gap="small", wrap=True)
    if fig is not None:
        row.download_button("Figure (HTML)", lambda: figure_html(fig), f"{name}.html", "text/html",
                                key=f"dl_html_{key}", on_click="ignore", icon=":material/download:")
    if csv is not None:
        columns = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else list(v)
                   for k, v in csv().items()}
        row.download_button("Data (CSV)", lambda: csv_bytes(columns), f"{name}.csv", "text/csv",
                                key=f"dl_csv_{key}", on_click="ignore", icon=":material/table:")
    if npz is not None:
        held = Detached(npz())
        limit = cache.LIMITS.download_bytes
        too_big = held.nbytes > limit
        row.download_button("Data (NPZ)", held.npz, f"{name}.npz",
                                "application/octet-stream", key=f"dl_npz_{key}", on_click="ignore",
                                icon=":material/data_array:", disabled=too_big,
                                help=(f"{format_bytes(held.nbytes)}: over this server's download limit of "
                                      f"{format_bytes(limit)}; zoom into a block, or run the app "
                                      "locally") if too_big else None)


def chart(fig: go.Figure, name: str, *, csv: Callable[[], dict] | None = None,
          npz: Callable[[], dict] | None = None, key: str | None = None, height: int | None = None,
          container=None) -> None:
    """Draw ``fig`` in the app's light or dark theme, and its download buttons under it."""
    where = container or st
    plots.apply_theme(fig, "host")
    with where.container():
        st.plotly_chart(fig, key=f"chart_{key or name}", height=height or "content",
                        config={"displaylogo": False, "toImageButtonOptions": {"filename": name}})
        downloads(name, fig, csv=csv, npz=npz, key=key)


# ----------------------------------------------------------------------------- page controls


def _remember(key: str, value: object, default: object) -> None:
    extra = st.session_state.setdefault(_EXTRA, {})
    if value != default and value is not None:
        extra[key] = value
    else:
        extra.pop(key, None)
    _refresh_link()


def choice(label: str, options: Sequence[str], key: str, default: str, *, help: str | None = None,
           container=None) -> str:
    """A page control (button row) bound to the URL under ``key`` and added to the view link.

    The buttons show the options themselves, which are also the URL values (``term=outer``).
    """
    where = container or st
    _settle_page_key(key, default, where, options=tuple(options))
    value = where.segmented_control(label, options, default=default, required=True, key=key, bind=_BIND,
                                    help=help)
    _remember(key, value, default)
    return value


def multichoice(label: str, options: Sequence[str], key: str, default: Sequence[str], *,
                help: str | None = None, container=None) -> list[str]:
    """A page multi-selection (pills) bound to the URL as a repeated key; returns the selected
    options in the order of ``options`` (all of them when nothing is selected)."""
    where = container or st
    _settle_page_key(key, list(default), where, options=tuple(options), multi=True)
    value = where.pills(label, options, selection_mode="multi", default=list(default), key=key,
                        bind=_BIND, help=help) or list(options)
    value = [o for o in options if o in value]
    _remember(key, value, [o for o in options if o in default])
    return value


def select(label: str, options: Sequence[str], key: str, default: str, *, help: str | None = None,
           container=None) -> str:
    """A page selectbox bound to the URL under ``key``; the options are the URL values."""
    where = container or st
    _settle_page_key(key, default, where, options=tuple(options))
    value = where.selectbox(label, options, index=list(options).index(default), key=key, bind=_BIND,
                            help=help)
    _remember(key, value, default)
    return value


def slider(label: str, lo: int, hi: int, key: str, default: int, *, help: str | None = None,
           container=None) -> int:
    """A page integer slider bound to the URL under ``key``."""
    where = container or st
    _settle_page_key(key, default, where, int_range=(lo, hi))
    value = where.slider(label, lo, hi, default, key=key, bind=_BIND, help=help)
    _remember(key, value, default)
    return value


def text(label: str, key: str, default: str, max_chars: int, *, help: str | None = None,
         container=None) -> str:
    """A page text box bound to the URL under ``key``; a URL text longer than ``max_chars`` is cut
    to it (with a note), an empty one falls back to ``default``."""
    where = container or st
    texts = st.query_params.get_all(key)
    if texts:
        value, note = texts[-1], None
        if not value.strip():
            value, note = default, f"`{key}` is empty: used the default text."
        elif len(value) > max_chars:
            value, note = value[:max_chars], f"`{key}` is longer than {max_chars} characters: cut to them."
        if note is not None:
            st.query_params[key] = value
            st.session_state[key] = value
            _show_notes([note], where)
    value = where.text_area(label, default, max_chars=max_chars, key=key, bind=_BIND, help=help,
                            height=80) or default
    _remember(key, value, default)
    return value


def link_only() -> None:
    """The sidebar of a page that does not use the block's shared controls: only the link to this
    view (the page's own controls; no shared key)."""
    st.session_state[_EXTRA] = {}
    st.session_state[_VIEW] = View.from_values({})
    st.session_state[_DRAWN] = st.session_state.get(_RUN)
    st.sidebar.markdown("### This view")
    st.session_state[_LINK] = st.sidebar.empty()
    _refresh_link(DEFAULTS)
