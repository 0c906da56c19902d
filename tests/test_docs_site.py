"""The documentation site builds with warnings as errors (``mkdocs build --strict``, mkdocs.yml): a
broken link or anchor, a page left out of the nav, a docstring mkdocstrings cannot read fails here, so
CI builds the site on every run. The two helpers under ``docs/hooks/`` are checked on their own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "docs" / "hooks"


def hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module, strictly."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        if os.environ.get("CI"):
            pytest.fail("the docs site needs the `docs` extra, which the `test` extra pulls")
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about MkDocs 2.0
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)
    return out


def test_the_site_builds_strictly_with_every_page(site):
    pages = sorted(
        p.relative_to(ROOT / "docs").with_suffix("").as_posix() for p in (ROOT / "docs").rglob("*.md")
    )
    for page in pages:
        html = site / ("index.html" if page == "index" else f"{page}/index.html")
        assert html.is_file(), f"docs/{page}.md was not built"


def test_api_pages_are_generated_from_the_docstrings(site):
    api = {
        name: (site / "api" / name / "index.html").read_text()
        for name in ("hessviz", "matfree", "pretrained", "whole")
    }
    entries = {
        "hessviz": ("hessviz.hessian", "hessviz.BlockConfig", "hessviz.load_model"),
        "matfree": ("hessviz.matfree.top_eigenvalues", "hessviz.matfree.density"),
        "pretrained": ("hessviz.pretrained.load_layer", "hessviz.pretrained.layer_inputs"),
        "whole": ("hessviz.whole.model_hessian", "hessviz.whole.table.tensor_table"),
    }
    for page, anchors in entries.items():
        for anchor in anchors:
            assert f'id="{anchor}"' in api[page], f"api/{page}: no entry for {anchor}"
    for page, html in api.items():  # roles and doctests rendered as code, not as raw RST or quotes
        assert ":func:`" not in html and ":class:`" not in html and "<blockquote>" not in html, page


def test_pictures_outside_docs_are_copied_into_the_site(site):
    assert (site / "_repo" / "assets" / "screenshots" / "hessian_map.png").is_file()
    assert 'src="_repo/assets/screenshots/hessian_map.png"' in (site / "index.html").read_text()


def test_repo_links_keep_a_broken_link_broken(tmp_path):
    """A link to a repository file is rewritten only when the file exists, so --strict still
    reports a link to a file that was moved or removed."""
    rewrite = hook("repo_links").rewrite
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "RESULTS.md").write_text("x")
    (tmp_path / "shot.png").write_bytes(b"png")
    text = (
        "[`benchmarks/RESULTS.md`](../benchmarks/RESULTS.md) [gone](../benchmarks/GONE.md) ![s](../shot.png)"
    )
    out = rewrite(text, tmp_path)
    assert out == "`benchmarks/RESULTS.md` [gone](../benchmarks/GONE.md) ![s](_repo/shot.png)"
    linked = rewrite("[results](../benchmarks/RESULTS.md#top)", tmp_path, "https://github.com/o/r")
    assert linked == "[results](https://github.com/o/r/blob/HEAD/benchmarks/RESULTS.md#top)"
    assert rewrite("[up](../../etc/passwd)", tmp_path / "benchmarks") == "[up](../../etc/passwd)"


def test_docstrings_become_markdown_once():
    markdown = hook("griffe_rst").markdown
    text = "Uses :func:`load_model` and :class:`~hessviz.Model`.\n\n>>> 1 + 1\n2\n\nAfter."
    out = markdown(text)
    assert "`load_model`" in out and "`hessviz.Model`" in out and ":func:" not in out
    assert "```pycon\n>>> 1 + 1\n2\n```" in out
    assert markdown(out) == out
