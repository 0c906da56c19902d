"""``hv.model_hessian(..., group=)`` over two gloo processes on loopback (``MODEL.md`` part 4, "Many
processes") against one process holding the whole batch: the loss, the gradient, products and the
top eigenvalues, for a next-token and a classifier objective, a rank without sequences (also with
``checkpoint=True``: the layers rebuilt per product), and
disagreeing ranks (one clear error on every rank, no hang). The ranks run tests/ranks_worker.py;
everything stops by itself (a 60 s collective timeout, a 120 s join). A rank that dies before its
group is up (gloo cannot start on this machine) skips the module with the ranks' own logs as the
reason; one that dies before both have written their numbers fails with them; one that dies
tearing gloo down after that is a warning, and the numbers are still checked."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
import torch.multiprocessing as mp

import hessviz as hv
from tests import ranks_worker

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # two gloo processes per fixture, each importing torch and hessviz

IDS = torch.tensor([[3, 17, 5, 29, 11, 2], [7, 1, 22, 9, 14, 4], [8, 8, 13, 0, 27, 19]])
SHARE = [slice(0, 1), slice(1, 3)]  # rank 0 one sequence, rank 1 two
TOL = 1e-12


@pytest.fixture(scope="module")
def spread(tmp_path_factory: pytest.TempPathFactory):
    """``(folder, [rank 0's numbers, rank 1's])`` of the two-process run."""
    from tests.test_pretrained import randomise
    from tests.test_whole_hessian import CONFIGS

    root = tmp_path_factory.mktemp("ranks")
    cls, config = CONFIGS["gpt2"]
    model = getattr(transformers, cls)(config())
    randomise(model, seed=10)
    model.save_pretrained(root / "gpt2")
    ctx = mp.start_processes(
        ranks_worker.run,
        nprocs=2,
        join=False,
        start_method="spawn",
        args=(2, f"file://{root}/rendezvous", str(root / "gpt2"), IDS, SHARE, str(root)),
    )
    deadline = time.monotonic() + 120
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the two ranks did not finish within 120 s\n{logs(root)}")
    except mp.ProcessExitedException as died:
        if not all((root / f"rank{r}.started").exists() for r in range(2)):
            pytest.skip(f"gloo could not start two ranks on this machine ({died}):\n{logs(root)}")
        if not all((root / f"rank{r}.pt").exists() for r in range(2)):
            pytest.fail(f"{died}\n{logs(root)}")
        # both ranks wrote every number before one died tearing gloo down: the numbers are checked,
        # and the teardown is said
        warnings.warn(f"a rank died after writing its results ({died}):\n{logs(root)}", stacklevel=1)
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    got = [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r, g in enumerate(got):
        assert "crash" not in g, f"rank {r}:\n{g.get('crash')}"
    return root / "gpt2", got


def logs(root) -> str:
    """What each rank wrote to its standard error (a C++ abort's message lands there)."""
    parts = []
    for r in range(2):
        path = root / f"rank{r}.log"
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        text = text if len(text) <= 4000 else f"{text[:3000]}\n[…]\n{text[-1000:]}"  # the abort's cause first
        parts.append(f"--- rank {r} ---\n{text}")
    return "\n".join(parts)


def close(a, b) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm()) <= TOL * float(b.norm())


@pytest.fixture(scope="module")
def whole(spread) -> dict[str, dict[str, object]]:
    """The same numbers from one process holding the whole batch (the worker's own code), on one
    thread as the ranks run (tiny products on two threads of a loaded machine wait on each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return reference(spread[0])
    finally:
        torch.set_num_threads(threads)


def reference(folder) -> dict[str, dict[str, object]]:
    gen = torch.Generator().manual_seed(0)
    model = hv.load_model(folder)
    wrt = ("l1.W_2", "l0.W_Q[1]", "l1.ln2_gamma")
    res = hv.model_hessian(model, IDS, "next_token", wrt)
    out = {
        "next_token": ranks_worker.numbers(res, torch.randn(res.size, 2, generator=gen, dtype=torch.float64))
    }
    W, b, labels = ranks_worker.classifier(model.cfg.d_model)
    res = hv.model_hessian(model, IDS, hv.Classifier(W, b, labels, "last"), ("l0.W_V", "head.W", "head.b"))
    out["classifier"] = ranks_worker.numbers(
        res, torch.randn(res.size, 2, generator=gen, dtype=torch.float64)
    )
    res = hv.model_hessian(model, IDS, "next_token", wrt)
    out["empty"] = ranks_worker.numbers(res, torch.randn(res.size, 2, generator=gen, dtype=torch.float64))
    out["checkpointed"] = ranks_worker.numbers(
        res, torch.randn(res.size, 2, generator=gen, dtype=torch.float64)
    )
    return out


@pytest.mark.parametrize("case", ["next_token", "classifier", "empty", "checkpointed"])
def test_two_ranks_give_the_whole_batchs_numbers_on_every_rank(spread, whole, case):
    _, got = spread
    want = whole[case]
    for rank in (0, 1):
        mine = got[rank][case]
        assert mine["sequences"] == 3
        assert abs(mine["value"] - want["value"]) <= TOL * abs(want["value"])
        for key in ("gradient", "full", "outer", "top"):
            if want[key] is not None:
                assert close(mine[key], want[key]), f"{case} {key} on rank {rank}"
    for key in ("value", "gradient", "full", "top"):  # the same numbers on both ranks
        assert torch.equal(torch.as_tensor(got[0][case][key]), torch.as_tensor(got[1][case][key]))


@pytest.mark.parametrize("field", ["wrt", "length", "objective"])
def test_ranks_that_disagree_get_one_clear_error_on_every_rank(spread, field):
    _, got = spread
    messages = [got[r][f"error {field}"] for r in (0, 1)]
    assert messages[0] is not None and messages[0] == messages[1]
    name = {"wrt": "wrt", "length": "sequence length", "objective": "objective"}[field]
    assert f"the ranks disagree on {name}" in messages[0]


def test_a_rank_whose_own_input_fails_stops_every_rank(spread):
    _, got = spread
    assert "token ids" in got[1]["error own input"]
    assert "rank(s) [1]" in got[0]["error own input"]
