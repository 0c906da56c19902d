"""The package's own files agree with each other (fast; ``tests/test_install.py`` installs the wheel).

- ``import hessviz`` loads neither Streamlit, pandas, pyarrow nor Plotly; Plotly loads with a figure.
- One version, one copy of the app's settings (the checkout's ``.streamlit/config.toml`` is a link to
  the package's), data read through :mod:`hessviz.resources`, never through ``__file__``'s parents.
- ``requirements.txt`` (Community Cloud) and the ``Dockerfile`` install the package, not a copy of it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from hessviz.app import serve

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _loaded_after(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    mods = json.loads(out.stdout.strip().splitlines()[-1])
    return sorted(
        {m.split(".")[0] for m in mods} & {"streamlit", "pandas", "pyarrow", "plotly", "transformers"}
    )


def test_import_hessviz_loads_no_app_stack_and_no_plotly():
    assert _loaded_after("import hessviz, hessviz.cli, hessviz.matfree, hessviz.whole") == []


def test_the_lesson_builder_needs_no_streamlit_and_plotly_loads_with_a_figure():
    assert _loaded_after("import hessviz.app.lesson_page") == ["plotly"]
    drawn = (
        "import hessviz.matfree as m\nm.spectrum_figure({'term': 'full', 'P': 2, 'top': {'values': [1.0]}})"
    )
    assert _loaded_after(drawn) == ["plotly"]


def test_one_version():
    import hessviz

    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hessviz.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", hessviz.__version__)


def test_the_app_settings_have_one_copy():
    link = ROOT / ".streamlit" / "config.toml"
    assert link.is_symlink() and link.resolve() == serve.CONFIG
    settings = serve.settings()
    assert settings["server.headless"] is True and settings["server.address"] == "127.0.0.1"


def test_hessviz_app_passes_streamlit_options_through():
    argv = serve.streamlit_argv(["--server.port", "8600", "--server.address=0.0.0.0"])
    assert argv[:3] == ["streamlit", "run", str(serve.SCRIPT)] and serve.SCRIPT.is_file()
    assert argv[-3:] == ["--server.port", "8600", "--server.address=0.0.0.0"]
    assert not [a for a in argv[3:-3] if a.startswith(("--server.port", "--server.address"))]
    assert "--runner.postScriptGC=false" in argv and "--client.showSidebarNavigation=false" in argv


def test_no_module_finds_its_data_through_its_own_path():
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "hessviz").rglob("*.py")
        if re.search(r"parents\[\d\]\s*/\s*\"assets\"|\"assets\"\s*/", p.read_text())
    ]
    assert offenders == []


def test_requirements_txt_agrees_with_pyproject():
    """Community Cloud installs requirements.txt: torch's CPU build, then this repository as a package
    with its app extra, so every other requirement is pyproject.toml's own."""
    lines = [
        line.split("#")[0].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    assert lines == ["--extra-index-url https://download.pytorch.org/whl/cpu", "torch==2.13.0", ".[app]"]
    torch_range = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch"))
    low, high = re.fullmatch(r"torch>=([\d.]+),<(\d+)", torch_range).groups()
    pinned = tuple(int(x) for x in lines[1].split("==")[1].split("."))
    assert tuple(int(x) for x in low.split(".")) <= pinned[: len(low.split("."))] and pinned[0] < int(high)
    assert {"streamlit", "pandas", "pyarrow"} <= {
        re.split(r"[<>=\[ ]", d)[0] for d in PYPROJECT["project"]["optional-dependencies"]["app"]
    }


def test_the_dockerfile_installs_the_wheel_and_runs_hessviz_app():
    docker = (ROOT / "Dockerfile").read_text()
    assert "python -m build --wheel" in docker and "[app]" in docker
    assert 'CMD ["hessviz", "app", "--server.address=0.0.0.0"' in docker
    assert "USER hessviz" in docker and "COPY hessviz" not in docker
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    for needed in ("hessviz", "pyproject.toml", "MANIFEST.in", "LICENSE"):
        assert needed not in ignored
    assert "docs" in ignored and "!docs/package.md" in ignored  # the readme the build reads
    assert PYPROJECT["project"]["readme"]["file"] == "docs/package.md"


def test_the_profile_follows_the_served_address_and_a_public_local_is_logged(caplog):
    """Unset, the profile is ``local`` on loopback only; any other address (Streamlit's default binds
    every interface) gets ``hosted``; ``HESSVIZ_PROFILE=local`` there is honoured, with a warning."""
    from hessviz.app import profiles

    assert [profiles.profile_name({}, a) for a in ("127.0.0.1", "::1", "localhost")] == ["local"] * 3
    public = (None, "", "0.0.0.0", "::", "192.168.1.4")
    assert [profiles.profile_name({}, a) for a in public] == ["hosted"] * len(public)
    with caplog.at_level("WARNING", logger="hessviz.app"):
        assert profiles.profile_name({"HESSVIZ_PROFILE": "local"}, "0.0.0.0") == "local"
    assert "HESSVIZ_PROFILE=local on 0.0.0.0" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hessviz.app"):
        assert profiles.profile_name({"HESSVIZ_PROFILE": "local"}, "127.0.0.1") == "local"
    assert caplog.text == ""
    assert profiles.served_address() == "127.0.0.1"  # no server in this process


def test_the_lesson_page_templates_ship_as_package_data():
    """The lesson page's HTML, CSS and JavaScript are files of ``hessviz/app/templates/``, which
    ``MANIFEST.in`` grafts into the sdist and the wheel, read through :mod:`importlib.resources`."""
    from hessviz.app import lesson_page

    shipped = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert "graft hessviz/app/templates" in shipped
    for name in ("lesson.html", "lesson.css", "lesson.js"):
        assert (ROOT / "hessviz" / "app" / "templates" / name).is_file()
        assert lesson_page.template_text(name).strip()
    assert "{css}{toolbar}" in lesson_page.template_text("lesson.html")
