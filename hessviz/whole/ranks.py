r"""A whole-model Hessian over several processes (``MODEL.md`` part 4, "Many processes").

Rank ``r`` holds ``B_r`` of the ``B = Σ_r B_r`` sequences. The objective is their mean, so

.. math::
    ℓ = \frac1B \sum_r \sum_{β ∈ r} ℓ_β, \qquad
    H v = \sum_r \Big(\frac1B \sum_{β ∈ r} H_β v\Big), \qquad ∇ℓ = \sum_r \frac1B \sum_{β ∈ r} ∇ℓ_β :

each rank weighs its own sequences' sums by the global ``1/B`` and one ``all_reduce`` (sum) over
the group makes the union batch's number on every rank. A product of ``k`` columns is one
all-reduce of ``k × P'`` values; the gradient one of ``P'``; the value one scalar.

Before anything is computed the ranks agree (:func:`agree`): one ``all_gather`` of a few
integers per rank (the sequence count, the sequence length, and digests of ``wrt``, the objective,
the dtype and the model's configuration). A rank whose own inputs failed, or ranks that disagree,
make every rank raise the same :class:`~hessviz.errors.InputError` naming the field: nothing
waits on a collective that another rank will never reach.

Works on any backend: the tensors go to the group's device for the collective (``cuda`` for
NCCL, the CPU for gloo) and come back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from hessviz.errors import InputError

FIELDS = ("sequences", "sequence length", "wrt", "objective", "dtype", "model")
"""What each rank states before the first product (:func:`agree`); all but ``sequences`` must agree."""


def digest(text: str) -> int:
    """A 56-bit digest of ``text``, the same in every process (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "big")


@dataclass(frozen=True)
class Ranks:
    """The processes a whole-model Hessian spans: ``group`` (``None``: one process) and the
    device its collectives run on."""

    group: object | None
    device: torch.device
    size: int = 1

    @property
    def spread(self) -> bool:
        return self.size > 1

    def all_reduce_(self, t: Tensor) -> Tensor:
        """``t`` summed over the ranks, in place (a copy on the group's device when ``t`` is
        elsewhere or not contiguous)."""
        if not self.spread:
            return t
        buf = t if t.device == self.device and t.is_contiguous() else t.to(self.device).contiguous()
        dist.all_reduce(buf, group=self.group)
        if buf is not t:
            t.copy_(buf)
        return t


def ranks(group: object | None) -> Ranks:
    """The :class:`Ranks` of ``group``: the world when ``torch.distributed`` is initialised and
    ``group`` is ``None``; one process when it is not initialised (then ``group`` must be ``None``)."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise InputError(
                "group needs torch.distributed to be initialised "
                "(torch.distributed.init_process_group), got a group without it"
            )
        return Ranks(None, torch.device("cpu"))
    group = dist.group.WORLD if group is None else group
    backend = dist.get_backend(group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    return Ranks(group, device, dist.get_world_size(group))


def all_succeeded(where: Ranks, error: Exception | None, what: str) -> None:
    """One ``all_gather`` of one integer per rank after a step (``what``) that may fail on some
    ranks only (a zero-variance row of one rank's sequence): every rank raises, this rank its own
    ``error``, the others an :class:`InputError` naming the ranks that failed."""
    if not where.spread:
        if error is not None:
            raise error
        return
    flags = [torch.zeros(1, dtype=torch.int64, device=where.device) for _ in range(where.size)]
    dist.all_gather(flags, torch.tensor([int(error is None)], device=where.device), group=where.group)
    failed = [r for r, f in enumerate(flags) if int(f) == 0]
    if error is not None:
        raise error
    if failed:
        raise InputError(
            f"model_hessian over {where.size} processes: {what} failed on rank(s) {failed} "
            "(see that rank's error); every rank stops"
        )


def agree(where: Ranks, fields: dict[str, object] | None, error: Exception | None) -> list[int]:
    """Every rank's sequence count, after checking that the ranks agree on :data:`FIELDS`.

    ``fields`` maps each name of :data:`FIELDS` to this rank's value (``None`` when this rank's own
    inputs failed with ``error``). One ``all_gather`` of ``len(FIELDS) + 1`` integers; on a
    failure or a disagreement every rank raises the same :class:`InputError` (this rank's own
    ``error`` as it was)."""
    if not where.spread:
        if error is not None:
            raise error
        return [int(fields["sequences"])]
    row = torch.zeros(len(FIELDS) + 1, dtype=torch.int64)
    if error is None:
        row[0] = 1
        row[1] = int(fields["sequences"])
        row[2] = int(fields["sequence length"])
        for i, name in enumerate(FIELDS[2:], 3):
            row[i] = digest(str(fields[name]))
    rows = [torch.zeros_like(row, device=where.device) for _ in range(where.size)]
    dist.all_gather(rows, row.to(where.device), group=where.group)
    table = torch.stack(rows).cpu()
    failed = [r for r in range(where.size) if table[r, 0] == 0]
    if failed:
        if error is not None:
            raise error
        raise InputError(
            f"model_hessian over {where.size} processes: the inputs of rank(s) {failed} were "
            "refused there (see that rank's error); every rank stops"
        )
    described = None
    for i, name in enumerate(FIELDS[1:], 2):
        column = table[:, i]
        if name == "sequence length":
            column = column[table[:, 1] > 0]  # a rank without sequences has no length
        if column.numel() and bool((column != column[0]).any()):
            if described is None:  # every rank reaches this together
                described = [None] * where.size
                dist.all_gather_object(described, {k: str(v) for k, v in fields.items()}, group=where.group)
            values = ", ".join(f"rank {r}: {d[name]}" for r, d in enumerate(described))
            raise InputError(
                f"model_hessian over {where.size} processes: the ranks disagree on {name} "
                f"({values}); every rank must pass the same wrt, objective, dtype and "
                "sequence length (and model)"
            )
    return table[:, 1].tolist()


ONE = Ranks(None, torch.device("cpu"))
"""One process: no collective."""
