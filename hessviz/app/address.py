"""The address bar: one view per URL, kept across pages, written once per run.

Pure Python (no Streamlit), so the rules can be tested alone; :mod:`hessviz.app.ui` calls it.

A visitor's session holds one :class:`Address`. Every script run starts with
:meth:`Address.arrive`, given the query the browser sent and whether it came from the
browser's Back/Forward, and ends with :meth:`Address.query`, the one query the run writes back:

- **A new address** (the first run, a pasted or shared link, a tour or lesson link, Back and
  Forward) describes a whole view: every shared control takes its value from the URL, or its
  default when the URL does not name it, and each page control of the page opened does the same
  when it is drawn. A value the app does not offer gets one line saying what was used
  (:func:`hessviz.app.state.settle_shared`), plain text that the page draws through
  :func:`hessviz.app.state.plain`.
- **The same address** (a control moved, which sends back the query the last run wrote) keeps
  what the session holds. So does a link to another page without a query: the shared controls
  carry over to the next page, and each page's own controls are remembered for when the visitor
  comes back. The app's own navigation links carry the shared query and the target page's own
  controls (:meth:`Address.nav_query`), so that a copied page link keeps the view, the run that
  opens a page has nothing to write, and Back and Forward step over whole views the visitor saw.

Streamlit's own binding of widgets to the URL (``bind="query-params"``) is not used: it ties each
key to the page that drew its widget, and drops it on the way to another page.

Lesson flags ride along with the shared controls: ``hide=norm,L`` (URL keys, or ``sidebar``)
removes those controls, ``present=1`` is the presentation mode (:class:`Lesson`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode

from hessviz.app import state

EMBED_KEYS = ("embed", "embed_options")
"""Streamlit's own keys: never read as a setting, never written by the app."""

SIDEBAR = "sidebar"
"""``hide=sidebar`` removes the whole sidebar (the navigation moves to the top)."""

Query = dict[str, list[str]]
"""A parsed query: key -> every value given, in order (``?terms=a&terms=b``)."""


def parse_query(text: str) -> Query:
    """``"norm=pre&L=6"`` -> ``{"norm": ["pre"], "L": ["6"]}``, without Streamlit's embed keys.

    >>> parse_query("norm=pre&terms=full&terms=outer&embed=true")
    {'norm': ['pre'], 'terms': ['full', 'outer']}
    """
    parsed = parse_qs(text or "", keep_blank_values=True)
    return {k: v for k, v in parsed.items() if k.lower() not in EMBED_KEYS}


def encode_query(query: Query) -> str:
    """The inverse of :func:`parse_query` (repeated keys for lists)."""
    return urlencode(query, doseq=True)


def link_params(query: Query) -> dict[str, str | list[str]]:
    """``query`` as ``st.page_link``'s ``query_params`` (one value as itself, several as a list).

    >>> link_params({"norm": ["pre"], "terms": ["full", "outer"]})
    {'norm': 'pre', 'terms': ['full', 'outer']}
    """
    return {k: v if len(v) > 1 else v[0] for k, v in query.items()}


@dataclass(frozen=True)
class Lesson:
    """What a lesson link fixes: the controls it hides, and the presentation mode.

    ``hide`` holds URL keys (shared ``norm``, ``L``, … or a page's ``sc_axis``) or ``sidebar``;
    a hidden control is not drawn, and its value is the link's (or the default), shown in the
    page's header. ``present`` folds the explanations, collapses the sidebar, enlarges the type
    and puts the chart first.

    >>> lesson, notes = Lesson.from_query({"hide": ["norm, L"], "present": ["1"]})
    >>> sorted(lesson.hide), lesson.present, notes
    (['L', 'norm'], True, [])
    >>> Lesson.from_query({"hide": ["norm,bogus"]})[1]
    ['hide names bogus, which no control has: ignored it.']
    """

    hide: frozenset[str] = frozenset()
    present: bool = False

    @classmethod
    def from_query(cls, query: Query, page_keys: frozenset[str] = frozenset()) -> tuple[Lesson, list[str]]:
        """The lesson flags of ``query``, and a note for each word it does not know. ``page_keys``
        are the keys a page may use besides the shared ones (any key of the form ``xx_yy`` is
        accepted as a page key, since pages declare theirs only when they draw them)."""
        notes: list[str] = []
        words = [w.strip() for text in query.get("hide", []) for w in text.split(",") if w.strip()]
        known = [w for w in words if w == SIDEBAR or w in state.APP_SETTINGS or w in page_keys or "_" in w]
        unknown = [w for w in words if w not in known]
        if unknown:
            notes.append(f"hide names {state.shown(', '.join(unknown))}, which no control has: ignored it.")
        present = False
        texts = query.get("present", [])
        if texts:
            word = texts[-1].strip().lower()
            if word in ("1", "true", "yes", "on"):
                present = True
            elif word not in ("0", "false", "no", "off"):
                notes.append(f"present={state.shown(texts[-1])} is not 1 or 0: used present = 0.")
        return cls(frozenset(known), present), notes

    def query(self) -> Query:
        """The flags as URL keys (nothing when there are none)."""
        out: Query = {}
        if self.hide:
            out["hide"] = [",".join(sorted(self.hide, key=_hide_order))]
        if self.present:
            out["present"] = ["1"]
        return out

    def hides(self, key: str) -> bool:
        return key in self.hide

    @property
    def sidebar(self) -> bool:
        """Whether the sidebar is shown at all."""
        return SIDEBAR not in self.hide


