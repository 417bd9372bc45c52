"""The package's layering, read from the import statements of its source (``ast``, nothing imported):

* no model imports another model, the CLI or the benchmark harness;
* ``data`` and ``metrics`` import no model (nor the model registry, the CLI or the harness);
* the model registry ``models.py`` does not import the benchmark harness, nor name a class there;
* no module imports itself through others: the import graph has no cycle.

Every ``import`` counts, module-level or inside a function, absolute or relative, and so does an
``importlib.import_module("...")`` (or ``__import__``) of a string literal; the checks follow the
package-internal import graph to its closure.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import bayesmlc
from bayesmlc import models

PACKAGE_ROOT = Path(bayesmlc.__file__).parent

#: model families: a module belongs to the first family whose name it starts with
MODEL_FAMILIES = ("bayesmlc.linear", "bayesmlc.bmls", "bayesmlc.bnmc", "bayesmlc.gp", "bayesmlc.baselines")
#: estimators built on any model (they take one as a parameter, so import none)
WRAPPERS = ("bayesmlc.ensemble", "bayesmlc.calibration")
CLI = ("bayesmlc.cli", "bayesmlc.__main__", "bayesmlc.bench")


def _within(module: str, prefixes) -> str | None:
    """The prefix (a module or package name) that ``module`` is or lies inside, or None."""
    for prefix in prefixes:
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_string(node: ast.AST, package: str) -> str | None:
    """The module named by a call ``importlib.import_module("name"[, "package"])``, ``import_module(...)``
    or ``__import__("name")`` with a string literal (a relative name resolved against its literal
    package, else against ``package``); None for any other node."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return None
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    if name not in ("import_module", "__import__"):
        return None
    target = node.args[0].value
    if name == "import_module" and target.startswith("."):
        anchor = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else package
        level = len(target) - len(target.lstrip("."))
        base = anchor.split(".")
        target = ".".join(base[: len(base) - (level - 1)] + ([target.lstrip(".")] if target.lstrip(".") else []))
    return target


