"""How the browser tests time a Streamlit page in Chromium (Playwright's sync API).

The page itself keeps the clock: :data:`WATCH` records, in the page's ``performance.now()``,
when a key went down and when the app's ``data-test-script-state`` went back to ``notRunning``,
then the first frame painted after that; :func:`rerendered` reads the difference. So a
re-render is timed from the keystroke to the frame the visitor sees, whatever order a test
looks at its visitors in. :func:`settled` waits for a run to end, :func:`exceptions` lists the
tracebacks a page shows, :func:`count_received` counts the websocket bytes it receives and
:func:`stats` is the median and maximum a test reports.
"""

from __future__ import annotations

import numpy as np

SCRIPT_STATE = (
    "() => document.querySelector('[data-testid=\"stApp\"]')?.getAttribute('data-test-script-state') === '{}'"
)


def settled(page, timeout_ms: float = 90_000, started: bool = False) -> None:
    """Wait until the script run is over: running first (when a rerun was just asked), then not."""
    if started:
        try:
            page.wait_for_function(SCRIPT_STATE.format("running"), timeout=3_000)
        except Exception:  # noqa: BLE001 - a fast rerun may be over before we look
            pass
    page.wait_for_selector("h1", timeout=timeout_ms)
    page.wait_for_function(SCRIPT_STATE.format("notRunning"), timeout=timeout_ms)


WATCH = """() => {
  // Records, in the page's own clock, when a key goes down and when the script state changes,
  // so a re-render is timed from the keystroke to the first frame painted after the run ended,
  // whatever order the test looks at the visitors in.
  // A run so fast that the page never shows the "running" state (a cached view) is caught by
  // the last change to the main area (the sidebar's own slider does not count) instead.
  if (window.__hv) return;
  const hv = window.__hv = {press: null, done: null, painted: null, running: false, last: null};
  document.addEventListener("keydown", () => {
    hv.press = performance.now(); hv.done = hv.painted = hv.last = null; hv.running = false;
  }, true);
  new MutationObserver(records => {
    for (const r of records) {
      const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      if (hv.press !== null && el && el.closest('[data-testid="stMain"]')) hv.last = performance.now();
      if (hv.press === null || hv.done !== null || r.attributeName !== "data-test-script-state") continue;
      const now = r.target.getAttribute("data-test-script-state");
      if (r.oldValue === "running" || now === "running") hv.running = true;
      if (hv.running && now === "notRunning") {
        hv.done = performance.now();
        requestAnimationFrame(() => requestAnimationFrame(() => { hv.painted = performance.now(); }));
      }
    }
  }).observe(document, {attributes: true, subtree: true, attributeOldValue: true, childList: true,
                        characterData: true});
}"""


def rerendered(page, timeout_ms: float = 90_000) -> float:
    """Seconds from the last keystroke to the first frame painted after the run it started ended
    (:data:`WATCH` must be installed in the page)."""
    page.wait_for_function(QUIET, timeout=timeout_ms)
    return page.evaluate("() => ((window.__hv.painted ?? window.__hv.last) - window.__hv.press) / 1000")


QUIET = """() => {
  const hv = window.__hv;
  if (!hv || hv.press === null) return false;
  if (hv.painted !== null) return true;
  const app = document.querySelector('[data-testid="stApp"]');
  const idle = app && app.getAttribute('data-test-script-state') === 'notRunning';
  return idle && hv.last !== null && performance.now() - hv.last > 1500;
}"""


def count_received(page, into: dict[str, int], key: str) -> None:
    """Add the bytes of every websocket frame the page receives to ``into[key]``."""

    def on_frame(data) -> None:
        into[key] += len(data)

    page.on("websocket", lambda ws: ws.on("framereceived", on_frame))


def exceptions(page) -> list[str]:
    return [e.inner_text()[:500] for e in page.query_selector_all('[data-testid="stException"]')]


def stats(xs: list[float]) -> dict[str, float]:
    return {"median": round(float(np.median(xs)), 2), "max": round(float(np.max(xs)), 2)}
