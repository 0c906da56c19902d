"""A whole-model Hessian over the processes ``torchrun`` starts (``docs/distributed.md``).

    torchrun --standalone --nproc-per-node 2 scripts/distributed_hessian.py pydoc-llama --batch 4

Every rank loads the model, takes every ``world``-th sequence of one fixed batch (a rank may get
none), and calls ``hv.model_hessian(..., group=None)``: the loss, the gradient's norm and the top
eigenvalues printed by rank 0 are those of the whole batch, and every rank holds the same numbers.
``--backend nccl`` runs the collectives on each rank's GPU (``LOCAL_RANK``); gloo on the CPU is the
default.
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist

import hessviz as hv
from hessviz import matfree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="a checkpoint folder, GGUF file or bundled name (e.g. pydoc-llama)")
    ap.add_argument("--batch", type=int, default=4, help="sequences in the whole batch")
    ap.add_argument("--length", type=int, default=8, help="tokens per sequence")
    ap.add_argument("--wrt", nargs="*", default=None, help="layer weights (default: every one)")
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument(
        "--checkpoint", action="store_true", help="rebuild each layer per product (memory of one layer)"
    )
    a = ap.parse_args()
    if a.backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(a.backend, timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = hv.load_model(a.source)
    vocab = model.family.vocab_size
    ids = torch.randint(0, vocab, (a.batch, a.length), generator=torch.Generator().manual_seed(0))
    res = hv.model_hessian(  # (0, L) on a rank without any
        model, ids[rank::world], "next_token", a.wrt, checkpoint=a.checkpoint
    )
    grad = torch.cat([g.reshape(-1) for g in res.gradient().values()])
    top = matfree.top_eigenvalues(res, "full", k=3)  # the same seed on every rank
    if rank == 0:
        print(
            f"{world} ranks, {res.sequences} sequences: loss {float(res.value):.10g}, "
            f"|grad| {float(grad.norm()):.10g}, top-3 {', '.join(f'{x:.10g}' for x in top)}"
        )
    dist.barrier()  # no rank tears down while a peer's gloo thread still reads their socket
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
