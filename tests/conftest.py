"""Two tiers: ``python -m pytest`` runs everything; ``python -m pytest -m "not slow"`` is the fast tier.

``slow`` marks the browser and load tests (every ``browser`` test is also ``slow``), the long
autograd references: beyond the first few cases of each long case list (:func:`tests.cases.tiered`),
and the tests of tens of seconds each (marked where they stand, with why), so that the fast tier stays
under three minutes on two cores (``docs/development.md``).
"""

from __future__ import annotations

import contextlib

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread for the tests: their tensors are small, so a second thread buys nothing, and on
    a machine whose other core is busy it waits at every parallel region (measured in
    ``docs/development.md``: the fast tier took three times longer with two threads than with one on
    the shared two-core machine). :mod:`hessviz.runtime.tasks` hands this count to process-pool workers."""
    torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def app_server():
    """One ``streamlit run app.py`` on loopback for the browser tests of the checkout's app
    (``test_browser.py``, ``test_browser_tour.py``, ``test_layout_browser.py``), started by the first
    that asks (``test_browser.py`` in a whole run, whose first visit is the cold server's first
    visitor) and stopped at the session's end: each page's default view is computed once for them all."""
    from tests.streamlit_server import require_chromium, running_server

    require_chromium()
    with running_server("streamlit_browser_test.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def app_browser(app_server):
    """One headless Chromium for a module of those tests (each opens its own contexts). Per module,
    not per session: Playwright's sync API runs an event loop while it is open, and a module after
    them that starts its own (``test_install.py``, the lesson tests) or calls ``asyncio.run`` would
    find it running. Starting Chromium takes about a second; the server's computed views are what
    the session shares."""
    from tests.streamlit_server import chromium

    with chromium() as b:
        yield b


RTOL = 1e-12
"""Closed form against autograd in float64: relative Frobenius error (:func:`tests.helpers.assert_close`)."""


@pytest.fixture
def rng() -> torch.Generator:
    """A generator seeded the same in every test: each draws its own data, reproducibly."""
    return torch.Generator().manual_seed(0)


@pytest.fixture
def float64():
    """``torch.float64`` as the default dtype for the test, restored after it."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield torch.float64
    torch.set_default_dtype(before)


@pytest.fixture
def rtol() -> float:
    return RTOL


@pytest.fixture(scope="session")
def _quick_claims() -> dict:
    return {}


@pytest.fixture
def claims_once(_quick_claims):
    """A context in which :func:`hessviz.experiments.report.run_claim` gives each quick claim's result
    computed once per session: ``hessviz reproduce --quick``, the protocols' quick runs and the
    executor's in-process side read the same claims (several minutes of CPU, not several times).
    The real ``run_claim`` computes each; a process pool's workers run their own, unpatched."""
    from hessviz.experiments import report

    real = report.run_claim

    def once(cid: str, quick: bool):
        if (cid, quick) not in _quick_claims:
            _quick_claims[(cid, quick)] = real(cid, quick)
        return _quick_claims[(cid, quick)]

    @contextlib.contextmanager
    def active():
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(report, "run_claim", once)
            yield

    return active
