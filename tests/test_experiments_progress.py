"""The long studies of :mod:`hessviz.experiments` take ``progress=`` (issue 17), the convention of
:mod:`hessviz.matfree`: ``progress(done, total, message)`` after each unit of work; an exception
raised by the callback cancels the study. The app's caches pass their status's ``step``."""

import numpy as np
import pytest

from hessviz.experiments import bounds, ln_collapse

# ----------------------------------------------------------------------------- progress callbacks


class _Stop(Exception):
    pass


def _studies():
    """Each long study with a small argument list, as ``(name, run(progress), units of work)``."""
    from hessviz.experiments import optimizers

    grids = {"SGD": (0.1,), "SignSGD": (), "Adam": ()}
    return [
        ("attention_bound_study", lambda p: bounds.attention_bound_study(3, 0, progress=p), 3),
        ("ln_sweep", lambda p: ln_collapse.ln_sweep([1.0, 0.1], m=2, n=4, seeds=(0, 1), progress=p), 2),
        (
            "block_sweep",
            lambda p: ln_collapse.block_sweep(
                [1.0, 0.1], seeds=(0,), seq_len=3, d_model=4, d_k=2, d_ff=4, whole=False, progress=p
            ),
            2,
        ),
        (
            "optimizer_study",
            lambda p: optimizers.optimizer_study(
                (0, 1), 2, grids, ("post", "pre"), seq_len=3, d_model=4, d_k=2, d_ff=4, progress=p
            ),
            4,
        ),
    ]


@pytest.mark.parametrize("name,run,units", _studies(), ids=[s[0] for s in _studies()])
def test_a_study_reports_progress_and_stops_when_the_callback_raises(name, run, units):
    """The convention of ``hessviz.matfree``: ``progress(done, total, message)`` after each unit of
    work, and an exception raised by the callback cancels the study (the app's visitor left)."""
    calls = []
    out = run(lambda done, total, message: calls.append((done, total, message)))
    assert [(d, t) for d, t, _ in calls] == [(i, units) for i in range(1, units + 1)]
    assert all(f"{d}/{t}" in m for d, t, m in calls) and out

    def stop(done, total, message):
        raise _Stop(message)

    with pytest.raises(_Stop, match="1/"):
        run(stop)


def test_a_study_is_the_same_with_and_without_progress():
    a = bounds.attention_bound_study(2, 5)
    b = bounds.attention_bound_study(2, 5, progress=lambda *args: None)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
