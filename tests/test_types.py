"""The engine layer type-checks: ``mypy`` (the ``[test]`` extra; settings in ``pyproject.toml``) on
``hessviz/products`` (and the spectral modules of ``hessviz/matfree``), where every engine, the sweep and the
:class:`~hessviz.products.hessian_operator.Products`
interface live, and on the dense engines (:class:`~hessviz.dense.engine.DenseEngine` and its three final
subclasses) and the result that holds them. A class that overrides a ``@final`` method of its parent, an
engine that forgets an argument of ``_matmat`` or a sweep that returns the wrong type fails here."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = (
    "hessviz/products",
    "hessviz/matfree/spectral.py",
    "hessviz/matfree/spectra.py",
    "hessviz/dense/engine.py",  # the dense engines: the formed terms as operators
    "hessviz/dense/assembly.py",
    "hessviz/dense/stack.py",
    "hessviz/dense/autograd.py",
    "hessviz/result.py",
)


def test_the_engine_packages_type_check():
    pytest.importorskip("mypy", reason="mypy is in the [test] extra: pip install -e '.[test]'")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", *PACKAGES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success" in run.stdout
