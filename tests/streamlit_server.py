"""Shared by the browser tests: Chromium's path and flags, and a ``streamlit run app.py`` on loopback."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("HESSVIZ_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> None:
    """Skip without Chromium, or fail when the environment variable ``CI`` is set."""
    if not Path(CHROMIUM).exists():
        msg = f"Chromium not found at {CHROMIUM} (set HESSVIZ_CHROMIUM or apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def _cpu_seconds(pid: int | str) -> float:
    """User + system CPU seconds of one process (0 once it has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def browser_cpu_seconds() -> float:
    """CPU seconds of every Chromium process this test process started (all its renderers)."""
    me, total = str(os.getpid()), 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"chrom" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
        except OSError:
            continue
        parent = pid
        while parent not in ("0", "1", me):  # is it ours?
            try:
                parent = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1]
            except OSError:
                break
        if parent == me:
            total += _cpu_seconds(pid)
    return total


class Server:
    """``streamlit run app.py`` on 127.0.0.1 (``env`` added to this environment), logging to
    ``.pytest_cache/<log>``; its CPU time and memory come from /proc. The port is ``port``, else
    ``HESSVIZ_TEST_PORT`` (machines shared by several test runs give each its own), else a free one.
    ``command`` serves another way (``[".../bin/hessviz", "app"]``, from ``cwd``), given the port."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        log: str = "streamlit_test.log",
        port: int | None = None,
        command: list[str] | None = None,
        cwd: Path = ROOT,
    ):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port or int(os.environ.get("HESSVIZ_TEST_PORT", "0") or 0)))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        (ROOT / ".pytest_cache").mkdir(exist_ok=True)
        self.log_path = ROOT / ".pytest_cache" / log
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [*command, "--server.port", str(self.port)]
            if command
            else [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                "app.py",
                "--server.headless",
                "true",
                "--server.port",
                str(self.port),
                "--server.address",
                "127.0.0.1",
                "--browser.gatherUsageStats",
                "false",
            ],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.base}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"streamlit did not become healthy (exit code {self.proc.poll()})")
            time.sleep(0.3)

    def _status(self, field: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def rss(self) -> int:
        return self._status("VmRSS")

    def peak_rss(self) -> int:
        return self._status("VmHWM")

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def seconds_until_idle(self, timeout: float = 30, window: float = 0.5, below: float = 0.1) -> float:
        """Seconds until the server uses under ``below`` of one core over ``window``."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            c0 = self.cpu_seconds()
            time.sleep(window)
            if (self.cpu_seconds() - c0) / window < below:
                return round(time.perf_counter() - t0 - window, 2)
        pytest.fail(f"the server was still busy {timeout} s after the visitors left")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@contextlib.contextmanager
def running_server(log: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    """A healthy :class:`Server` for the ``with`` block, stopped after it."""
    srv = Server(env, log=log)
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """Headless Chromium (Playwright's sync API) for the ``with`` block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()
