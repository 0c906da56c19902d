"""Imports run one way: core -> experiments -> app (and the command line).

Core (``hessviz/*.py`` and its packages but ``experiments`` and ``app``) imports neither the
claims nor the app; nothing outside ``hessviz/app`` imports the app or Streamlit. Imports
inside functions count too: the check walks the whole syntax tree.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "hessviz"
FRONT_ENDS = {"cli.py", "__main__.py"}
"""Entry points above every layer: they may import the claims (``hessviz reproduce``)."""


def imported(path: pathlib.Path) -> set[str]:
    """Every module name ``path`` imports (relative imports resolved against ``hessviz``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = "hessviz." + base
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def layer(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG)
    if rel.parts[0] in ("app", "experiments"):
        return rel.parts[0]
    return "front" if rel.name in FRONT_ENDS and len(rel.parts) == 1 else "core"


FORBIDDEN = {
    "core": ("hessviz.experiments", "hessviz.app", "streamlit"),
    "experiments": ("hessviz.app", "streamlit"),
    "front": ("hessviz.app", "streamlit"),
    "app": (),
}
ALLOWED = {"cli.py": {"hessviz.app", "hessviz.app.lesson_page"}}
"""The one named arrow from the command line into the app: ``hessviz lesson`` writes a page of an app
view with the app's own figures (imported inside the command's function; ``tests/test_imports.py``)."""
MODULES = sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PKG)) for p in MODULES])
def test_imports_run_one_way(path):
    names = imported(path) - ALLOWED.get(str(path.relative_to(PKG)), set())
    bad = {n for n in names for f in FORBIDDEN[layer(path)] if n == f or n.startswith(f + ".")}
    assert not bad, f"{path.relative_to(PKG)} ({layer(path)}) imports {sorted(bad)}"


def test_the_check_sees_imports():
    assert "hessviz.experiments" in imported(PKG / "cli.py")        # inside a function
    assert layer(PKG / "sweeps.py") == "core" and layer(PKG / "plots" / "curves.py") == "core"
