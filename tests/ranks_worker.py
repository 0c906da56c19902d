"""One rank of tests/test_whole_ranks.py (spawned; imports only hessviz and torch, so it starts fast).

Every case runs under one gloo group pinned to the loopback interface (``GLOO_SOCKET_IFNAME=lo``,
so a host name that resolves elsewhere cannot matter); each rank writes what it got to
``out/rank{r}.pt`` for the parent to compare with one process holding the whole batch, and its
standard error (C++ aborts included) to ``out/rank{r}.log`` for the parent to show if it dies.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import traceback

import torch
import torch.distributed as dist

import hessviz as hv
from hessviz import matfree
from hessviz.errors import InputError


def numbers(res: hv.ModelHessian, vectors: torch.Tensor) -> dict[str, object]:
    """What a case compares: the loss, the gradient, products of every term and the top eigenvalues."""
    grad = res.gradient()
    return {
        "value": float(res.value),
        "sequences": res.sequences,
        "gradient": torch.cat([g.reshape(-1) for g in grad.values()]),
        "full": res.matvec(vectors),
        "outer": res.matvec(vectors, "outer") if not res.problem.heads else None,
        "top": matfree.top_eigenvalues(res, "full", k=2),
    }


def cases(folder: str, ids: torch.Tensor, share: list[slice], rank: int) -> dict[str, object]:
    """Every case, this rank's share of the batch ``ids`` being ``ids[share[rank]]``."""
    model = hv.load_model(folder)
    mine = ids[share[rank]]
    out: dict[str, object] = {}
    wrt = ("l1.W_2", "l0.W_Q[1]", "l1.ln2_gamma")
    gen = torch.Generator().manual_seed(0)
    res = hv.model_hessian(model, mine, "next_token", wrt)
    out["next_token"] = numbers(res, torch.randn(res.size, 2, generator=gen, dtype=torch.float64))
    W, b, labels = classifier(model.cfg.d_model)
    head = hv.Classifier(W, b, labels[share[rank]], pooling="last")
    res = hv.model_hessian(model, mine, head, ("l0.W_V", "head.W", "head.b"))
    out["classifier"] = numbers(res, torch.randn(res.size, 2, generator=gen, dtype=torch.float64))
    empty = ids[:0] if rank == 1 else ids  # rank 1 holds no sequence
    res = hv.model_hessian(model, empty, "next_token", wrt)
    out["empty"] = numbers(res, torch.randn(res.size, 2, generator=gen, dtype=torch.float64))
    res = hv.model_hessian(model, empty, "next_token", wrt, checkpoint=True)  # layers rebuilt per product
    out["checkpointed"] = numbers(res, torch.randn(res.size, 2, generator=gen, dtype=torch.float64))
    for name, args in {
        "wrt": (mine, "next_token", wrt[:1] if rank == 0 else wrt[1:2]),
        "length": (mine[:, : 5 + rank], "next_token", wrt),
        "objective": (mine, "next_token" if rank == 0 else head, wrt[:1]),
        "own input": (mine if rank == 0 else mine + 10**6, "next_token", wrt),
    }.items():
        try:
            hv.model_hessian(model, *args)
            out[f"error {name}"] = None
        except InputError as e:
            out[f"error {name}"] = str(e)
    return out


def classifier(d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return (
        torch.randn(d, 3, generator=g, dtype=torch.float64),
        torch.randn(3, generator=g, dtype=torch.float64),
        torch.tensor([2, 0, 1]),
    )


def run(
    rank: int, world: int, init: str, folder: str, ids: torch.Tensor, share: list[slice], out: str
) -> None:
    log = open(f"{out}/rank{rank}.log", "w")  # noqa: SIM115 - open until the process ends
    os.dup2(log.fileno(), 2)
    faulthandler.enable(log)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    open(f"{out}/rank{rank}.started", "w").close()  # noqa: SIM115 - the group is up: what fails now is ours
    try:
        got = cases(folder, ids, share, rank)
    except Exception:  # the parent shows it
        got = {"crash": traceback.format_exc()}
    torch.save(got, f"{out}/rank{rank}.part")
    os.replace(f"{out}/rank{rank}.part", f"{out}/rank{rank}.pt")  # whole or absent, whatever follows
    # every rank reaches here before any tears its group down: a rank that exits while its peer's
    # gloo thread still reads their socket makes that thread throw, and the peer abort (SIGABRT)
    dist.barrier()
    dist.destroy_process_group()
