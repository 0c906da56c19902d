"""What a command computes on, and the checks before it starts: :class:`Setup` (the block, weights,
input and objective), :func:`guard` (the whole run's estimated peak against the memory limit, from
the flags alone) and :func:`check_out` (an ``--out`` the command could write).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import hessviz as hv
from hessviz.checks import cost
from hessviz.commands.options import DTYPES
from hessviz.runtime.memory import check_fits, format_bytes, memory_limit


@dataclass(frozen=True)
class Setup:
    """What a command computes on: the block, its weights, its input, the target or the model's own
    objective (``custom``), the names, a line that says what it is, and where it comes from
    (``provenance``: the model, layer, objective and tokens, written into the report)."""

    cfg: hv.BlockConfig
    params: dict[str, torch.Tensor]
    X: torch.Tensor
    Y: torch.Tensor | None
    custom: hv.CustomLoss | None
    wrt: tuple[str, ...] | None
    title: str
    provenance: dict


Price = Callable[[hv.BlockConfig, tuple[str, ...] | None, int], int]
"""``(cfg, names, itemsize) -> bytes``: the peak of a command's whole run on a block
(:mod:`hessviz.checks.cost`)."""

BLOCK_ADVICE = "lower -L, -d, --d-k, --d-ff or --heads, or pass fewer names in --wrt"
MODEL_ADVICE = "use a shorter --text (or fewer --ids), or pass fewer names in --wrt"


def guard(
    args: argparse.Namespace,
    cfg: hv.BlockConfig,
    price: Price,
    device: str,
    *,
    before: int = 0,
    beside: int = 0,
) -> None:
    """Refuse the whole run, before anything of its size is allocated, when its estimated peak is over
    the memory limit (:func:`hessviz.runtime.memory.memory_limit`: ``HESSVIZ_MEMORY_LIMIT``, else half of
    the free memory): ``price`` of the block and the names of ``--wrt`` (the forward tape, the terms
    or the products, :mod:`hessviz.checks.cost`), with ``beside`` bytes that stay alive through it (a
    model's LM head) and ``before`` bytes that are freed before it starts (a model's hidden states).
    The library checks each dense term again when it computes it; this check comes first, so a long
    input is refused in the time it takes to read the flags, not after its tape (``L²`` per head)
    has filled the memory. The limit is on what the run allocates, beyond the few hundred MiB of
    Python, torch and hessviz themselves."""
    try:
        memory_limit(device)
    except ValueError as e:  # HESSVIZ_MEMORY_LIMIT=1PB: parse_bytes's plain ValueError
        raise hv.InputError(f"HESSVIZ_MEMORY_LIMIT: {e}") from None
    names = cfg.sort_names(tuple(args.wrt)) if args.wrt else None
    itemsize = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    run = price(cfg, names, itemsize)
    P = cfg.num_params if names is None else sum(cfg.param_size(n) for n in names)
    check_fits(
        f"this run at L = {cfg.seq_len:,} tokens and P = {P:,} weights (its forward tape "
        f"alone {format_bytes(cost.tape_bytes(cfg, itemsize))})",
        max(before, run + beside),
        device,
        MODEL_ADVICE if args.model is not None else BLOCK_ADVICE,
    )


def check_out(out: Path, targets: tuple[Path, ...], *, force: bool | None, create: bool) -> None:
    """Refuse an ``--out`` the command could not write, before any work: a target that is a folder,
    one that exists (unless ``force``; ``None``: the command overwrites its outputs), a folder that
    does not exist (``create``: the nearest existing one above it, where the missing ones will be
    made), is not a folder or is not writable. Each an :class:`~hessviz.errors.InputError`, one line."""
    try:
        for target in targets:
            if target.is_dir():
                raise hv.InputError(f"--out {target} is a folder: give the path of the file to write")
            if force is False and target.exists():
                raise hv.InputError(f"--out {target} exists: pass --force to overwrite it")
        folder = out.parent
        if create:
            while not folder.exists() and folder != folder.parent:
                folder = folder.parent
        if not folder.exists():
            raise hv.InputError(f"--out {out}: the folder {folder} does not exist")
        if not folder.is_dir():
            raise hv.InputError(f"--out {out}: {folder} is not a folder")
    except OSError as e:  # a path that cannot even be looked at (permissions, a name too long)
        raise hv.InputError(f"--out {out}: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise hv.InputError(f"--out {out}: the folder {folder} is not writable")
