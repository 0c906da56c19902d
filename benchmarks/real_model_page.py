"""The Real model page in Chromium: seconds from a control change to the figure it changes.

Starts ``streamlit run app.py`` (local profile unless ``--hosted``) on loopback, opens the
page with all-MiniLM-L6-v2 and the default text at 1280 × 720, and measures, each several
times, the median (and the worst) of:

* **first figure**: a new browser tab on the default view (precomputed: no model is loaded)
  until its first chart, and until all four charts;
* **head**: the head slider moved one step (``W_Q[h]``'s window, precomputed for every head),
  until the Hessian chart shows ``W_Q[h]``;
* **weight**: the weight buttons (``W_K``, ``W_V`` of head 0: precomputed; ``W_O``: computed live,
  the first live view, so it also loads the model), until the Hessian chart shows it;
* **head, live**: the head slider moved with ``W_O`` chosen (no precomputed window: 384 products);
* **target seed**: the seed slider moved one step, until the Hessian chart's numbers change
  (the attention is not recomputed; the table of the layer is, after it).

Prints the medians, their ratio to the issue's budgets (2 s, 3 s) and the load average
before and after (the machine is shared: read the ratios with the load). A timing, not a test::

    python benchmarks/real_model_page.py [--repeats 3] [--port 8613] [--hosted]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.streamlit_server import ARGS, CHROMIUM, Server  # noqa: E402

IDLE = (
    "() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
    " return a && a.getAttribute('data-test-script-state') === 'notRunning'; }"
)
CHARTS = "() => document.querySelectorAll('.js-plotly-plot').length >= {n}"
HESSIAN = (
    "() => [...document.querySelectorAll('.gtitle')].some(e => e.textContent.includes('Hessian of {name},'))"
)
FIRST_ENTRY = (
    "() => { const p = [...document.querySelectorAll('.js-plotly-plot')].find(d => d.layout && "
    "String(d.layout.title && d.layout.title.text).includes('Hessian of')); "
    "return p ? JSON.stringify(p.data[0].z).slice(0, 400) : ''; }"
)
BUDGET = {"first figure": 2.0, "head": 3.0, "weight": 3.0, "head, live": 3.0, "target seed": 3.0}


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def timed(page, action, until: str, timeout: float = 120_000) -> float:
    t0 = time.perf_counter()
    action()
    page.wait_for_function(until, timeout=timeout)
    return time.perf_counter() - t0


def settle(page) -> None:
    page.wait_for_timeout(300)
    page.wait_for_function(IDLE, timeout=300_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=8613)
    parser.add_argument("--hosted", action="store_true", help="HESSVIZ_PROFILE=hosted, 800 MiB")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    env = {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB"} if args.hosted else {}
    print(
        f"load average before: {load()}; profile {'hosted' if args.hosted else 'local'}; "
        f"HESSVIZ_APP_THREADS={os.environ.get('HESSVIZ_APP_THREADS', '1 (default)')}"
    )
    srv = Server(env=env, log="benchmark_real_model.log", port=args.port)
    times: dict[str, list[float]] = {k: [] for k in BUDGET}
    extra: dict[str, float] = {}
    try:
        srv.wait_healthy()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            url = f"{srv.base}/real_model?rm_model=all-MiniLM-L6-v2"
            for i in range(args.repeats + 1):  # the first tab also warms the server
                ctx = browser.new_context(viewport={"width": 1280, "height": 720})
                page = ctx.new_page()
                t0 = time.perf_counter()
                page.goto(url)
                page.wait_for_function(CHARTS.format(n=1), timeout=300_000)
                first = time.perf_counter() - t0
                page.wait_for_function(CHARTS.format(n=4), timeout=300_000)
                if i == 0:
                    extra["first figure, cold server"] = first
                    extra["all four figures, cold server"] = time.perf_counter() - t0
                else:
                    times["first figure"].append(first)
                    extra.setdefault("all four figures", []).append(time.perf_counter() - t0)
                settle(page)
                if i < args.repeats:
                    ctx.close()
            head = page.get_by_role("slider", name="Head")
            for h in range(1, args.repeats + 1):
                times["head"].append(
                    timed(
                        page,
                        lambda: (head.focus(), head.press("ArrowRight")),
                        HESSIAN.replace("{name}", f"W_Q[{h}]"),
                    )
                )
                settle(page)
            head.focus()
            head.press("Home")
            settle(page)
            for w in ("W_K", "W_V", "W_O")[: max(1, args.repeats)]:
                times["weight"].append(
                    timed(
                        page,
                        lambda w=w: page.get_by_role("radio", name=w).click(),
                        HESSIAN.replace("{name}", f"{w}[0]"),
                    )
                )
                settle(page)
            page.get_by_role("radio", name="W_O").click()
            settle(page)
            for h in range(1, args.repeats + 1):
                times["head, live"].append(
                    timed(
                        page,
                        lambda: (head.focus(), head.press("ArrowRight")),
                        HESSIAN.replace("{name}", f"W_O[{h}]"),
                    )
                )
                settle(page)
            seed = page.get_by_role("slider", name="Target seed")
            for _ in range(args.repeats):
                before = page.evaluate(FIRST_ENTRY)
                changed = f"() => ({FIRST_ENTRY})() !== {before!r} && ({FIRST_ENTRY})() !== ''"
                times["target seed"].append(
                    timed(page, lambda: (seed.focus(), seed.press("ArrowRight")), changed)
                )
                settle(page)
            browser.close()
        peak = srv.peak_rss()
    finally:
        srv.stop()
    print(f"load average after: {load()}; server peak RSS {peak / 2**20:.0f} MiB")
    print(f"{'change':<16}{'median s':>10}{'worst s':>10}{'budget s':>10}{'median/budget':>15}  runs")
    for name, ts in times.items():
        if ts:
            med = statistics.median(ts)
            print(
                f"{name:<16}{med:>10.2f}{max(ts):>10.2f}{BUDGET[name]:>10.1f}{med / BUDGET[name]:>15.2f}  "
                + ", ".join(f"{t:.2f}" for t in ts)
            )
    for name, t in extra.items():
        t = statistics.median(t) if isinstance(t, list) else t
        print(f"{name}: {t:.2f} s")


if __name__ == "__main__":
    main()
