"""Every control that lives in the URL: the shared sidebar, each page's own controls, lesson links.

The rules (what a URL asks, what carries over to the next page) are :mod:`hessviz.app.address`;
this module is their Streamlit side. ``app.py`` calls :func:`begin_run` and :func:`open_page`
first in every run; then pages call :func:`sidebar` (or :func:`link_only`) and the page
controls :func:`~hessviz.app.page_controls.choice`, ``multichoice``, ``select``, ``slider`` and
``text`` (:mod:`hessviz.app.page_controls`, built on :func:`current`, :func:`start_widget`,
:func:`show_notes` and :func:`sync` here).

A control's widget starts from the address whenever the run arrived at a new one or at another
page (or the widget is new); otherwise the widget holds what the visitor chose, and that is
recorded. No widget is bound to the URL by Streamlit: :func:`sync` writes the view after each
control (a page may stop early, after which no Streamlit call goes through), only when it changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import streamlit as st

import hessviz as hv
from hessviz.app import address, cache, presets, registry, state
from hessviz.app.address import Address, Lesson
from hessviz.app.settings import SECTIONS, SETTINGS, AppSetting
from hessviz.app.state import View
from hessviz.block.config import SETTINGS as LIBRARY_SETTINGS
from hessviz.runtime.memory import format_bytes

_ADDRESS = "_hv_address"
_VIEW = "_hv_view"
_LINK = "_hv_link_slot"
_NOTES = "_hv_notes_slot"
_HINT = "_hv_present_slot"
_HINTED = "_hv_present_drawn"
_LINKED = "_hv_link_drawn"
_NOTED = "_hv_notes_drawn"
TYPED_NOTES = "_hv_typed_notes"
_RUN = "_hv_run"
_DRAWN = "_hv_sidebar_run"

# ----------------------------------------------------------------------------- one run


def _through_app() -> None:
    """Restart a run that Streamlit routed past ``app.py``.

    A folder named ``pages/`` next to ``app.py`` puts Streamlit in its v1 multipage mode until
    ``st.navigation`` is first called in the process: on a cold server (and in every
    ``AppTest`` run) an address such as ``/spectrum`` runs ``pages/spectrum.py`` alone, without
    ``app.py`` (no address read, no navigation), and the page raised. Such a run is known by its
    page list, which holds ``app.py`` itself (``app.py``'s own list never does); it is checked
    per run, as several cold visitors may arrive at once. The v1 mode is ended, as
    ``st.navigation`` ends it, and the run starts again, now through ``app.py``: the same address,
    the same page (a page's url path is its file's name)."""
    from pathlib import Path

    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None:
        return
    main = Path(ctx.pages_manager.main_script_path).resolve()
    listed = {
        Path(p["script_path"]).resolve()
        for p in ctx.pages_manager.get_pages().values()
        if p.get("script_path")
    }
    if main in listed:
        PagesManager.uses_pages_directory = False
        st.rerun()


def current() -> Address:
    """This session's :class:`~hessviz.app.address.Address`."""
    if _ADDRESS not in st.session_state:
        st.session_state[_ADDRESS] = Address()
    return st.session_state[_ADDRESS]


def _browser_query() -> tuple[address.Query, bool]:
    """The query the browser sent for this run, as it sent it, and whether Back/Forward sent it.

    Read from the run's context rather than ``st.query_params``, which Streamlit filters on a page
    change."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None:  # AppTest and bare runs: what st.query_params holds
        return {k: st.query_params.get_all(k) for k in st.query_params}, False
    return address.parse_query(ctx.query_string), bool(getattr(ctx, "is_history_navigation", False))


def begin_run() -> Lesson:
    """Start a run (``app.py`` calls it first): read the address the browser asked for, take what
    the visitor just moved in the shared controls, and return the lesson flags (the page config
    and the navigation depend on them)."""
    st.session_state[_RUN] = object()
    st.session_state[_LINK] = st.session_state[_NOTES] = st.session_state[_HINT] = None  # last run's places
    here = current()
    query, history = _browser_query()
    here.arrive(query, history=history)
    here.notes = st.session_state.pop(TYPED_NOTES, []) + here.notes
    if not here.fresh:
        for key, s in state.APP_SETTINGS.items():
            if key in st.session_state:
                here.shared[key] = _widget_value(s, st.session_state[key], here.shared[key])
    reconciled, notes = state.reconcile(here.shared)
    if reconciled != here.shared:
        for key, value in reconciled.items():  # the widgets show the value used (none drawn yet)
            if value != here.shared[key]:
                s = state.APP_SETTINGS[key]
                st.session_state[key] = (
                    _bias_pills(value, state.bias_letters(reconciled))
                    if s.members
                    else str(value)
                    if _typed(s)
                    else value
                )
        here.shared.update(reconciled)
        here.notes += notes
    return here.lesson


def _typed(s: AppSetting) -> bool:
    """Whether the setting is typed into a box rather than slid: an integer over a wide range
    (the seed)."""
    return s.grid is None and not s.choices and s.kind is int and s.app_range[1] - s.app_range[0] > 256


def _widget_value(s: AppSetting, held: object, kept: object) -> object:
    """The value a shared widget holds, as the setting's value (the seed's box holds text, the
    biases' pills a list of projections)."""
    if _typed(s):
        return state.settle(s.url, [str(held)], kept, int_range=s.app_range)[0]
    if s.members:
        return _bias_value(held or [], state.bias_letters(current().shared))
    return held


def _bias_value(picked: Sequence[str], offered: Sequence[str]) -> bool | tuple[str, ...]:
    """Pills to a ``bias`` value: none is ``False``, every offered projection ``True``, else the tuple.

    >>> _bias_value(["Q", "K", "V"], ("Q", "K", "V", "1", "2")), _bias_value([], ("Q",))
    (('Q', 'K', 'V'), False)
    """
    picked = tuple(b for b in offered if b in picked)
    return False if not picked else True if picked == tuple(offered) else picked


def _bias_pills(value: bool | tuple[str, ...], offered: Sequence[str]) -> list[str]:
    """A ``bias`` value as the pills it selects."""
    return list(offered) if value is True else [b for b in offered if value and b in value]


def open_page(url_path: str) -> None:
    """Name the page this run shows; draw the navigation at the top of the sidebar (each link
    carries the view) and keep a place at the top of the page for the address's notes."""
    here = current()
    here.open(url_path)
    if here.lesson.sidebar:
        _nav(st.sidebar)
    st.session_state[_NOTES] = st.empty()
    show_notes()
    sync()


def _nav(where) -> None:
    """The page links, each carrying this view's shared controls and lesson flags."""
    here = current()
    with where.container():
        for section, pages in registry.SECTIONS.items():
            st.markdown(f"**{section}**")
            for p in pages:
                st.page_link(
                    str(p.path),
                    label=p.title,
                    icon=p.icon,
                    query_params=address.link_params(here.nav_query(p.url_path)),
                )


def sync() -> None:
    """Bring the address bar and the sidebar's link up to date with the view (each control calls
    it after it is drawn, so a page that stops early still leaves its view in the URL; a write
    happens only when something changed, and each is one step of the browser's history)."""
    here = current()
    query = here.write()
    now = {k: st.query_params.get_all(k) for k in st.query_params}
    now = {k: v for k, v in now.items() if k.lower() not in address.EMBED_KEYS}
    if now != query:
        st.query_params.from_dict(query)
    drawn = (st.session_state.get(_RUN), address.encode_query(query))
    if st.session_state.get(_LINKED) != drawn and st.session_state.get(_LINK) is not None:
        st.session_state[_LINKED] = drawn
        _show_link()
    if st.session_state.get(_HINTED) != drawn and st.session_state.get(_HINT) is not None:
        st.session_state[_HINTED] = drawn
        _show_present_hint()


PRESENT_HINT = (
    "On a projector: [this view in presentation mode]({link}) puts the chart first, in larger type."
)
"""The header's one line outside presentation mode (``present=1``): at 1280×720 the explanation and
the controls push most pages' first chart below the fold, and the link is the way to it."""


def present_hint() -> None:
    """In the page's header (:func:`hessviz.app.ui.header`), outside presentation mode and outside
    another page's frame: :data:`PRESENT_HINT`, its link this view with ``present=1``, kept up to date
    by :func:`sync` as the page's controls settle (a phone, whose chart comes first, does not show it:
    :mod:`hessviz.app.styles`)."""
    here = current()
    if here.lesson.present or st.context.is_embedded:
        return
    st.session_state[_HINT] = st.container(key="hv_present_hint").empty()
    st.session_state[_HINTED] = None
    _show_present_hint()


def _show_present_hint() -> None:
    here = current()
    link = view_link(here.query(Lesson(here.lesson.hide, True)))
    st.session_state[_HINT].caption(PRESENT_HINT.format(link=link))


def show_notes() -> None:
    """Draw this run's notes in their place at the top of the page, when there are new ones: plain
    text, one per line (a note repeats what the URL or a text box held)."""
    slot = st.session_state.get(_NOTES)
    notes = tuple(dict.fromkeys(current().notes))
    if slot is None or not notes or st.session_state.get(_NOTED) == (st.session_state.get(_RUN), notes):
        return
    st.session_state[_NOTED] = (st.session_state.get(_RUN), notes)
    slot.warning("  \n".join(map(state.plain, notes)), icon=":material/link_off:")


def lesson() -> Lesson:
    return current().lesson


# ----------------------------------------------------------------------------- the shared sidebar


def start_widget(key: str, value: object) -> None:
    """Let the widget ``key`` start from ``value`` when the view came from the address."""
    here = current()
    if here.fresh or here.moved or key not in st.session_state:
        st.session_state[key] = value


def _typed_int(key: str, lo: int, hi: int) -> None:
    """A typed integer (the seed): an entry that is not an integer in range is put back to the value
    used, with one line saying so, so the box and the header never disagree."""
    text = str(st.session_state.get(key, "")).strip()
    kept = current().shared.get(key, lo)
    value, note = state.settle(key, [text], kept, int_range=(lo, hi))
    if note is not None:
        if value == kept:  # not a number at all: nothing to clamp
            note = f"{key}: {state.shown(text)} is not an integer in {lo} … {hi}: kept {key} = {kept}."
        st.session_state.setdefault(TYPED_NOTES, []).append(note)
    st.session_state[key] = str(value)


def _control(where, s: AppSetting, value: object, disabled: bool) -> object:
    """One sidebar widget for the setting ``s``, starting from ``value``."""
    key = s.url
    common = {"key": key, "help": s.help, "disabled": disabled}
    if s.choices:
        start_widget(key, value)
        return where.segmented_control(s.label, s.choices, required=True, **common)
    if s.members:  # the biases: one pill per projection the block has
        offered = state.bias_letters(current().shared)
        if isinstance(st.session_state.get(key), list):  # W_O or the gate may have gone
            st.session_state[key] = [b for b in st.session_state[key] if b in offered]
        start_widget(key, _bias_pills(value, offered))
        held = where.pills(s.label, offered, selection_mode="multi", format_func=lambda b: f"b_{b}", **common)
        return _bias_value(held or [], offered)
    if s.kind is bool:
        start_widget(key, value)
        return where.toggle(s.label, **common)
    if s.optional and s.app_range is not None:  # None reads "as many as the heads"
        lo, hi = s.app_range
        start_widget(key, value)
        return where.select_slider(
            s.label,
            [None, *range(lo, hi + 1)],
            format_func=lambda v: "= heads" if v is None else str(v),
            **common,
        )
    if s.grid is not None:
        start_widget(key, value)
        return where.select_slider(s.label, s.grid, format_func=lambda v: f"{v:g}", **common)
    lo, hi = s.app_range
    if _typed(s):  # a bad entry is put back with a note
        start_widget(key, str(value))
        text = where.text_input(
            f"{s.label} ({lo} … {hi})", on_change=_typed_int, args=(key, lo, hi), **common
        )
        value, _ = state.settle(key, [str(text)], value, int_range=(lo, hi))
        return value
    start_widget(key, value)
    return where.slider(s.label, lo, hi, **common)


def sidebar(*, stacks: bool = False) -> View:
    """Draw the shared controls and return the current :class:`View`.

    The controls come from :data:`hessviz.app.settings.SETTINGS`, section by section; a control
    that does not apply to the chosen block (``d_ff`` for attention alone) is disabled, and a
    control a lesson link hides (``hide=norm``) is not drawn (its value is the link's).
    A setting marked ``stacks_only`` (the depth, URL key ``layers``) is drawn only on pages
    that show stacks (``stacks=True``); every other page shows one block, and the depth is kept
    for the pages that do. Call it once near the top of a page. When the controls describe an
    invalid block it shows the reason and what to change, and stops the page.
    """
    _through_app()
    run = st.session_state.get(_RUN)
    if run is not None and st.session_state.get(_DRAWN) is run and _VIEW in st.session_state:
        return st.session_state[_VIEW]
    st.session_state[_DRAWN] = run
    here = current()
    lesson = here.lesson
    drawn = [s for s in SETTINGS if stacks or not s.stacks_only]
    sb = st.sidebar
    by_name = {s.name: s.default for s in LIBRARY_SETTINGS} | {s.name: here.shared[s.url] for s in SETTINGS}
    values: dict[str, object] = {}
    fixed = []
    if lesson.sidebar:
        for section, title in SECTIONS.items():
            settings = [s for s in drawn if s.section == section]
            shown = [s for s in settings if not lesson.hides(s.url)]
            if shown:
                sb.markdown(f"### {title}")
            if section == "modern" and shown:
                _presets(sb)
            for s in settings:
                if lesson.hides(s.url):
                    fixed.append(s)
                    values[s.url] = by_name[s.name] = here.shared[s.url]
                    continue
                value = _control(sb, s, here.shared[s.url], disabled=not s.relevant(by_name))
                values[s.url] = by_name[s.name] = value
                here.choose(s.url, value)
        if fixed:
            sb.caption(
                "Fixed by this lesson link: "
                + ", ".join(f"{s.url} = {s.format(here.shared[s.url])}" for s in fixed)
            )
        sb.markdown("### This view")
        st.session_state[_LINK] = sb.empty()
    else:
        values = {s.url: here.shared[s.url] for s in drawn}
    sync()
    try:
        view = View.from_values(values)
    except hv.HessvizError as err:
        st.error(
            f"**These controls do not describe a valid block.** {state.plain(state.sentence(err))}",
            icon=":material/block:",
        )
        st.stop()
    st.session_state[_VIEW] = view
    if lesson.sidebar:
        _size_panel(view)
        _lesson_panel()
    return view


def _presets(where) -> None:
    """One button per preset block (the sizes, input and seed stay as they are): it sets the
    controls, so the change is one step of the browser's history like any control's. The preset
    the view is in is shown as chosen; a lesson link that fixes one of their controls disables them."""
    here = current()
    now = presets.matching(here.shared)
    fixed = any(here.lesson.hides(k) for values in presets.PRESETS.values() for k in values)
    cols = where.columns(2)
    for i, name in enumerate(presets.PRESETS):
        cols[i % 2].button(
            name,
            key=f"_hv_preset_{i}",
            help=presets.HELP[name],
            on_click=_follow_preset,
            args=(name,),
            disabled=fixed or name == now,
            width="stretch",
            type="primary" if name == now else "secondary",
        )


def _follow_preset(name: str) -> None:
    """Set the shared controls' widgets to the preset (each in its widget's form)."""
    values = presets.apply(name, current().shared)
    for key in presets.PRESETS[name]:
        s = state.APP_SETTINGS[key]
        st.session_state[key] = (
            _bias_pills(values[key], state.bias_letters(values)) if s.members else values[key]
        )


def link_only() -> None:
    """The sidebar of a page that does not use the block's shared controls: only the link to this
    view and the lesson panel (the shared values are kept for the other pages)."""
    _through_app()
    st.session_state[_VIEW] = View.from_values({})
    st.session_state[_DRAWN] = st.session_state.get(_RUN)
    if current().lesson.sidebar:
        st.sidebar.markdown("### This view")
        st.session_state[_LINK] = st.sidebar.empty()
        _lesson_panel()
    sync()


def _size_panel(view: View) -> None:
    P = view.num_params
    sb = st.sidebar
    lim = cache.LIMITS
    sb.markdown(
        f"**Device:** {state.device_label()}  \n**Hessian:** P = {P:,} parameters, "
        f"{P:,} × {P:,} = {format_bytes(view.term_bytes)} per term (float64)"
    )
    sb.caption(
        f"Server ({lim.profile} profile): results of all visitors ≤ {format_bytes(lim.results_bytes)} "
        f"(cached now: {format_bytes(cache.LEDGER.cached)}), ≤ {lim.max_seconds:g} s of work per "
        f"view, {lim.heavy} heavy computation{'s' if lim.heavy > 1 else ''} at once."
    )
    if lim.profile == "local" and sb.button(
        "Clear cached results", icon=":material/delete_sweep:", help="drop every cached result of this server"
    ):
        cache.clear()


# ----------------------------------------------------------------------------- links


def base_url() -> str:
    """``http://host:port/page`` of this run (empty when unknown, e.g. under AppTest)."""
    base = ""
    with contextlib.suppress(Exception):
        base = (st.context.url or "").split("?", 1)[0]
    if base and base.count("/") < 3:  # "http://host:port" -> "http://host:port/"
        base += "/"
    return base


def app_root() -> str:
    """The app's root address, ``http://host:port/`` (``/`` when unknown), for links to a page."""
    base = base_url()
    return base.rsplit("/", 1)[0] + "/" if base else "/"


def view_link(query: address.Query | None = None) -> str:
    """The address of this view (or of ``query`` on this page)."""
    qs = address.encode_query(current().query() if query is None else query)
    return f"{base_url()}{'?' + qs if qs else ''}" or "./"


def _show_link() -> None:
    slot = st.session_state.get(_LINK)
    if slot is None:
        return
    with slot.container():
        st.markdown("**Link to this view** (copy it to share this page with these settings)")
        st.code(view_link(), language=None, wrap_lines=True)


def _lesson_panel() -> None:
    """ "Make a lesson link": pick what to hide and the presentation mode; the link is built here."""
    here = current()
    with st.sidebar.expander("Make a lesson link", icon=":material/school:"):
        st.caption(
            "A link for students: the controls you hide are fixed at this view's values "
            "(and shown in the page's header); presentation mode folds the text, enlarges the "
            "type and puts the chart first."
        )
        page_keys = list(here.page_defaults.get(here.page, {}))  # the controls this page has drawn
        options = [address.SIDEBAR, *state.APP_SETTINGS, *page_keys]
        labels = {k: f"{k} ({s.label})" for k, s in state.APP_SETTINGS.items()}
        labels[address.SIDEBAR] = "sidebar (every control and the navigation)"
        # the toggle above the choice: a focused multiselect grows, and shrinks again on the next
        # click elsewhere, so a toggle under it moved between mouse-down and mouse-up and the first
        # click after a "Hide" choice was lost
        present = st.toggle("Presentation mode", value=here.lesson.present, key="_hv_lesson_present")
        hide = st.multiselect(
            "Hide",
            options,
            default=[o for o in here.lesson.hide if o in options],
            format_func=lambda k: labels.get(k, f"{k} (this page)"),
            key="_hv_lesson_hide",
            help="the controls students will not see",
        )
        query = here.query(Lesson(frozenset(hide), present))
        st.code(view_link(query), language=None, wrap_lines=True)
        lesson_download(f"{here.page}?{address.encode_query(query)}", key="_hv_lesson_page")


def lesson_download(link: str, key: str, where=None) -> None:
    """ "Download as a page": the lesson link ``link`` (``page?query``) as one self-contained HTML file
    that needs no server (:mod:`hessviz.app.lesson_page`), made in the app as
    :mod:`hessviz.app.lesson_build` makes it: priced first and offered only when the server affords it
    (else its one line), made on a click in a builder process with a progress bar, under the
    heavy-slot gate, then kept in the server's store for every visitor of the link. The panel is a
    fragment: a click reruns it alone, not the page."""
    from hessviz.app import lesson_page

    where = where or st
    page = link.split("?", 1)[0]
    if page not in lesson_page.PAGES:
        where.caption(f"(A page of its own, offline: offered for {', '.join(lesson_page.PAGES)}.)")
        return
    with where.container():
        _lesson_page_panel(link, key)


@st.fragment
def _lesson_page_panel(link: str, key: str) -> None:
    from hessviz.app import budget, lesson_build, lesson_page, progress

    try:
        verdict = lesson_build.verdict(link, cache.LIMITS)
    except hv.HessvizError as err:
        st.caption(f"(No lesson page for this link: {state.plain(err)})")
        return
    if not verdict.ok:
        st.caption(f"(Not offered as a page on this server: {state.plain(verdict.message)})")
        return
    made = lesson_build.built(link)
    if made is None:
        slot = st.empty()  # the button, then the progress of the page it makes
        if not slot.button(
            f"Make it a page ({budget.about(verdict.cost.seconds)})",
            key=f"{key}_make",
            icon=":material/build:",
            help="this view as one HTML file that opens without the app or a network (plotly.js "
            f"inline, a few controls baked in): {verdict.cost.what}, made once for every visitor",
        ):
            return
        slot.empty()
        status = progress.open_status("the lesson page")  # its queue place and progress bar
        try:
            made = lesson_build.make(link)
        except progress.Cancelled:
            st.stop()  # nobody is watching
        except hv.HessvizError as err:  # over its limits, or a page it cannot make: one line
            st.warning(
                f"**The lesson page was not made.** {state.plain(state.sentence(err))}",
                icon=":material/block:",
            )
            return
        finally:
            progress.close_status(status)
    st.download_button(  # the bytes it was drawn with: never a build, never a file saying "gone"
        "Download as a page",
        lambda: made,
        lesson_page.file_name(link),
        "text/html",
        key=key,
        on_click="ignore",
        icon=":material/download:",
        help="this view as one HTML file that opens without the app or a network "
        "(plotly.js inline, a few controls baked in)",
    )
