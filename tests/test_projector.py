"""The header's line about presentation mode (issue 44 item 4), under AppTest: its link is this view
with ``present=1``, kept up to date as the page's own controls move; presentation mode, and a page in
another page's frame, do not show it. Its place on a projector's screen is measured in Chromium
(``tests/test_layout_browser.py``)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("streamlit")

from tests.test_app_pages import run_page  # noqa: E402

SMALL = {"L": "4", "d": "8", "dk": "4", "dff": "8"}


def _hint(at) -> str | None:
    """The address the line links (None when the page does not show the line)."""
    lines = [c.value for c in at.main.get("caption") if c.value.startswith("On a projector:")]
    if not lines:
        return None
    assert len(lines) == 1 and "\n" not in lines[0], lines
    return re.fullmatch(r"On a projector: \[this view in presentation mode\]\((.*)\) puts .*", lines[0])[1]


def test_the_line_links_this_view_in_presentation_mode_as_its_controls_move():
    at = run_page("pages/hessian_map.py", **SMALL)
    link = _hint(at)
    assert parse_qs(urlsplit(link).query) == {**{k: [v] for k, v in SMALL.items()}, "present": ["1"]}
    at.segmented_control(key="term").set_value("functional").run()  # a page control, drawn after the header
    assert parse_qs(urlsplit(_hint(at)).query)["term"] == ["functional"]
    at.slider(key="dk").set_value(2).run()  # a shared control
    assert parse_qs(urlsplit(_hint(at)).query)["dk"] == ["2"]


def test_presentation_mode_does_not_offer_itself():
    at = run_page("pages/hessian_map.py", present="1", **SMALL)
    assert _hint(at) is None and at.get("plotly_chart")


def test_a_page_without_a_block_offers_it_too():
    at = run_page("pages/whole_model.py")
    assert parse_qs(urlsplit(_hint(at)).query)["present"] == ["1"]
