"""Time the "Real model" page under AppTest: seconds to its first figure and to the whole page.

Run from the repository root (the default view: all-MiniLM-L6-v2, layer 3, the default
~27-token sentence, or ``--tokens 32`` for a 32-token text)::

    python scripts/time_real_model_page.py [--tokens 32] [--threads 1]

The app's own setting decides torch's threads (``HESSVIZ_APP_THREADS``, 1 by default, as
``app.py`` sets it). Each run is a cold server: nothing is cached yet. A timing, not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def text_of(tokens: int) -> str:
    """A plain English sentence of exactly ``tokens`` MiniLM tokens ([CLS] and [SEP] included)."""
    from hessviz import pretrained

    words = (
        "The old lighthouse keeper climbed the narrow stairs every evening to light the lamp and watch "
        "the ships pass safely through the dark water of the bay while the wind blew hard from the "
        "north and the rain fell on the roof"
    ).split()
    for n in range(1, len(words) + 1):
        text = " ".join(words[:n]) + "."
        if len(pretrained.token_ids("all-MiniLM-L6-v2", text)) >= tokens:
            return text
    raise SystemExit(f"no text of {tokens} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=0, help="text length in tokens (0: the page's default)")
    parser.add_argument("--threads", type=int, default=1, help="HESSVIZ_APP_THREADS")
    args = parser.parse_args()
    os.environ["HESSVIZ_APP_THREADS"] = str(args.threads)
    from streamlit.testing.v1 import AppTest

    from hessviz import app as hva
    from hessviz import pretrained

    marks: list[float] = []
    chart = hva.chart

    def timed_chart(*a, **k):
        marks.append(time.perf_counter())
        return chart(*a, **k)

    hva.chart = timed_chart
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.switch_page("pages/real_model.py")
    if args.tokens:
        text = text_of(args.tokens)
        at.query_params["rm_text"] = text
        print(f"text ({len(pretrained.token_ids('all-MiniLM-L6-v2', text))} tokens): {text}")
    start = time.perf_counter()
    at.run()
    end = time.perf_counter()
    if at.exception:
        raise SystemExit(f"the page raised: {[e.value for e in at.exception]}")
    print(
        f"threads {args.threads}: first figure {marks[0] - start:.2f} s, "
        + ", ".join(f"figure {i + 1} {m - start:.2f} s" for i, m in enumerate(marks[1:], 1))
        + f"; whole page {end - start:.2f} s ({len(at.get('plotly_chart'))} figures)"
    )
    for w in at.warning:
        print("warning:", w.value[:300])


if __name__ == "__main__":
    main()
