"""Lesson pages of the classroom tour: how long each takes to make, how big it is, and how fast a baked
control redraws in a browser with no server (issue 32; goals: made in <= 60 s on 2 cores, <= 8 MiB,
aim 5 MiB, a step redrawn in <= 200 ms).

Each stop's page is made by ``python -m hessviz lesson`` in a fresh process (nothing cached between
stops), timed by its wall clock and its CPU (user + system of the child). Then Chromium opens each page
from ``file://`` with the network off and moves every baked control through all its values; each
step's redraw is timed in the page (``window.lessonLastRedrawMs``: from the control's event to every
chart's ``Plotly.react`` settled). Medians and maxima per page, and the load average at start and end
(the machine may be shared: a loaded one stretches the wall times, not the CPU).

    python benchmarks/lesson_pages.py                  # every tour stop, writes benchmarks/LESSON.md
    python benchmarks/lesson_pages.py --stops 4 5 --out /tmp/LESSON.md
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hessviz.app.tour import TOUR  # noqa: E402
from tests.streamlit_server import ARGS, CHROMIUM  # noqa: E402


def make(link: str, out: Path) -> dict:
    """Make one page in a fresh process: wall and CPU seconds, size."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    command = [sys.executable, "-m", "hessviz", "lesson", "/" + link, "--out", str(out), "--quiet"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{link}: {proc.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "mib": out.stat().st_size / 2**20}


def redraws(path: Path) -> list[float]:
    """Milliseconds of every step of every baked control, in Chromium, offline."""
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 720})
        context.set_offline(True)
        page = context.new_page()
        page.goto(path.as_uri())
        page.wait_for_function("() => window.lessonRedraws >= 1", timeout=60_000)
        controls = page.evaluate("JSON.parse(document.getElementById('lesson-data').textContent).controls")
        for i, c in enumerate(controls):
            for j in list(range(1, len(c["texts"]))) + [0]:
                drawn = page.evaluate("window.lessonRedraws")
                if c["slider"]:
                    page.locator(f"#c{i}").fill(str(j))
                else:
                    page.locator(f'fieldset[data-control="{i}"] label').nth(j).click()
                page.wait_for_function(f"() => window.lessonRedraws > {drawn}", timeout=30_000)
                times.append(page.evaluate("window.lessonLastRedrawMs"))
        browser.close()
    return times


def report(rows: list, load0: tuple, out: str) -> None:
    """Write the table of the stops measured so far (after each one: a long run stopped early keeps them)."""
    load1 = os.getloadavg()
    lines = [
        "# Lesson pages of the classroom tour",
        "",
        f"`python benchmarks/lesson_pages.py` on {os.cpu_count()} cores; load average "
        f"{load0[0]:.1f} / {load0[1]:.1f} / {load0[2]:.1f} at start and {load1[0]:.1f} / {load1[1]:.1f} / "
        f"{load1[2]:.1f} at end (1 / 5 / 15 min). Each page made by `hessviz lesson` in a fresh process; "
        "each redraw is one step of a baked control in Chromium with the network off (goals: made in "
        "≤ 60 s on 2 cores, ≤ 8 MiB, aim 5 MiB; a step redrawn in ≤ 200 ms).",
        "",
        "| stop | lesson link | steps timed | made: wall (s) | made: CPU (s) | size (MiB) | "
        "redraw median (ms) | redraw max (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, stop, made, steps in rows:
        lines.append(
            f"| {n} | `/{stop.link()}` | {len(steps)} | {made['wall_s']:.1f} | "
            f"{made['cpu_s']:.1f} | {made['mib']:.2f} | {statistics.median(steps):.0f} | "
            f"{max(steps):.0f} |"
        )
    Path(out).write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stops", type=int, nargs="+", default=list(range(1, len(TOUR) + 1)))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "LESSON.md"))
    args = parser.parse_args()
    load0 = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.stops:
            stop = TOUR[n - 1]
            path = Path(tmp) / f"stop{n}.html"
            made = make(stop.link(), path)
            steps = redraws(path)
            rows.append((n, stop, made, steps))
            print(
                f"stop {n} ({stop.link()}): made in {made['wall_s']:.1f} s wall, "
                f"{made['cpu_s']:.1f} s CPU, {made['mib']:.2f} MiB; "
                f"redraw median {statistics.median(steps):.0f} ms, "
                f"max {max(steps):.0f} ms over {len(steps)} steps",
                flush=True,
            )
            report(rows, load0, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
