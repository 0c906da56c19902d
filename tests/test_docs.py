"""The examples in docstrings run."""

from __future__ import annotations

import doctest

import hessviz


def test_package_docstring_example():
    result = doctest.testmod(hessviz, verbose=False)
    assert result.attempted > 0 and result.failed == 0