def _imports(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of the ``bayesmlc`` modules that ``source`` (the text of ``module``) imports.
    ``from X import name`` counts X and, in case ``name`` is a submodule, ``X.name``; an
    ``import_module`` of a string literal counts that module (:func:`_imported_string`); the package
    ``bayesmlc`` itself is not counted (every submodule's import runs it first)."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        literal = _imported_string(node, package)
        if literal is not None:
            found.add(literal)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    # the packages that hold ``module`` are imported before it anyway: ``from .. import x`` adds only x
    ancestors = {".".join(module.split(".")[:n]) for n in range(1, module.count(".") + 2)}
    return {name for name in found if name.startswith("bayesmlc.") and name not in ancestors}


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (names that are not modules, e.g. classes, dropped)."""
    sources = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        sources[_module_name(path)] = (path.read_text(encoding="utf-8"), path.name == "__init__.py")
    return {module: _imports(text, module, is_package) & sources.keys()
            for module, (text, is_package) in sources.items()}


def _closure(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module reachable from ``start``, with one import chain that reaches it."""
    chains = {start: [start]}
    frontier = [start]
    while frontier:
        module = frontier.pop()
        for target in sorted(graph.get(module, ())):
            if target not in chains:
                chains[target] = chains[module] + [target]
                frontier.append(target)
    return chains


def _violations(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module in sorted(graph):
        chains = _closure(graph, module)
        reached = {target: chain for target, chain in chains.items() if target != module}
        family = _within(module, MODEL_FAMILIES)
        if family is not None or _within(module, WRAPPERS):
            for target, chain in reached.items():
                other = _within(target, MODEL_FAMILIES)
                if (other is not None and other != family) or _within(target, CLI):
                    problems.append(" -> ".join(chain))
        if _within(module, ("bayesmlc.data", "bayesmlc.datasets", "bayesmlc.metrics")):
            for target, chain in reached.items():
                if _within(target, MODEL_FAMILIES + WRAPPERS + CLI + ("bayesmlc.models",)):
                    problems.append(" -> ".join(chain))
        if module == "bayesmlc.models":
            problems.extend(" -> ".join(chain) for target, chain in reached.items() if _within(target, CLI))
    return problems


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as the modules along it, the first repeated at the end, or None
    (a depth-first search that keeps the path it is on)."""
    done, on_path, path = set(), set(), []

    def visit(module):
        path.append(module)
        on_path.add(module)
        for target in sorted(graph.get(module, ())):
            if target in on_path:
                return path[path.index(target):] + [target]
            if target not in done:
                found = visit(target)
                if found:
                    return found
        on_path.discard(path.pop())
        done.add(module)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start)
            if found:
                return found
    return None


@pytest.fixture(scope="module")
def graph():
    return _import_graph()


def test_the_package_keeps_its_layers(graph):
    # the reader sees the package: the families, the harness and the registry are all there
    assert {"bayesmlc.gp.model", "bayesmlc.bnmc.model", "bayesmlc.bench.runner", "bayesmlc.models"} <= graph.keys()
    assert "bayesmlc.gp.model" in _closure(graph, "bayesmlc.gp")  # the package re-exports its model
    assert _violations(graph) == []


@pytest.mark.parametrize("module, source, culprit", [
    ("bayesmlc.bnmc.model", "from ..gp import MLGPF\n", "bayesmlc.gp"),
    ("bayesmlc.linear", "def f():\n    from bayesmlc.cli import main\n", "bayesmlc.cli"),
    ("bayesmlc.metrics.ranking", "from .. import linear\n", "bayesmlc.linear"),
    ("bayesmlc.data.io", "import bayesmlc.models\n", "bayesmlc.models"),
    ("bayesmlc.models", "from .bench.runner import run\n", "bayesmlc.bench.runner"),
    # through a helper: data -> utils -> bmls
    ("bayesmlc.utils", "from .bmls.model import BMLS\n", "bayesmlc.bmls.model"),
])
def test_a_broken_layer_is_reported(graph, module, source, culprit):
    graph = dict(graph)
    is_package = (PACKAGE_ROOT / module.split(".", 1)[1].replace(".", "/") / "__init__.py").is_file()
    graph[module] = graph[module] | (_imports(source, module, is_package) & graph.keys())
    problems = _violations(graph)
    assert problems and all(culprit in problem for problem in problems), problems


def test_the_import_graph_has_no_cycle(graph):
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("module, source, cycle", [
    # base -> presets -> ensemble -> base, as it was, through an import inside a function
    ("bayesmlc.base", "def preset():\n    from .presets import build_preset\n",
     ["bayesmlc.base", "bayesmlc.presets", "bayesmlc.ensemble", "bayesmlc.base"]),
    # a string handed to importlib, relative to the module's package
    ("bayesmlc.gp.history", "import importlib\nimportlib.import_module('.training', 'bayesmlc.gp')\n",
     ["bayesmlc.gp.history", "bayesmlc.gp.training", "bayesmlc.gp.history"]),
    ("bayesmlc.metrics.ranking", "def f():\n    return __import__('bayesmlc.metrics.scorers')\n",
     ["bayesmlc.metrics.ranking", "bayesmlc.metrics.scorers", "bayesmlc.metrics.ranking"]),
])
def test_an_import_cycle_is_found_and_printed(graph, module, source, cycle):
    graph = dict(graph)
    graph[module] = graph[module] | (_imports(source, module, False) & graph.keys())
    # the cycle's modules only: the injected import closes it through the package's real imports
    assert _cycle({name: graph[name] & set(cycle) for name in cycle}) == cycle


def test_the_cycle_search_finds_a_cycle_far_from_its_start_and_none_in_a_tree():
    tree = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set(), "e": {"a"}}
    assert _cycle(tree) is None
    assert _cycle({**tree, "d": {"f"}, "f": {"g"}, "g": {"d"}}) == ["d", "f", "g", "d"]
    assert _cycle({"x": {"x"}}) == ["x", "x"]


def test_a_string_import_is_read():
    source = "import importlib\nm = importlib.import_module('bayesmlc.bmls.model')\nn = import_module('..x', 'bayesmlc.a.b')\n"
    assert _imports(source, "bayesmlc.linear", False) == {"bayesmlc.bmls.model", "bayesmlc.a.x"}
    assert _imports("importlib.import_module(name)\n", "bayesmlc.linear", False) == set()


def test_the_model_registry_names_no_class_in_the_harness():
    for path in list(models.MODEL_CLASSES.values()) + list(models.LOADABLE_CLASSES.values()):
        assert not _within(path.partition(":")[0], CLI), path
