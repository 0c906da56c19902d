"""Precompute the Real model page's default views into ``hessviz/data/real_views.npz``.

For each bundled model present here (all-MiniLM-L6-v2 needs the ``models`` extra; the
pydoc pair is in ``hessviz/data/models/``): the default text, the default layer, the synthetic
loss with target seed 0, and for every head the attention, the exact window of ``W_Q[h]``,
``W_K[h]`` and ``W_V[h]`` (default rows, full term), the gradient norms (by weight and by
head) and the per-block curvature of every weight. Everything goes through the app's own cache functions, the
path of a live view, so a precomputed figure is the figure the page would compute. The
file's manifest records the command, the versions and the seconds of each entry.

Run from the repository root, at build time (a few minutes on one core)::

    python scripts/precompute_real.py [--out hessviz/data/real_views.npz] [--models NAME ...]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default: the package's")
    parser.add_argument("--models", nargs="*", default=None, help="models (default: every bundled one here)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the app's default is 1)")
    args = parser.parse_args()
    os.environ.setdefault("HESSVIZ_PROFILE", "local")
    import torch

    torch.set_num_threads(args.threads)
    from hessviz import pretrained
    from hessviz.app import real_model
    from hessviz.pretrained import precomputed

    models = args.models or list(pretrained.available_models())
    out = args.out or precomputed.FILE
    size = real_model.precompute(models, out, command=" ".join(["python", *sys.argv]))
    print(f"wrote {out} ({size / 2**20:.2f} MiB): {', '.join(models)}")


if __name__ == "__main__":
    main()
