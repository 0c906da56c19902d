"""Two tiers: ``python -m pytest`` runs everything; ``python -m pytest -m "not slow"`` is the fast tier.

``slow`` marks the browser and load tests (every ``browser`` test is also ``slow``) and the long
autograd references: beyond the first few cases of each long case list (:func:`tests.cases.tiered`).
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.slow)
