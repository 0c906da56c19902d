"""Every claim links to a registered page of the app, and the report does not know the app."""

from hessviz.app.claim_links import CLAIM_VIEWS, link
from hessviz.app.registry import ALL_PAGES
from hessviz.experiments import CLAIM_IDS


def test_every_claim_has_a_view_on_a_registered_page():
    assert set(CLAIM_VIEWS) == set(CLAIM_IDS)
    pages = {p.url_path for p in ALL_PAGES}
    for cid, view in CLAIM_VIEWS.items():
        assert view.split("?")[0] in pages, (cid, view)
    assert link("xnorm6") == "./scaling?norm=attention&sc_axis=xnorm&sc_blk=W_Q,W_Q"


def test_the_report_writer_has_no_app_links():
    import inspect

    from hessviz.experiments import report

    source = inspect.getsource(report)
    assert not any(view in source for view in CLAIM_VIEWS.values())
