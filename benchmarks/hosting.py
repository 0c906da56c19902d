"""A cold hosted server and four visitors in Chromium: where the time and the memory go.

Starts ``streamlit run app.py`` with the hosted profile (``HESSVIZ_MEMORY_LIMIT=800MiB``) on loopback and
plays one sequence: four visitors open the heaviest pages at once; each moves a slider (a new view, then
a cached one); the heaviest URLs settle with their refusal; an unknown page and a script in the URL get
the default page; everyone starts a fresh view and leaves; thirty distinct views follow one after the
other. It records the first-chart and re-render seconds, the server's and the browsers' CPU, the bytes
sent to each page and the server's RSS along the way (``assets/screenshots/hosting.json``, quoted in
``docs/hosting.md``), and fails if a page shows an exception or the peak RSS passes 1 GiB.

A measurement, not a test (the tests hold the same guarantees at smaller sizes: ``tests/test_app_crowd.py``,
``tests/test_app_load.py``, ``tests/test_app_profiles.py``)::

    python benchmarks/hosting.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hessviz.app import runlog  # noqa: E402
from tests.page_timing import WATCH, count_received, exceptions, rerendered, settled, stats  # noqa: E402
from tests.streamlit_server import ARGS, CHROMIUM, Server, browser_cpu_seconds  # noqa: E402

HEAVY_PAGES = ["/verify?seed=200", "/spectrum", "/scaling", "/bounds"]
# the spectrum forced dense: its auto method goes matrix-free there, which a hosted server affords
REFUSED = [
    "/spectrum?L=64&d=32&dk=32&dff=48&spec_method=dense",
    "/bounds?L=64&d=64&dk=64",
    "/layernorm_collapse?lnc_view=block&L=64&d=64&dk=64&dff=256&lnc_decades=7&lnc_seeds=5",
    "/verify?L=64&d=32&dk=8&dff=24",
]


def main() -> None:
    """Run the sequence, print the record and write ``assets/screenshots/hosting.json``."""
    from playwright.sync_api import sync_playwright

    server = Server(
        {"HESSVIZ_PROFILE": "hosted", "HESSVIZ_MEMORY_LIMIT": "800MiB", runlog.ENV: "1"},
        log="streamlit_hosting_test.log",
    )
    out: dict[str, object] = {
        "cores": os.cpu_count(),
        "profile": "hosted",
        "memory_limit": "800MiB",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        server.wait_healthy()
        out["rss_server_started_mb"] = round(server.rss() / 2**20)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            # 1. a cold server, four visitors on the heaviest pages at once
            visitors = []
            received = dict.fromkeys(HEAVY_PAGES, 0)  # bytes the server sent to each page
            for url in HEAVY_PAGES:
                ctx = browser.new_context(viewport={"width": 1400, "height": 900})
                page = ctx.new_page()
                count_received(page, received, url)
                t0 = time.perf_counter()
                page.goto(server.base + url)
                visitors.append((url, ctx, page, t0))
            first = []
            for url, _, page, t0 in visitors:
                page.wait_for_selector(".js-plotly-plot", timeout=180_000)
                first.append(time.perf_counter() - t0)
                settled(page)
                assert exceptions(page) == [], (url, exceptions(page))
            out["first_chart_s"] = stats(first)
            out["rss_after_first_charts_mb"] = round(server.rss() / 2**20)
            # 2. each visitor moves a slider (d_k 8 -> 9: a new view, then back: a cached one) at
            # the same moment; where the time goes: each visitor's script run on the server (from
            # the run log), the CPU of the server and of the browsers, the bytes sent to each page
            for _, _, page, _ in visitors:
                page.evaluate(WATCH)
            for step in ("ArrowRight", "ArrowLeft"):
                name = "new" if step == "ArrowRight" else "cached"
                runs_before = len(runlog.parse(server.log_text()))
                cpu = (server.cpu_seconds(), browser_cpu_seconds())
                load = os.getloadavg()[0]
                for url in received:
                    received[url] = 0
                for _, _, page, _ in visitors:
                    sidebar = page.locator('[data-testid="stSidebar"]')
                    slider = sidebar.get_by_role("slider", name="Key width d_k")
                    slider.focus()
                    slider.press(step)
                times = []
                for url, _, page, _ in visitors:
                    times.append(rerendered(page))
                    assert exceptions(page) == [], (url, exceptions(page))
                cpu = (server.cpu_seconds() - cpu[0], browser_cpu_seconds() - cpu[1])
                time.sleep(0.5)  # the last run lines reach the log
                runs = [r for r in runlog.parse(server.log_text())[runs_before:] if r["end"] == "finished"]
                out[f"rerender_{name}_view_s"] = stats(times)
                out[f"rerender_{name}_view_detail"] = {
                    "visitors_s": {url: round(t, 2) for (url, *_), t in zip(visitors, times)},
                    "server_run_wall_s": {r["page"]: r["wall_s"] for r in runs},
                    "server_run_cpu_s": {r["page"]: r["cpu_s"] for r in runs},
                    "server_cpu_s": round(cpu[0], 2),
                    "browsers_cpu_s": round(cpu[1], 2),
                    "bytes_to_each_page": dict(received),
                    "load_average_before": round(load, 2),
                }
                if runs:
                    out[f"rerender_{name}_view_server_s"] = stats([r["wall_s"] for r in runs])
            # 3. the heaviest URLs of issue 8 settle with a message, no computation
            settle = []
            for (_, _, page, _), heavy in zip(visitors, REFUSED):
                t0 = time.perf_counter()
                page.goto(server.base + heavy)
                page.wait_for_selector("text=Too much for this server", timeout=60_000)
                settled(page)
                settle.append(time.perf_counter() - t0)
                assert exceptions(page) == [], (heavy, exceptions(page))
            out["refused_heaviest_urls_s"] = stats(settle)
            # 4. an unknown page and a script in the URL: the default page, no exception
            page = visitors[0][2]
            page.goto(server.base + "/no_such_page?L=%3Cscript%3Ealert(1)%3C/script%3E")
            page.wait_for_selector(".js-plotly-plot", timeout=60_000)
            settled(page)
            assert exceptions(page) == []
            # 5. everyone starts a fresh heavy view, then leaves at once
            for url, _, page, _ in visitors:
                page.goto(server.base + url.split("?")[0] + "?seed=77&dk=7")
            time.sleep(1.0)
            for _, ctx, _, _ in visitors:
                ctx.close()
            out["idle_after_leaving_s"] = server.seconds_until_idle()
            out["rss_after_leaving_mb"] = round(server.rss() / 2**20)
            # 6. thirty distinct views, one after the other: memory stays bounded
            ctx = browser.new_context(viewport={"width": 1400, "height": 900})
            page = ctx.new_page()
            rss = []
            for seed in range(30):
                page.goto(f"{server.base}/?seed={1000 + seed}&dk={4 + seed % 8}")
                page.wait_for_selector(".js-plotly-plot", timeout=60_000)
                settled(page)
                rss.append(server.rss())
            assert exceptions(page) == []
            ctx.close()
            browser.close()
        out["rss_over_30_views_mb"] = {
            "first": round(rss[0] / 2**20),
            "last": round(rss[-1] / 2**20),
            "max": round(max(rss) / 2**20),
        }
        out["peak_rss_mb"] = round(server.peak_rss() / 2**20)
        out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        print("hosting:", json.dumps(out), flush=True)
        shots = ROOT / "assets" / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        (shots / "hosting.json").write_text(json.dumps(out, indent=2) + "\n")
        assert server.peak_rss() < 2**30, f"peak RSS {server.peak_rss() / 2**20:.0f} MiB over 1 GiB"
    finally:
        server.stop()


if __name__ == "__main__":
    main()
