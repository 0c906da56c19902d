"""Imports run one way: no circles among the modules of ``hessviz`` (type-checking imports included),
none among its packages, and no arrow back up through the layers, nor from the package to the checkout's
``benchmarks/`` scripts.

The graph is read from the source (``ast``), not by importing: an edge ``a -> b`` for every
``import``/``from … import`` of a ``hessviz`` module in ``a`` at any level of the module body
(inside functions too), relative imports resolved against ``a``'s package.

The layers, bottom to top (:data:`LAYERS`; a *unit* is a subpackage, or a module of the root):

1. **base**: ``errors``, ``resources`` (the package's data) and ``runtime`` (the memory guard, huge-page
   buffers, the worker pool);
2. **core**, the math: ``ops`` (both faces of every operation, their Kronecker factors and pieces),
   ``block`` (the configuration, placements, weights, inputs, term names), ``losses`` and the autograd
   ``reference``;
3. **products**: ``products`` (the tape, the one forward pass; the product engines; the operator type);
4. **dense**: ``dense`` (the chain, the fold of the tape's nodes, the dense terms, stacks);
5. **api**: ``api`` (``hv.hessian``, …), ``result`` and ``matfree`` (Lanczos, SLQ, traces, spectra);
6. **readers**: ``pretrained`` and ``whole`` (real models, on the api);
7. **facade**: the root ``hessviz/__init__.py`` (``import hessviz as hv``): nothing below imports it;
8. **tools** on the public API: ``laws`` (sweeps and fits), ``checks`` (cost and verify), ``plots``;
9. **experiments**: the claims;
10. **bench**: the suites of ``hessviz bench`` (closed form against the strongest baselines);
11. **interfaces**: ``app``, ``cli`` (and its ``commands``), ``__main__``.

The checkout's ``benchmarks/`` scripts stand above them all, outside the package. A unit imports only
units of its own layer or below; arrows inside a layer are allowed where they make no circle.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "hessviz"


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The syntax tree of one source file, parsed once for every check of this module."""
    return ast.parse(path.read_text())


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    def owner(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    edges = {}
    for name, path in mods.items():
        out: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                out |= {owner(a.name) for a in node.names if a.name.startswith("hessviz")}
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(node, package)
                if module.startswith("hessviz"):
                    named = [f"{module}.{a.name}" for a in node.names]
                    out |= {n if n in mods else owner(module) for n in named}
        edges[name] = out - {name, ""}
    return edges


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from … import`` names, a relative one (``from .x import y``) resolved in ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while comp[-1:] != [v]:
                comp.append(stack.pop())
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    assert _cycles(_edges(_modules())) == []


# ----------------------------------------------------------------------------- layers

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("hessviz.errors", "hessviz.resources", "hessviz.runtime")),
    ("core", ("hessviz.ops", "hessviz.block", "hessviz.losses", "hessviz.reference")),
    ("products", ("hessviz.products",)),
    ("dense", ("hessviz.dense",)),
    ("api", ("hessviz.api", "hessviz.result", "hessviz.matfree")),
    ("readers", ("hessviz.pretrained", "hessviz.whole")),
    ("facade", ("hessviz",)),
    ("tools", ("hessviz.laws", "hessviz.checks", "hessviz.plots")),
    ("experiments", ("hessviz.experiments",)),
    ("bench", ("hessviz.bench",)),
    ("interfaces", ("hessviz.app", "hessviz.cli", "hessviz.commands", "hessviz.__main__")),
)
"""The layers bottom to top (the module docstring says what each holds); every unit is in one."""

TOP = (
    "hessviz.app",
    "hessviz.experiments",
    "hessviz.bench",
    "hessviz.cli",
    "hessviz.commands",
    "hessviz.__main__",
)
"""Nothing below these imports them: the app, the claims, the benchmarks and the command line use the
library."""


