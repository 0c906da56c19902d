"""A visitor's text is drawn as text (issue 43): hostile text through every free-text and every
list-valued key, under ``streamlit.testing.v1.AppTest``.

A shared link could carry a phishing page: a hidden text box (``hide=rm_text&rm_text=…``) drew up to
400 characters of the link as Markdown in its caption, with a clickable "Log in here" and an image
from another host; notes for ``hide=<word>``, a repeated key and a bad ``spec_terms`` value did the
same. Every such string now goes through :func:`hessviz.app.state.plain`.

What is checked, on the tree of elements each run draws (every string of every element, help texts
and labels included, but the literal ones: code blocks, a text box's own value, the figures):

- no fragment of the payload stands where Markdown would read it as syntax (``evil.example``,
  ``<b>``, ``**bold**``, ``:red[``, ``$x^2$``…, outside a backslash escape), nor, once parsed, where
  Streamlit's renderer rewrites the text (a bare ``https://evil…``, ``www.evil…``, ``@evil…`` that
  GFM links, a ``:streamlit:`` shortcode);
- the payload is there, read back literally (:func:`tests.test_app_pages.drawn`), where the page
  repeats it: the caption of a hidden text box, the one-line notes;
- no element allows HTML.

The keys come from the registry of controls: the shared keys (:data:`hessviz.app.state.SHARED_KEYS`:
one sent twice and the seed bad in the fast tier, each sent twice in the slow one), the lesson keys
(``hide``, ``present``) and each page's own controls, read from
:class:`hessviz.app.address.Address` after a first run at the default view (the text boxes and the
multi-selections among them). The fast tier covers the pages that hold a text box or a list; every
page runs in the slow tier. The browser test renders notes and a hidden text box in Chromium.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from hessviz.app import address, registry, state  # noqa: E402
from hessviz.app.registry import PAGES  # noqa: E402
from tests.test_app_pages import APP, SMALL, drawn  # noqa: E402

LINK = "[Log in here](https://evil.example/x)"
IMAGE = "![i](https://evil.example/i.png)"
HTML = "<img src=x onerror=alert(1)><b>b</b>"
MARKS = "**bold** :red[red] $x^2$ :streamlit:"
BARE = "www.evil.example a@evil.example"
FRAGMENTS = (LINK, IMAGE, HTML, MARKS, BARE)
"""Each shorter than the 40 characters a note repeats (:data:`hessviz.app.state.SHOWN_CHARS`)."""
PAYLOAD = " ".join(FRAGMENTS) + "\n# heading\n- item"
"""What a text box is sent: every fragment, and lines that would start blocks."""

RAW = (
    "evil.example",
    "onerror=",
    "<b>",
    "<img",
    "**bold**",
    ":red[",
    "$x^2$",
    ":streamlit:",
    "](https://evil",
)
"""Fragments of the payload as Markdown reads them: none may stand in an element's source."""
REWRITTEN = re.compile(r"(?i)(https?://|www\.)evil|@evil|:streamlit:|:red\[")
"""What Streamlit's renderer rewrites in the text it has parsed (GFM's bare links, shortcodes), in
the payload: none may stand in the parsed text (escapes resolved, word joiners kept)."""
ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
"""A backslash escape (CommonMark: any ASCII punctuation)."""
LITERAL = {"code", "plotly_chart", "text", "json"}
"""Elements drawn as their characters (not Markdown): not scanned."""
VALUE_FIELDS = {"value", "default", "raw_value", "query_string", "id", "form_id", "page", "page_script_hash"}
"""Fields of a widget that hold its value or an address, drawn literally."""


# ----------------------------------------------------------------------------- reading what is drawn


def _strings(message) -> Iterator[tuple[str, str]]:
    """Every ``(field, string)`` of a protobuf message, nested ones and repeated ones included."""
    for field, value in message.ListFields():
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        for v in value if repeated else [value]:
            if isinstance(v, str):
                yield field.name, v
            elif hasattr(v, "ListFields"):
                yield from _strings(v)


def _nodes(node) -> Iterator:
    kids = getattr(node, "children", None)
    if kids:
        for child in kids.values():
            yield from _nodes(child)
    elif getattr(node, "proto", None) is not None:
        yield node


def markdown_sources(at: AppTest) -> list[tuple[str, str, str]]:
    """``(element type, field, text)`` of every string an element may draw as Markdown."""
    out = []
    for node in _nodes(at._tree):
        if node.type in LITERAL:
            continue
        out += [(node.type, f, s) for f, s in _strings(node.proto) if f not in VALUE_FIELDS]
    return out


