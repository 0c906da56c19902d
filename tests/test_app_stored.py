"""The app's store wrapper, written once (:func:`hessviz.app.cache.stored`): the key it makes from a
call, the reservation, estimate and label it hands the store, a precomputed value found first, and a
field of the stored dict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hessviz.app import cache, gates
from hessviz.checks.cost import Cost


@pytest.fixture
def store(monkeypatch):
    fresh = cache.Store(gates.Ledger(2**30))
    asked = []
    get = fresh.get

    def spy(key, compute, reserve, what, seconds=math.inf):
        asked.append((key, reserve, what, seconds))
        return get(key, compute, reserve, what, seconds)

    monkeypatch.setattr(fresh, "get", spy)
    monkeypatch.setattr(cache, "STORE", fresh)
    return fresh, asked


def test_the_key_is_the_name_and_the_arguments_with_defaults_and_their_types(store):
    fresh, asked = store
    calls = []

    @cache.stored(lambda n, x, kind: Cost(0.5 * n, 64 * n, "w"), "the {kind} thing of {n}")
    def thing(n: int, x: float, kind: str = "plain") -> dict:
        calls.append((type(n), type(x)))
        return {"v": np.arange(n) * x}

    first = thing(np.int64(3), 2)
    again = thing(3, x=2.0)  # the same call: one computation
    assert calls == [(int, float)] and again is first and not first["v"].flags.writeable
    assert asked[0] == (("thing", 3, 2.0, "plain"), 192, "the plain thing of 3", 1.5)
    assert ("thing", 3, 2.0, "plain") in fresh and thing.key_of(3, 2) == ("thing", 3, 2.0, "plain")


def test_bytes_alone_is_no_estimate_and_a_key_function_and_prefix_name_the_result(store):
    fresh, asked = store

    @cache.stored(1 << 10, "x", kind="other", key=lambda a, b: ("mine", b, a), prefix=("p",))
    def f(a: int, b: str) -> list:
        return [a, b]

    assert f(1, "z") == [1, "z"]
    assert asked == [(("p", "mine", "z", 1), 1 << 10, "x", math.inf)]
    assert f.key_of(1, "z") == ("mine", "z", 1)


def test_a_value_found_first_is_not_computed_and_a_field_is_returned(store):
    fresh, asked = store
    found = {("g", 1): {"A": "precomputed"}}

    @cache.stored(8, "g", first=lambda key, i: found.get(key), field="A")
    def g(i: int) -> dict:
        return {"A": f"computed {i}"}

    assert g(1) == "precomputed" and asked == []
    assert g(2) == "computed 2" and [k for k, *_ in asked] == [("g", 2)]
