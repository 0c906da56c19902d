"""150 tabs opening 150 distinct views at once on a cold hosted server: the crowd of ``docs/hosting.md``.

The same sequence as the crowd test (:func:`tests.test_app_crowd.crowd_record`, which runs it at
:data:`tests.test_app_crowd.TABS` tabs and asserts the same guarantees), at the size the docs quote:
peak memory, charts and *class is full* pages, first-chart and full-page seconds. Writes
``assets/screenshots/crowd.json``; exits 1 if a tab got an exception, an error box, no answer or
neither, the memory passed the limit, or the server was not serving afterwards::

    python benchmarks/crowd.py [TABS]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_app_crowd import crowd_record  # noqa: E402

TABS = 150


def main(tabs: int = TABS) -> int:
    """Run the crowd, print and write the record; the exit status (1 if a problem was found)."""
    out, problems = crowd_record(tabs, log="streamlit_crowd_bench.log")
    out["problems"] = problems[:20]
    print(json.dumps(out, indent=2))
    shots = ROOT / "assets" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    (shots / "crowd.json").write_text(json.dumps(out, indent=2) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else TABS))
