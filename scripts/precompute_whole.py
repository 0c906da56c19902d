"""Precompute the Whole model page's default tables (every part of each bundled pydoc model on the
default text) into ``hessviz/data/whole_tables.json``, which the page (and the hosted profile) reads first.

    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/precompute_whole.py [--out hessviz/data/whole_tables.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from hessviz.app import whole_model as wm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=wm.FILE)
    ap.add_argument("--models", nargs="+", default=list(wm.MODELS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    size = wm.precompute(args.models, args.out, command=" ".join(["python", *sys.argv]))
    print(f"wrote {args.out} ({size:,} bytes)")


if __name__ == "__main__":
    main()
