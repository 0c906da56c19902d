"""hessviz as a stranger meets it: the wheel built from this checkout, installed into a fresh virtual
environment in a folder that is not the checkout, and used there.

- The distribution: a wheel that carries its data (≤ 25 MiB), the app's script, settings and pages;
  metadata with a torch range and no exact pin; ``twine check``; an sdist without the checkout's tests.
- Without extras: ``import hessviz`` loads neither Streamlit, pandas, pyarrow nor Plotly, and the app
  stack is not even installed; the bundled models list and compute; a lesson page is written and reads
  offline; every ``--help`` exits 0; a closed pipe and ``hessviz app`` without its extra are one line.
- With ``[app]``: ``hessviz app`` serves every page from the installed package, on loopback, each with
  a chart (or the claims' table) in Chromium and no exception.

torch comes from this machine's local CPU wheel (``torch==2.13.0``, seconds); Streamlit and the rest
from the package index, as any user gets them. Slow tier: about two minutes on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.streamlit_server import ROOT, Server, chromium, require_chromium

pytestmark = pytest.mark.slow

WHEEL_LIMIT = 25 * 2**20
TORCH = "torch==2.13.0"  # the README's pin: this machine's CPU build, from its disk


def _run(cmd: list[str], cwd: Path, timeout: float = 600, check: bool = True, env: dict | None = None):
    """``cmd`` in ``cwd`` with an environment that knows nothing of the checkout."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    out = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=clean | (env or {})
    )
    if check and out.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    return out


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist, built from this checkout as ``python -m build`` builds them."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], cwd=out)
    return {"wheel": next(out.glob("hessviz-*.whl")), "sdist": next(out.glob("hessviz-*.tar.gz"))}


