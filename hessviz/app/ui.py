"""Sidebar, URL state, page header, guarded computation, downloads, page controls."""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st

import hessviz as hv
from hessviz.api import hessian_bytes
from hessviz.app import state
from hessviz.app.state import DEFAULTS, View
from hessviz.config import SECTIONS, SETTINGS, Setting
from hessviz.memory import format_bytes, memory_limit

_BIND = "query-params"
_VIEW = "_hv_view"
_EXTRA = "_hv_link_extra"
_LINK = "_hv_link_slot"

# ----------------------------------------------------------------------------- sidebar


def _rendered_this_run(key: str) -> bool:
    """True when a widget with user key ``key`` was already drawn in this script run."""
    try:
        from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

        ctx = get_script_run_ctx()
        return ctx is not None and key in ctx.shared.widget_user_keys_this_run
    except Exception:  # internal API moved: fall back to drawing once per page
        return False


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


def sidebar() -> View:
    """Draw the shared controls (bound to the URL) and return the current :class:`View`.

    The controls come from :data:`hessviz.config.SETTINGS`, section by section; a control
    that does not apply to the chosen block (``d_ff`` for attention alone) is disabled.
    Call it once near the top of a page. When the controls describe an invalid block
    (e.g. LayerNorm with ``d = 1`` and ``ε = 0``) it shows the reason and what to change,
    and stops the page.
    """
    if _rendered_this_run("L") and _VIEW in st.session_state:
        return st.session_state[_VIEW]
    sb = st.sidebar
    st.session_state[_EXTRA] = {}
    values: dict[str, object] = {}
    by_name = {s.name: s.default for s in SETTINGS}
    for section, title in SECTIONS.items():
        settings = [s for s in SETTINGS if s.in_app and s.section == section]
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
    sb.markdown(f"**Device:** {state.device_label()}  \n**Hessian:** P = {P:,} parameters, "
                f"{P:,} × {P:,} = {format_bytes(view.term_bytes)} per term (float64)")
    sb.caption(f"Memory limit per result: {format_bytes(memory_limit(state.device()))}.")


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


def link_to_view(view: View, **extra: object) -> str:
    """The URL of this page with ``view`` and the page's own controls (``extra``)."""
    return _link(view.values, {**st.session_state.get(_EXTRA, {}), **extra})


# ----------------------------------------------------------------------------- page furniture


def header(title: str, view: View, *, icon: str | None = None) -> None:
    """The page title and, under it, the block in words."""
    st.title(f"{icon + ' ' if icon else ''}{title}")
    st.caption(view.describe())


def explain(text: str, *formulas: str) -> None:
    """A short explanation for students, then each formula with ``st.latex``."""
    st.markdown(text)
    for f in formulas:
        st.latex(f)


@contextlib.contextmanager
def guard(what: str = "this computation") -> Iterator[None]:
    """Show a hessviz error (bad size, bad input) as a message and stop the page, never a traceback."""
    try:
        yield
    except hv.SizeError as err:
        st.error(f"**{what.capitalize()} is too large for this machine.** {err}", icon=":material/memory:")
        st.stop()
    except hv.HessvizError as err:
        st.error(f"**Cannot compute {what}.** {err}", icon=":material/block:")
        st.stop()
    except MemoryError:
        st.error(f"**{what.capitalize()} ran out of memory.** Lower d, d_ff or L.", icon=":material/memory:")
        st.stop()


def size_advice(view: View) -> str:
    """Which controls to lower, naming the biggest weights."""
    shapes = view.cfg.param_shapes
    sizes = sorted(((math.prod(shape), n, shape) for n, shape in shapes.items()), reverse=True)
    parts = ", ".join(f"{n} {'×'.join(map(str, shape))}" for _, n, shape in sizes[:3])
    return (f"P = {view.num_params:,} (largest weights: {parts}). Lower d (P grows like d² + d·d_ff) "
            f"or d_ff, or choose norm = attention (no FFN).")


