"""Two tiers: ``python -m pytest`` runs everything; ``python -m pytest -m "not slow"`` is the fast tier.

``slow`` marks the browser and load tests (every ``browser`` test is also ``slow``) and the long
autograd references: beyond the first few cases of each long case list (:func:`tests.cases.tiered`).
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.slow)


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
