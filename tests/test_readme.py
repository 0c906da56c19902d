"""The README stays true: two set-up commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


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