OWN_LINK = re.compile(r"\]\(\?[A-Za-z0-9%+&=._~-]*\)")
"""The target of a link the app makes to one of its own views (the projector hint's ``?…&present=1``):
the view's query, percent-encoded, so no text in it can close the link or open another."""


def unescaped(markdown: str) -> str:
    """``markdown`` with each backslash escape blanked, and the encoded query of a link to the app's
    own view dropped: what is left is what Markdown may read as syntax (``\\<img`` holds no ``<img``)."""
    return OWN_LINK.sub("](?)", ESCAPE.sub("\0", markdown))


def allows_html(at: AppTest) -> list[str]:
    """The elements that draw raw HTML (``unsafe_allow_html``, an ``st.html`` other than the app's
    style rules)."""
    return [
        node.type
        for node in _nodes(at._tree)
        if (node.type == "html" and not node.proto.body.startswith("<style>"))
        or any(f.name == "allow_html" and v for f, v in node.proto.ListFields())
    ]


def assert_drawn_as_text(at: AppTest, *echoed: str) -> None:
    """No element reads a payload fragment as Markdown or HTML, and each of ``echoed`` is drawn,
    character for character, by some element."""
    assert not at.exception, [e.value for e in at.exception]
    sources = markdown_sources(at)
    raw = [(t, f, s) for t, f, s in sources if any(r in unescaped(s) for r in RAW)]
    assert not raw, f"payload drawn as Markdown: {raw}"
    rewritten = [
        (t, f, s) for t, f, s in sources if REWRITTEN.search(OWN_LINK.sub("](?)", ESCAPE.sub(r"\1", s)))
    ]
    assert not rewritten, f"payload rewritten by the renderer: {rewritten}"
    read = [drawn(s) for _, _, s in sources]
    for text in echoed:
        assert any(text in r for r in read), f"{text!r} is not drawn: {read}"
    assert not allows_html(at)


def run(page: str, query: dict[str, str | list[str]]) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page(str(PAGES / f"{page}.py"))
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    return at


