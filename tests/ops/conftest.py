"""Every op test runs in float64 (the fixtures themselves are in ``tests/conftest.py``)."""

import pytest


@pytest.fixture(autouse=True)
def _float64(float64):
    return float64