class Venv:
    """A fresh virtual environment in ``root``, used from ``work`` (neither is the checkout)."""

    def __init__(self, root: Path):
        self.root, self.work = root / "venv", root / "work"
        self.work.mkdir()
        _run([sys.executable, "-m", "venv", str(self.root)], cwd=root)
        self.bin = self.root / "bin"

    def pip(self, *args: str) -> None:
        _run([str(self.bin / "python"), "-m", "pip", "install", "-q", *args], cwd=self.work)

    def python(self, code: str, **kw) -> subprocess.CompletedProcess:
        return _run([str(self.bin / "python"), "-c", code], cwd=self.work, **kw)

    def hessviz(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return _run([str(self.bin / "hessviz"), *args], cwd=self.work, **kw)


@pytest.fixture(scope="module")
def venv(tmp_path_factory, dist) -> Venv:
    """The wheel with no extras, beside the torch of the README's set-up commands."""
    v = Venv(tmp_path_factory.mktemp("stranger"))
    v.pip(TORCH, str(dist["wheel"]))
    return v


def test_the_wheel_carries_its_data_and_states_its_requirements(dist):
    wheel = dist["wheel"]
    assert wheel.stat().st_size <= WHEEL_LIMIT, f"{wheel.stat().st_size / 2**20:.1f} MiB"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for model in ("pydoc-postln", "pydoc-preln", "pydoc-llama"):
        for f in ("model.safetensors", "config.json", "tokenizer.json"):
            assert f"hessviz/data/models/{model}/{f}" in names
    for f in ("claims/claims.json", "claims/smollm2/table.json", "real_views.npz", "whole_tables.json"):
        assert f"hessviz/data/{f}" in names
    assert {
        "hessviz/app/config.toml",
        "hessviz/app/streamlit_app.py",
        "hessviz/bench/dense.py",
        "hessviz/app/templates/lesson.html",
        "hessviz/app/templates/lesson.css",
        "hessviz/app/templates/lesson.js",
    } <= names
    pages = [n for n in names if n.startswith("hessviz/app/pages/") and n.endswith(".py")]
    assert len(pages) == 14  # thirteen pages and the package's __init__
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "assets/"))]
    requires = [line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")]
    core = [r for r in requires if "extra ==" not in r]
    assert any(r.replace(" ", "") in ("torch<3,>=2.13", "torch>=2.13,<3") for r in core), core
    assert not [r for r in requires if "==" in r.split(";")[0]], "an exact pin in the metadata"
    assert not [r for r in core if r.startswith(("streamlit", "pandas", "pyarrow"))]
    assert "License-Expression: MIT" in meta and "Requires-Python: >=3.11" in meta
    assert "](docs/" not in meta and "](../" not in meta, "a relative link in the long description"
    check = _run([sys.executable, "-m", "twine", "check", str(wheel), str(dist["sdist"])], cwd=wheel.parent)
    assert check.stdout.count("PASSED") == 2


def test_the_sdist_ships_the_package_and_no_tests_it_cannot_run(dist):
    import tarfile

    with tarfile.open(dist["sdist"]) as t:
        names = [n.split("/", 1)[1] for n in t.getnames() if "/" in n]
    assert "LICENSE" in names and "hessviz/data/models/pydoc-llama/model.safetensors" in names
    assert not [n for n in names if n.startswith("tests/")]


def test_an_install_without_extras_computes_and_loads_no_app_stack(venv):
    probe = (
        "import importlib.util, json, sys\n"
        "import hessviz as hv, hessviz.cli, hessviz.app.lesson_page\n"
        "stack = ('streamlit', 'pandas', 'pyarrow')\n"
        "print(json.dumps({'file': hv.__file__, 'loaded': [m for m in stack if m in sys.modules],\n"
        "                  'installed': [m for m in stack if importlib.util.find_spec(m)]}))"
    )
    got = json.loads(venv.python(probe).stdout)
    assert str(ROOT) not in got["file"] and "site-packages" in got["file"]
    assert got["loaded"] == [] and got["installed"] == []
    plain = venv.python("import sys, hessviz; print('plotly' in sys.modules)").stdout.strip()
    assert plain == "False", "import hessviz loaded Plotly"

    models = venv.hessviz("models").stdout
    assert all(name in models for name in ("pydoc-postln", "pydoc-preln", "pydoc-llama"))

    venv.hessviz(
        "compute",
        "--model",
        "pydoc-preln",
        "--layer",
        "1",
        "--text",
        "def add(a, b):",
        "--wrt",
        "ln1_gamma",
        "b_1",
        "--out",
        "out/preln",
    )
    summary = json.loads((venv.work / "out" / "preln.json").read_text())
    assert summary and (venv.work / "out" / "preln.npz").stat().st_size > 0

    venv.hessviz(
        "lesson", "http://localhost:8501/spectrum?d=8&L=4&dk=4&dff=8", "--out", "spectrum.html", "--quiet"
    )
    page = (venv.work / "spectrum.html").read_text()
    assert "Plotly" in page and '<script src="http' not in page, "the lesson page must read offline"


def test_reproduce_quick_writes_its_report_from_the_install(venv):
    """The papers' claims, measured from an install (the two protocols that read the bundled pydoc
    models from the package; every claim runs in-process in ``test_experiments.py``), written where
    ``--out`` says and nowhere in the package."""
    site = venv.python("import hessviz, pathlib; print(pathlib.Path(hessviz.__file__).parent)").stdout.strip()
    before = sorted(p.relative_to(site) for p in Path(site).rglob("*") if "__pycache__" not in p.parts)
    ids = ["gini_protocol", "optimizers_protocol"]
    out = venv.hessviz("reproduce", "--quick", "--only", *ids, "--out", "claims", timeout=900)
    claims = json.loads((venv.work / "claims" / "claims.json").read_text())
    assert [c["id"] for c in claims] == ids and all(c["holds"] in (True, False, "partly") for c in claims)
    assert (venv.work / "claims" / "report.md").read_text().startswith("# hessviz")
    assert "skipped" not in out.stdout, out.stdout  # every model the claims need ships in the wheel
    figures = list((venv.work / "claims" / "figures").glob("*.html"))
    assert figures and (venv.work / "claims" / "figures" / "plotly.min.js").is_file()
    assert all('src="plotly.min.js"' in f.read_text() for f in figures[:3]), "figures must read offline"
    after = sorted(p.relative_to(site) for p in Path(site).rglob("*") if "__pycache__" not in p.parts)
    assert after == before, "reproduce wrote into the installed package"


def test_every_command_answers_from_the_install(venv):
    for command in ("", "compute", "verify", "spectrum", "models", "bench", "reproduce", "app", "lesson"):
        out = venv.hessviz(*([command] if command else []), "--help")
        assert out.returncode == 0 and "usage: hessviz" in out.stdout
    piped = _run(
        ["sh", "-c", f"{venv.bin / 'hessviz'} models | head -1"], cwd=venv.work
    )  # the reader closes the pipe after one line
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr
    app = venv.hessviz("app", check=False)
    assert app.returncode == 2 and "hessviz[app]" in app.stderr
    assert app.stderr.count("\n") == 1 and "Traceback" not in app.stderr


def test_hessviz_app_serves_every_page_from_the_install(venv, dist):
    """``pip install "hessviz[app]"``, then ``hessviz app`` in a folder with no ``.streamlit/``: every
    page draws its first chart (the Claims page its table) in Chromium, with no exception box."""
    from hessviz.app.registry import ALL_PAGES

    require_chromium()
    venv.pip(f"{dist['wheel']}[app]")
    srv = Server(
        command=[str(venv.bin / "hessviz"), "app"],
        cwd=venv.work,
        log="install_app.log",
        env={"HESSVIZ_PROFILE": "local"},
    )
    try:
        srv.wait_healthy(timeout=120)
        sockets = subprocess.run(["ss", "-ltnH", f"sport = :{srv.port}"], capture_output=True, text=True)
        local = {line.split()[3].rsplit(":", 1)[0] for line in sockets.stdout.splitlines()}
        assert local == {"127.0.0.1"}, f"hessviz app listens on {local}, not on loopback alone"
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            for spec in ALL_PAGES:
                page.goto(f"{srv.base}/{spec.url_path}")
                wanted = "[data-testid=stDataFrame]" if spec.url_path == "claims" else ".js-plotly-plot"
                page.wait_for_selector(f"{wanted}, [data-testid=stException]", timeout=120_000)
                assert not page.query_selector("[data-testid=stException]"), spec.url_path
                assert page.query_selector(wanted), spec.url_path
    finally:
        srv.stop()
    assert "Traceback" not in srv.log_path.read_text(errors="replace")