@pytest.fixture
def hosted(monkeypatch):
    """The hosted profile's limits: a view over them is refused at once (the notes and captions are
    drawn before), so a page with a text box costs no computation of the text."""
    from hessviz.app import cache, profiles

    lim = profiles.limits_from_env(
        {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"}, baseline_bytes=400 << 20
    )
    monkeypatch.setattr(cache, "LIMITS", lim)
    return lim


# ----------------------------------------------------------------------------- the registry of keys


@functools.cache
def page_controls(page: str) -> tuple[dict[str, object], frozenset[str]]:
    """Each control of ``page`` (URL key -> default) as its first run at the default view declares it,
    and which of them are text boxes."""
    at = run(page, dict(SMALL))
    assert not at.exception, [e.value for e in at.exception]
    defaults = dict(at.session_state["_hv_address"].page_defaults.get(page, {}))
    return defaults, frozenset(t.key for t in at.text_area if t.key in defaults)


def hostile_query(page: str, every_shared: bool = False) -> tuple[dict[str, str | list[str]], list[str]]:
    """A URL that sends a fragment through every key of ``page`` (a bad value for each control, a
    repeated shared key, or with ``every_shared`` each, an unknown ``hide`` word, a bad ``present``);
    and the texts the page must then repeat as they are."""
    query: dict[str, str | list[str]] = dict(SMALL)
    if every_shared:  # each given twice, the last its default (or the small block's size)
        for key in state.SHARED_KEYS:
            query[key] = [LINK, str(SMALL.get(key, state.format_value(key, state.DEFAULTS[key])))]
    query["L"] = [HTML, "4"]  # a repeated key: the last is used, both are repeated
    query["seed"] = IMAGE
    query["hide"] = MARKS  # no comma and no "_": one word no control has
    query["present"] = BARE
    echoed = [HTML, IMAGE, MARKS, BARE]
    defaults, texts = page_controls(page)
    for key, default in defaults.items():
        if key in texts:
            continue  # a text box takes any text: sent on its own, hidden (the tests below)
        # a multi-selection gets a bad value beside an allowed one, any other control a bad value
        query[key] = [LINK, *map(str, default)] if isinstance(default, list) else LINK
        echoed.append(LINK)
    return query, echoed


# ----------------------------------------------------------------------------- the fast tier


def test_plain_is_read_back_by_commonmark_as_the_same_characters():
    """:func:`plain` against a CommonMark parser (markdown-it, as Streamlit's remark reads the same
    rules): no link, image, emphasis, code or HTML, and the text is the payload's own."""
    markdown_it = pytest.importorskip("markdown_it")
    import html

    md = markdown_it.MarkdownIt("commonmark").enable(["strikethrough", "table"])
    tokens = md.parse(state.plain(PAYLOAD))
    kinds = {t.type for t in tokens} | {c.type for t in tokens for c in t.children or []}
    assert kinds <= {"paragraph_open", "inline", "paragraph_close", "text"}, kinds
    rendered = md.render(state.plain(PAYLOAD)).removeprefix("<p>").removesuffix("</p>\n")
    assert html.unescape(rendered).replace("\u2060", "") == PAYLOAD.replace("\n", " ")


def test_no_page_asks_streamlit_for_raw_html():
    """``unsafe_allow_html`` nowhere; ``st.html`` three times: the style rules, which read only the
    lesson's two flags (never its words), the running badge's constant style, and the Learn page's
    constant script that scrolls the live view into place on a phone (no value of the visitor's in them)."""
    from hessviz.app import styles

    sources = {p.name: p.read_text() for p in Path(state.__file__).parent.rglob("*.py")}
    assert not [n for n, s in sources.items() if "unsafe_allow_html" in s]
    assert sorted(n for n, s in sources.items() if "st.html(" in s) == ["learn.py", "running.py", "styles.py"]
    assert 'st.html(f"<style>{RUNNING}</style>")' in sources["running.py"]  # a constant style rule
    learn = sources["learn.py"]
    assert learn.count("st.html(") == 1 and "st.html(SHOW_LIVE," in learn
    assigned = [
        n.value
        for n in ast.walk(ast.parse(learn))
        if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["SHOW_LIVE"]
    ]
    assert len(assigned) == 1 and isinstance(assigned[0], ast.Constant)  # a literal: nothing interpolated
    hostile = address.Lesson(frozenset({HTML, MARKS, address.SIDEBAR}), present=True)
    assert styles.css(hostile) == styles.css(address.Lesson(frozenset({address.SIDEBAR}), present=True))


def test_a_hidden_text_box_draws_the_links_text_as_text(hosted):
    """The reproduction of issue 43: ``hide=rm_text&rm_text=…`` drew the link's text as Markdown."""
    at = run("real_model", {"rm_model": "pydoc-postln", "hide": "rm_text", "rm_text": PAYLOAD})
    assert_drawn_as_text(at, PAYLOAD.replace("\n", " "))
    assert not at.text_area, "the box is hidden"
    fixed = [c.value for c in at.caption if "fixed by this lesson link" in c.value]
    assert fixed == [f"Text: **{state.plain(PAYLOAD)}** (fixed by this lesson link)"]


def test_the_other_sentence_hidden_is_drawn_as_text(hosted):
    query = {"rm_model": "pydoc-postln", "rm_loss": "sentence similarity", "hide": "rm_other"}
    at = run("real_model", {**query, "rm_other": PAYLOAD})
    assert_drawn_as_text(at, PAYLOAD.replace("\n", " "))


def test_the_whole_models_text_hidden_is_drawn_as_text(hosted):
    at = run("whole_model", {"wm_model": "pydoc-llama", "hide": "wm_text", "wm_text": PAYLOAD})
    assert_drawn_as_text(at, PAYLOAD.replace("\n", " "))


def test_a_text_box_in_view_keeps_the_text_and_draws_no_markdown(hosted):
    at = run("real_model", {"rm_model": "pydoc-postln", "rm_text": PAYLOAD})
    assert_drawn_as_text(at)
    assert at.text_area(key="rm_text").value == PAYLOAD


@pytest.mark.parametrize("page", ["hessian_map", "spectrum"])
def test_every_key_of_a_page_with_a_list_draws_its_notes_as_text(page):
    """Shared keys, lesson keys and each page control at once; on the Spectrum page ``spec_terms``,
    a list, gets a bad value beside an allowed one."""
    query, echoed = hostile_query(page)
    if page == "spectrum":
        assert isinstance(page_controls(page)[0]["spec_terms"], list)
    at = run(page, query)
    assert_drawn_as_text(at, *echoed)
    notes = [w.value for w in at.warning if "was given 2 times" in drawn(w.value)]
    assert notes and all(state.plain(drawn(n)) == n for n in notes[0].split("  \n"))


def test_a_folder_typed_is_drawn_as_text():
    """The local profile's checkpoint folder box: its text comes back in the line about the folder."""
    at = run("real_model", {"rm_model": "a local folder…"})
    folder = "/no/" + LINK
    at.text_input(key="rm_folder").set_value(folder).run()
    assert_drawn_as_text(at, state.shown(folder))  # cut to 40 characters, as every refused value


# ----------------------------------------------------------------------------- every page, every key


@pytest.mark.slow
@pytest.mark.parametrize("page", [p.url_path for p in registry.ALL_PAGES])
def test_every_key_of_every_page_draws_its_notes_as_text(page):
    query, echoed = hostile_query(page, every_shared=True)
    at = run(page, query)
    assert_drawn_as_text(at, *echoed)


@pytest.mark.slow
@pytest.mark.parametrize(
    "page, key",
    [
        ("real_model", "rm_text"),
        ("real_model", "rm_other"),
        ("whole_model", "wm_text"),
    ],
)
@pytest.mark.parametrize("fragment", FRAGMENTS)
def test_every_text_box_hidden_draws_each_fragment_as_text(page, key, fragment, hosted):
    query = {"rm_model": "pydoc-postln", "wm_model": "pydoc-llama", "rm_loss": "sentence similarity"}
    at = run(page, {**query, "hide": f"{key},{address.SIDEBAR}", key: fragment})
    assert_drawn_as_text(at, fragment)


# ----------------------------------------------------------------------------- what Chromium shows

MARKUP = """() => {
  const text = '[data-testid="stAlert"], [data-testid="stCaptionContainer"]';
  const links = 'a[href*="evil"]:not([data-testid="stPageLink-NavLink"]), a[href^="mailto:"], '
    + 'img[src*="evil"]';
  const inText = 'img, a, code, .katex, .stMarkdownColoredText, h1, h2, h3, ul, ol, li';
  // the projector hint: a link to this very view on this server with present=1 (its query an encoded
  // copy of the view's, the visitor's text included, which no browser reads as markup)
  const own = (e) => e.tagName === 'A' && e.origin === location.origin
    && new URL(e.href).searchParams.get('present') === '1'
    && e.textContent === 'this view in presentation mode';
  const made = [
    ...document.querySelectorAll(links),
    ...[...document.querySelectorAll(text)].flatMap((t) => [...t.querySelectorAll(inText)]),
    ...[...document.querySelectorAll('strong, b')].filter((e) => ['bold', 'b'].includes(e.textContent)),
  ].filter((e) => !own(e));
  return made.map((e) => e.outerHTML);
}"""
"""What the payload read as Markdown would make: a link or an image to the other host, a mail link,
inside an alert or a caption any image (the ``:streamlit:`` logo), link, code, math, coloured text,
heading or list, and anywhere the emphasis that ``**bold**`` or ``<b>b</b>`` asks for."""


@pytest.mark.browser
def test_chromium_shows_the_hostile_text_as_text():
    """The notes of a hostile link and a hidden text box, as Streamlit's own Markdown renderer draws
    them: the characters are all there and none of them became markup."""
    from urllib.parse import urlencode

    from tests.streamlit_server import chromium, require_chromium, running_server

    require_chromium()
    notes_query, _ = hostile_query("hessian_map")
    urls = {
        "hessian_map": urlencode(notes_query, doseq=True),
        "real_model": urlencode({"rm_model": "pydoc-postln", "hide": "rm_text", "rm_text": PAYLOAD}),
    }
    idle = (
        "() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
        " return a && a.getAttribute('data-test-script-state') === 'notRunning'; }"
    )
    env = {"HESSVIZ_PROFILE": "hosted"}  # a view over the budget is refused at once
    with running_server("streamlit_hostile_text.log", env) as srv, chromium() as browser:
        for page_name, query in urls.items():
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{srv.base}/{page_name}?{query}")
            page.wait_for_selector("h1", timeout=120_000)
            page.wait_for_function(idle, timeout=120_000)
            text = page.inner_text('[data-testid="stMain"]').replace("\u2060", "")
            expected = [*FRAGMENTS] if page_name == "hessian_map" else [PAYLOAD.replace("\n", " ")]
            missing = [f for f in expected if f not in text]
            assert not missing, f"{page_name}: not shown as text: {missing}\n{text[:3000]}"
            marked = page.evaluate(MARKUP)
            assert not marked, f"{page_name}: {marked}"
            page.close()