def require_size(view: View, max_params: int, what: str = "this page") -> None:
    """Refuse (message + stop) when P exceeds ``max_params`` or the library's memory estimate fails."""
    P = view.num_params
    if P > max_params:
        st.warning(f"**{what.capitalize()} draws at most P = {max_params:,} parameters to stay "
                   f"responsive; this block has P = {P:,}.** {size_advice(view)}",
                   icon=":material/speed:")
        st.stop()
    need = hessian_bytes(view.cfg, view.cfg.param_names, 8, "closed_form")
    limit = memory_limit(state.device())
    if need > limit:
        st.error(f"**A dense Hessian term needs about {format_bytes(need)}, over this machine's limit of "
                 f"{format_bytes(limit)}.** {size_advice(view)}", icon=":material/memory:")
        st.stop()


# ----------------------------------------------------------------------------- downloads


def figure_html(fig: go.Figure) -> str:
    """A self-contained interactive HTML file of ``fig`` (plotly.js inlined, works offline)."""
    return fig.to_html(include_plotlyjs=True, full_html=True)


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
    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def downloads(name: str, fig: go.Figure | None = None, *,
              csv: Callable[[], dict] | None = None, npz: Callable[[], dict] | None = None,
              key: str | None = None) -> None:
    """Download buttons in one row: the figure (HTML) and its data (CSV columns or NPZ arrays).

    ``csv``/``npz`` are callables returning the columns/arrays; they (and the HTML) are
    only built when the button is clicked, so the page stays fast.
    """
    key = key or name
    cols = st.columns(3, gap="small")
    if fig is not None:
        cols[0].download_button("Figure (HTML)", lambda: figure_html(fig), f"{name}.html", "text/html",
                                key=f"dl_html_{key}", on_click="ignore", icon=":material/download:")
    if csv is not None:
        cols[1].download_button("Data (CSV)", lambda: csv_bytes(csv()), f"{name}.csv", "text/csv",
                                key=f"dl_csv_{key}", on_click="ignore", icon=":material/table:")
    if npz is not None:
        cols[2].download_button("Data (NPZ)", lambda: npz_bytes(npz()), f"{name}.npz",
                                "application/octet-stream", key=f"dl_npz_{key}", on_click="ignore",
                                icon=":material/data_array:")


def chart(fig: go.Figure, name: str, *, csv: Callable[[], dict] | None = None,
          npz: Callable[[], dict] | None = None, key: str | None = None, height: int | None = None,
          container=None) -> None:
    """Draw ``fig`` (theme-aware) and its download buttons under it."""
    where = container or st
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
    value = where.segmented_control(label, options, default=default, required=True, key=key, bind=_BIND,
                                    help=help)
    _remember(key, value, default)
    return value


def multichoice(label: str, options: Sequence[str], key: str, default: Sequence[str], *,
                help: str | None = None, container=None) -> list[str]:
    """A page multi-selection (pills) bound to the URL as a repeated key; returns the selected
    options in the order of ``options`` (all of them when nothing is selected)."""
    where = container or st
    value = where.pills(label, options, selection_mode="multi", default=list(default), key=key,
                        bind=_BIND, help=help) or list(options)
    value = [o for o in options if o in value]
    _remember(key, value, [o for o in options if o in default])
    return value


def select(label: str, options: Sequence[str], key: str, default: str, *, help: str | None = None,
           container=None) -> str:
    """A page selectbox bound to the URL under ``key``; the options are the URL values."""
    where = container or st
    value = where.selectbox(label, options, index=list(options).index(default), key=key, bind=_BIND,
                            help=help)
    _remember(key, value, default)
    return value


def slider(label: str, lo: int, hi: int, key: str, default: int, *, help: str | None = None,
           container=None) -> int:
    """A page integer slider bound to the URL under ``key``."""
    where = container or st
    value = where.slider(label, lo, hi, default, key=key, bind=_BIND, help=help)
    _remember(key, value, default)
    return value


def toggle(label: str, key: str, default: bool = False, *, help: str | None = None,
           container=None) -> bool:
    """A page checkbox bound to the URL under ``key``."""
    where = container or st
    value = where.checkbox(label, default, key=key, bind=_BIND, help=help)
    _remember(key, value, default)
    return value
