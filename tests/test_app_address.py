"""The address bar's rules (issue 16): one view per URL, kept across pages, Back steps over views."""

from __future__ import annotations

from hessviz.app import state
from hessviz.app.address import Address, Lesson, parse_query
from hessviz.app.tour import TOUR


def visit(addr: Address, page: str, query: str, *, history: bool = False) -> dict:
    """One run: arrive, open the page, (the page's controls would draw here), write."""
    addr.arrive(parse_query(query), history=history)
    addr.open(page)
    return addr.write()


def test_a_shared_link_survives_a_click_on_another_page():
    addr = Address()
    written = visit(addr, "hessian_map", "norm=pre&L=6")
    assert addr.shared["norm"] == "pre" and addr.shared["L"] == 6
    visit(addr, "spectrum", "")  # a bare page link: the view carries over
    assert addr.shared["norm"] == "pre" and addr.shared["L"] == 6
    visit(addr, "spectrum", "norm=pre&L=6")  # the app's own links carry the shared query
    assert not addr.fresh and addr.shared["L"] == 6  # the same view: nothing to re-read
    visit(addr, "hessian_map", "norm=pre&L=6", history=True)  # Back: the view of that entry
    assert addr.write() == written


def test_a_new_address_names_a_whole_view_and_a_moved_control_is_kept():
    addr = Address()
    visit(addr, "spectrum", "norm=pre&L=6&seed=3")
    addr.choose("norm", "attention")  # the visitor moves a control
    written = addr.write()
    addr.arrive(written)  # the rerun sends back what was written
    assert not addr.fresh and addr.shared["norm"] == "attention"
    visit(addr, "scaling", "norm=attention&sc_axis=xnorm")  # a tour link: unnamed keys -> defaults
    assert addr.shared["L"] == state.DEFAULTS["L"] and addr.shared["seed"] == state.DEFAULTS["seed"]
    assert addr.shared["norm"] == "attention"


def test_page_keys_are_settled_by_their_control_and_remembered_per_page():
    addr = Address()
    addr.arrive(parse_query("sc_axis=L&sc_seeds=99"))
    addr.open("scaling")
    settle = lambda texts: state.settle("sc_seeds", texts, 3, int_range=(1, 8))  # noqa: E731
    assert addr.page_value("sc_seeds", 3, settle) == 8
    assert addr.notes == ["sc_seeds=99 is out of range 1 … 8: used sc_seeds = 8."]
    assert addr.write() == {"sc_axis": ["L"], "sc_seeds": ["8"]}  # sc_axis kept until its control reads it
    visit(addr, "spectrum", "")
    assert "sc_seeds" not in addr.write()  # another page: its own keys only
    visit(addr, "scaling", "")  # back on the page: remembered
    assert addr.page_value("sc_seeds", 3, settle) == 8


def test_values_the_app_does_not_offer_get_one_line_each():
    addr = Address()
    visit(addr, "spectrum", "wo=1&seed=-5&L=abc&norm=<b>x</b>&hide=norm,nothing")
    notes = " ".join(addr.notes)
    assert "wo=1 read as wo = true." in notes
    assert "seed=-5 is out of range 0 … 9999: used seed = 0." in notes
    assert "L=abc is not an integer" in notes and "norm=<b>x</b> is not one of" in notes  # plain text
    assert "nothing" in notes and addr.lesson.hide == frozenset({"norm"})
    assert addr.shared["wo"] is True and addr.shared["seed"] == 0


def test_lesson_flags_ride_with_the_view_across_pages():
    addr = Address()
    visit(addr, "scaling", "norm=attention&hide=norm,L&present=1")
    assert addr.lesson == Lesson(frozenset({"norm", "L"}), True)
    assert addr.nav_query() == {"norm": ["attention"], "hide": ["L,norm"], "present": ["1"]}
    visit(addr, "spectrum", "")
    assert addr.lesson.present and addr.lesson.hides("norm") and addr.write()["hide"] == ["L,norm"]
    assert not Lesson.from_query({"hide": ["sidebar"]})[0].sidebar


def test_every_tour_stop_opens_exactly_the_view_it_names():
    for stop in TOUR:
        addr = Address()
        visit(addr, "learn", "tour=2")
        visit(addr, stop.page, stop.link().split("?", 1)[1])
        for key, text in stop.params.items():
            if key in state.APP_SETTINGS:
                assert state.format_value(key, addr.shared[key]) == text, (stop.title, key)
            else:
                assert addr.pending[key] == [text]  # the page's control settles it when drawn


def test_a_page_link_carries_the_view_that_page_will_write():
    """The link to a page carries that page's own controls as the visitor left them, so the run that
    opens it writes the same query: no write during a page change, whose race with the browser put
    the map's ``term`` on the Spectrum page's history entry (issue 33)."""
    addr = Address()
    visit(addr, "hessian_map", "L=6&term=outer")
    addr.page_value("term", "full", lambda texts: (texts[-1], None))  # the map's Term control draws
    written = addr.write()
    assert written == {"L": ["6"], "term": ["outer"]}
    link = addr.nav_query("spectrum")
    assert link == {"L": ["6"]}  # Spectrum: the shared view only
    assert visit(addr, "spectrum", "L=6") == link  # and the run there writes exactly it
    back = addr.nav_query("hessian_map")
    assert back == written  # the map: with the term it had
    visit(addr, "hessian_map", "L=6&term=outer")
    assert addr.page_value("term", "full", lambda texts: (texts[-1], None)) == "outer"
    assert addr.write() == back


def test_a_peri_link_round_trips_across_pages_and_into_a_view():
    """``norm=peri`` (MODEL.md part 5) is a value the app offers: a link to it opens Peri-LN with
    RMSNorm, keeps it across pages and Back, writes it back unchanged, and the view built from it is
    the library's Peri-LN block; a misspelt placement gets the app's line, not a view."""
    addr = Address()
    written = visit(addr, "scaling", "norm=peri&ntype=rmsnorm&L=6")
    assert addr.shared["norm"] == "peri" and written["norm"] == ["peri"] and not addr.notes
    visit(addr, "depth", "")
    assert addr.shared["norm"] == "peri" and addr.nav_query("optimization")["norm"] == ["peri"]
    visit(addr, "scaling", "norm=peri&ntype=rmsnorm&L=6", history=True)
    assert addr.write() == written
    view = state.View.from_values(addr.shared)
    assert view.cfg.norm == "peri" and view.cfg.norm_type == "rmsnorm" and view.cfg.seq_len == 6
    assert view.cfg.describe().startswith("Peri-LN block") and view.values["norm"] == "peri"
    assert "peri" in state.APP_SETTINGS["norm"].choices
    assert state.format_value("norm", "peri") == "peri"
    bad = Address()
    visit(bad, "scaling", "norm=perii")
    assert any("norm=perii is not one of" in n and "peri" in n for n in bad.notes)