def _unit(module: str) -> str:
    """The unit of ``module``: its subpackage (``hessviz.ops.attention`` -> ``hessviz.ops``), or the
    root module itself (``hessviz.api``; ``hessviz`` for the root's ``__init__``)."""
    parts = module.split(".")
    if len(parts) > 1 and (ROOT / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def _unit_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` collapsed to units, arrows inside a unit dropped."""
    out: dict[str, set[str]] = {}
    for a, targets in edges.items():
        u = _unit(a)
        out.setdefault(u, set()).update(_unit(b) for b in targets)
        out[u].discard(u)
    return out


def _upward(edges: dict[str, set[str]], layers=LAYERS) -> dict[str, list[str]]:
    """``unit -> [units of a higher layer it imports]`` for every unit with such an arrow."""
    level = {u: i for i, (_, units) in enumerate(layers) for u in units}
    return {
        a: sorted(b for b in targets if level[b] > level[a])
        for a, targets in sorted(edges.items())
        if any(level[b] > level[a] for b in targets)
    }


def test_every_unit_has_one_layer():
    units = [u for _, us in LAYERS for u in us]
    assert len(units) == len(set(units)), "a unit named in two layers"
    assert {_unit(m) for m in _modules()} == set(units)


def test_no_package_circles():
    """Collapsed to units (``hessviz.ops`` as one node), the graph has no circle."""
    assert _cycles(_unit_edges(_edges(_modules()))) == []


def test_no_arrow_runs_up_a_layer():
    edges = _unit_edges(_edges(_modules()))
    assert _upward(edges) == {}


def test_the_layer_checks_see_an_arrow_up():
    """The rules above are not vacuous: a made-up arrow from the spectral tools to the api, or from a reader
    to the facade, is found; the collapse keeps a package-level circle that no module-level one shows."""
    layers = (("low", ("hessviz.matfree",)), ("high", ("hessviz.api", "hessviz")))
    assert _upward({"hessviz.matfree": {"hessviz.api"}, "hessviz.api": {"hessviz.matfree"}}, layers) == {
        "hessviz.matfree": ["hessviz.api"]
    }
    modules = {"hessviz.ops.linear": {"hessviz.dense.chain"}, "hessviz.dense.chain": {"hessviz.ops.base"}}
    assert _cycles(modules) == []
    assert _cycles(_unit_edges(modules)) == [["hessviz.dense", "hessviz.ops"]]
    assert _unit("hessviz.pretrained.explore") == "hessviz.pretrained"
    assert _unit("hessviz") == "hessviz"
    edges = _unit_edges(_edges(_modules()))
    assert "hessviz.api" in edges["hessviz.pretrained"]  # a reader stands on the api, one layer down


def _imported_roots(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports, at any level of its body."""
    out = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


APP_COMMANDS = {"hessviz.cli": {"hessviz.app.lesson_page", "hessviz.app.serve", "hessviz.app.budget_bench"}}
"""The three arrows from the command line into the app, each imported inside its command's function:
``hessviz lesson`` makes a page of an app view, with the app's own settling and figures,
``hessviz app`` serves the app, and ``hessviz bench --suite budget`` times the app's views against
its budget."""


def test_the_library_never_imports_the_app_or_streamlit():
    mods = _modules()
    edges = {m: out - APP_COMMANDS.get(m, set()) for m, out in _edges(mods).items()}
    outside = {m: p for m, p in mods.items() if not m.startswith("hessviz.app")}
    assert not {
        m: sorted(t for t in edges[m] if t.startswith("hessviz.app"))
        for m in outside
        if any(t.startswith("hessviz.app") for t in edges[m])
    }
    assert not [m for m, p in outside.items() if "streamlit" in _imported_roots(p)]


def _benchmark_imports(tree: ast.AST) -> set[str]:
    """Where ``tree`` imports the ``benchmarks`` package: the names of the functions that do, or
    ``<module>`` for an import outside every function."""
    found: set[str] = set()

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            where = node.name
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else []
        )
        if any(n.split(".")[0] == "benchmarks" for n in names):
            found.add(where)
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(tree, "<module>")
    return found


def test_the_package_never_imports_the_checkout_benchmarks():
    """The checkout's ``benchmarks/`` scripts import the package to time it; the package never imports
    them (an installed hessviz has no ``benchmarks/``: ``hessviz bench`` runs :mod:`hessviz.bench`)."""
    hits = {m: _benchmark_imports(ast.parse(p.read_text())) for m, p in _modules().items()}
    assert {m: w for m, w in hits.items() if w} == {}


def test_the_benchmark_check_sees_an_import():
    tree = ast.parse(
        "import benchmarks.dense\ndef f():\n    from benchmarks import matfree\n"
        "def g():\n    import hessviz.benchmarks_like\n"
    )
    assert _benchmark_imports(tree) == {"<module>", "f"}
    bench = ROOT.parent / "benchmarks"
    assert any("hessviz" in _imported_roots(p) for p in bench.glob("*.py"))  # the arrow runs this way


def test_no_arrow_runs_back_up():
    edges = _edges(_modules())
    up = {
        m: sorted(t for t in out if t.startswith(TOP))
        for m, out in edges.items()
        if not m.startswith(TOP) and any(t.startswith(TOP) for t in out)
    }
    assert up == {}


def test_the_checks_see_an_arrow_up():
    """The rules above are not vacuous: the app imports the library, the library base has members, an
    import inside a function counts (``hessviz reproduce`` imports the claims in its command), and a
    relative import is resolved."""
    edges = _edges(_modules())
    assert any(t.startswith("hessviz.checks.cost") for t in edges["hessviz.app.budget"])
    assert any(t.startswith("hessviz.experiments") for t in edges["hessviz.cli"])
    relative = ast.parse("from ..kron import Factored\nfrom . import base").body
    assert [_absolute(n, "hessviz.ops") for n in relative] == ["hessviz.kron", "hessviz.ops"]


# ----------------------------------------------------------------------------- page names


def _page_names() -> set[str]:
    """The url paths of :mod:`hessviz.app.registry`'s pages and :data:`hessviz.app.budget.KINDS`,
    read from the source (importing the app loads Streamlit, plotly and pandas)."""
    names = set()
    for node in ast.walk(_tree(ROOT / "app" / "registry.py")):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "PageSpec":
            names.add(node.args[3].value)
    for node in _tree(ROOT / "app" / "budget.py").body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["KINDS"]:
            names |= {e.value for e in node.value.elts}
    return names


def _compared_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, s)`` of every string constant compared against (``==``, ``in``, ``match``), the
    way a module branches on a name."""
    found = []
    for node in ast.walk(tree):
        sides = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.match_case):
            sides = [node.pattern]
        for side in sides:
            for sub in ast.walk(side):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    found.append((sub.lineno, sub.value))
    return found


def test_no_module_outside_the_app_branches_on_a_page_name():
    """The pages' names and the budget's kinds of view are the app's: the library's cost estimates
    are per computation (``hessviz/checks/cost.py`` holds none of them at all), and no module outside
    ``hessviz/app/`` compares a value with one (claim ids and CLI commands that share a word with a
    page are names of their own and are not compared with)."""
    names = _page_names()
    assert {"map", "learn", "heterogeneity", "spectrum"} <= names
    cost = _tree(ROOT / "checks" / "cost.py")
    assert not [n.value for n in ast.walk(cost) if isinstance(n, ast.Constant) and n.value in names]
    hits = {}
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).parts[0] == "app":
            continue
        found = [(line, s) for line, s in _compared_strings(_tree(path)) if s in names]
        if found:
            hits[str(path.relative_to(ROOT))] = found
    assert hits == {}


def test_the_page_name_check_sees_a_branch():
    tree = ast.parse(
        'def cost(kind):\n    if kind == "map":\n        return 1\n    return kind in ("learn",)\n'
    )
    assert [s for _, s in _compared_strings(tree)] == ["map", "learn"]