def _hide_order(key: str) -> tuple[int, str]:
    """Shared keys in the sidebar's order, then page keys, then ``sidebar``."""
    order = list(state.APP_SETTINGS)
    if key in order:
        return (0, f"{order.index(key):03d}")
    return (2, key) if key == SIDEBAR else (1, key)


LESSON_KEYS = ("hide", "present")


@dataclass
class Address:
    """One visitor's view: the shared values, each page's own values and the lesson flags.

    ``shared`` holds every shared URL key (:data:`hessviz.app.state.APP_SETTINGS`) -> value;
    ``pages`` each page's page keys -> value, as the page's controls last settled them;
    ``pending`` the raw texts of page keys from a new address, settled by the page's controls
    when they are drawn (only they know their options); ``fresh`` whether this run arrived at a
    new address (controls then start from the address, not from what their widgets held).
    """

    shared: dict[str, object] = field(default_factory=lambda: dict(state.DEFAULTS))
    lesson: Lesson = field(default_factory=Lesson)
    pages: dict[str, dict[str, object]] = field(default_factory=dict)
    page_defaults: dict[str, dict[str, object]] = field(default_factory=dict)
    pending: Query = field(default_factory=dict)
    page: str | None = None
    written: Query | None = None
    fresh: bool = True
    moved: bool = False
    notes: list[str] = field(default_factory=list)

    def arrive(self, query: Query, *, history: bool = False) -> None:
        """Start a run whose browser sent ``query``; :meth:`open` then names the page.

        ``history``: the run comes from the browser's Back or Forward. Notes for values the app
        does not offer are in :attr:`notes` afterwards.
        """
        self.notes = []
        carried = not query and not history and self.written is not None  # a bare link to a page
        self.fresh = self.written is None or history or (query != self.written and not carried)
        if not self.fresh:
            return
        for key in state.APP_SETTINGS:
            value, note = state.settle_shared(key, query.get(key, []))
            self.shared[key] = value
            if note is not None:
                self.notes.append(note)
        self.lesson, notes = Lesson.from_query(query)
        self.notes += notes
        self.pending = {
            k: v for k, v in query.items() if k not in state.APP_SETTINGS and k not in LESSON_KEYS
        }

    def open(self, page: str) -> None:
        """The run shows ``page`` (its URL path): a new address starts its controls afresh."""
        self.moved = page != self.page
        self.page = page
        if self.moved and not self.fresh:
            self.pending = {}
        if self.fresh:
            self.pages[page] = {}

    def page_value(self, key: str, default: object, settle) -> object:
        """The value of the current page's control ``key``: from a new address (``settle(texts)``
        gives ``(value, note)``), else what the visitor last chose on this page, else ``default``."""
        assert self.page is not None, "arrive() first"
        values = self.pages.setdefault(self.page, {})
        self.page_defaults.setdefault(self.page, {})[key] = default
        texts = self.pending.pop(key, None)
        if texts is not None:
            value, note = settle(texts)
            if note is not None:
                self.notes.append(note)
            values[key] = value
        return values.get(key, default)

    def choose(self, key: str, value: object) -> None:
        """Record what the visitor chose: a shared key, or a key of the current page."""
        if key in state.APP_SETTINGS:
            self.shared[key] = value
        else:
            self.pages.setdefault(self.page, {})[key] = value

    def page_query(self, page: str | None = None) -> Query:
        """The controls of ``page`` (default: the current page) that differ from their defaults, as URL
        keys, and, for the current page, the keys of the address that no control has read yet (a
        control drawn only in some views)."""
        page = self.page if page is None else page
        values = self.pages.get(page, {})
        defaults = self.page_defaults.get(page, {})
        out: Query = dict(self.pending) if page == self.page else {}
        for key, value in values.items():
            if key in defaults and value == defaults[key]:
                continue
            if isinstance(value, (list, tuple)):
                if value:  # none picked has no URL form (an absent key is the default)
                    out[key] = [str(v) for v in value]
            else:
                out[key] = [state.format_value(key, value)]
        return out

    def shared_query(self, shared: dict[str, object] | None = None) -> Query:
        """The shared controls (or ``shared`` values) that differ from their defaults, as URL keys."""
        values = self.shared if shared is None else shared
        return {k: [state.format_value(k, v)] for k, v in values.items() if state.DEFAULTS.get(k) != v}

    def query(self, lesson: Lesson | None = None, shared: dict[str, object] | None = None) -> Query:
        """The whole view as a query: shared keys, the page's keys, the lesson flags (with other
        ``shared`` values: a link to this page in another block, e.g. a preset's)."""
        return {**self.shared_query(shared), **self.page_query(), **(lesson or self.lesson).query()}

    def nav_query(self, page: str | None = None) -> Query:
        """What a link to ``page`` carries: the shared controls, that page's own controls as the
        visitor last left them there, and the lesson flags: the whole view the link opens.

        So the run that opens it writes nothing more. A write there raced the browser: Streamlit
        applies a query written during a page change to the entry of the page being left, before
        it pushes the new page's entry, so Back went to a view never seen (the page left, with the
        keys of the page opened). Without ``page`` only the shared controls and the flags.
        """
        return {**self.shared_query(), **(self.page_query(page) if page else {}), **self.lesson.query()}

    def write(self) -> Query:
        """The query this run leaves in the address bar (remembered, so that the next run can tell
        a control moved or a page click, which send it back, from a new address)."""
        self.written = self.query()
        return self.written
