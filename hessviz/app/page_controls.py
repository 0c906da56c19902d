"""Each page's own controls, kept in the URL and in the view link: :func:`choice` (a row of buttons),
:func:`multichoice`, :func:`select`, :func:`slider` and :func:`text`.

A page control settles its value from the address (:meth:`hessviz.app.address.Address.page_value`),
starts its widget from it (:func:`hessviz.app.controls.start_widget`), records what the visitor
chooses and writes the view (:func:`hessviz.app.controls.sync`); one the lesson hides is a caption.
The shared sidebar and the run's address are :mod:`hessviz.app.controls`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import streamlit as st

from hessviz.app import state
from hessviz.app.controls import TYPED_NOTES, current, show_notes, start_widget, sync

_RANGE = "__range"
"""Suffix of the session key that remembers a page slider's range (see :func:`slider`)."""


def _page_control(
    key: str,
    default: object,
    settle: Callable[[list[str]], tuple[object, str | None]],
    draw: Callable[[], object],
    label: str,
    container=None,
    fit: Callable[[object], object] | None = None,
) -> object:
    """One page control: its value from the address (settled), its widget started from it, and
    what the visitor chooses recorded. A control the lesson hides is not drawn: a caption shows
    its value instead. ``fit`` maps a value the control no longer offers (its options or range
    changed with another control, e.g. a model without that loss) to one it does. The caption
    repeats the link's value (a text box's whole text) as plain text."""
    here = current()
    value = here.page_value(key, default, settle)
    if fit is not None:
        value = _fitted(label, value, fit)
        if key in st.session_state:  # what the widget held, before it is drawn
            held = st.session_state[key]
            if _fitted(label, held, fit) != held:
                st.session_state[key] = fit(held)
    if here.lesson.hides(key):
        shown = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        (container or st).caption(f"{label}: **{state.plain(shown)}** (fixed by this lesson link)")
        return value
    start_widget(key, list(value) if isinstance(value, (list, tuple)) else value)
    value = draw()
    here.choose(key, value)
    show_notes()
    sync()
    return value


def _fitted(label: str, value: object, fit: Callable[[object], object]) -> object:
    """``fit(value)``, with a line naming the control by its ``label`` when that is not ``value``."""
    now = fit(value)
    if now != value:
        current().notes.append(f"{label}: {state.shown(str(value))} is not offered here: used {now}.")
    return now


def choice(
    label: str, options: Sequence[str], key: str, default: str, *, help: str | None = None, container=None
) -> str:
    """A page control (button row) kept in the URL under ``key`` and in the view link.

    The buttons show the options themselves, which are also the URL values (``term=outer``).
    """
    where = container or st
    return _page_control(
        key,
        default,
        lambda texts: state.settle(key, texts, default, options=tuple(options)),
        lambda: where.segmented_control(label, options, required=True, key=key, help=help),
        label,
        where,
        fit=lambda v: v if v in options else default,
    )


def multichoice(
    label: str,
    options: Sequence[str],
    key: str,
    default: Sequence[str],
    *,
    help: str | None = None,
    container=None,
) -> list[str]:
    """A page multi-selection (pills) kept in the URL as a repeated key; returns the selected
    options in the order of ``options`` (none when the visitor turned every pill off: the page says
    what to pick; an address without the key gives ``default``)."""
    where = container or st
    ordered = [o for o in options if o in default]

    def draw() -> list[str]:
        picked = where.pills(label, options, selection_mode="multi", key=key, help=help) or []
        return [o for o in options if o in picked]

    return _page_control(
        key,
        ordered,
        lambda texts: state.settle(key, texts, ordered, options=tuple(options), multi=True),
        draw,
        label,
        where,
    )


def select(
    label: str, options: Sequence[str], key: str, default: str, *, help: str | None = None, container=None
) -> str:
    """A page selectbox kept in the URL under ``key``; the options are the URL values."""
    where = container or st
    return _page_control(
        key,
        default,
        lambda texts: state.settle(key, texts, default, options=tuple(options)),
        lambda: where.selectbox(label, options, key=key, help=help),
        label,
        where,
        fit=lambda v: v if v in options else default,
    )


def slider(
    label: str, lo: int, hi: int, key: str, default: int, *, help: str | None = None, container=None
) -> int:
    """A page integer slider kept in the URL under ``key``.

    A slider whose range changes (the Layer slider when the model changes) is a new widget to
    Streamlit, which would start it at ``lo``; it keeps the value it held instead (moved into the
    new range), as the view's link says and as a fresh visit of that link opens it."""
    where = container or st
    span = f"{key}{_RANGE}"
    if st.session_state.get(span, (lo, hi)) != (lo, hi) and key in st.session_state:
        st.session_state[key] = int(min(max(int(st.session_state[key]), lo), hi))
    st.session_state[span] = (lo, hi)
    return _page_control(
        key,
        default,
        lambda texts: state.settle(key, texts, default, int_range=(lo, hi)),
        lambda: where.slider(label, lo, hi, key=key, help=help),
        label,
        where,
        fit=lambda v: int(min(max(int(v), lo), hi)),
    )  # a range that shrank (fewer layers)


def text(
    label: str, key: str, default: str, max_chars: int, *, help: str | None = None, container=None
) -> str:
    """A page text box kept in the URL under ``key``. A text longer than ``max_chars`` is cut to it
    and an empty or blank one falls back to ``default``, each with one line naming the box by its
    ``label``; a box emptied by the visitor is given the default text back, and a longer paste is
    cut in the box itself, so the box always shows the text drawn. The widget takes any length (a
    browser's ``maxlength`` dropped a long paste without a word) and the server cuts it."""
    where = container or st

    def settle(texts: list[str]) -> tuple[str, str | None]:
        return _text_value(label, texts[-1], default, max_chars)

    def typed() -> None:
        used, note = _text_value(label, str(st.session_state.get(key) or ""), default, max_chars)
        if note is not None:
            st.session_state[key] = used
            st.session_state.setdefault(TYPED_NOTES, []).append(note)

    value = _page_control(
        key,
        default,
        settle,
        lambda: where.text_area(label, key=key, help=help, height=80, on_change=typed),
        label,
        where,
    )
    return _text_value(label, str(value or ""), default, max_chars)[0]


def _text_value(label: str, text: str, default: str, max_chars: int) -> tuple[str, str | None]:
    """The text used for the box ``label``: the default when blank, cut at ``max_chars``; and a note.

    >>> _text_value("Text", "x" * 5000, "d", 400)[1]
    'Text: the text was 5,000 characters long, more than the 400 this box takes: cut to its first 400.'
    """
    if not text.strip():
        return default, f"{label}: the box is empty, so the default text is drawn."
    if len(text) > max_chars:
        return text[:max_chars], (
            f"{label}: the text was {len(text):,} characters long, more than the "
            f"{max_chars:,} this box takes: cut to its first {max_chars:,}."
        )
    return text, None
