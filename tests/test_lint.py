"""The code base stays clean: ruff (configured in pyproject.toml) finds nothing, and every file is
already as ``ruff format`` writes it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))


@pytest.mark.parametrize(
    "command",
    [["check", "--no-cache", "."], ["format", "--check", "--no-cache", "."]],
    ids=["check", "format"],
)
def test_ruff_finds_nothing(command):
    run = subprocess.run([RUFF, *command], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
