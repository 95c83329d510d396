"""Imports point down: each package imports only its own layer and those below, with no cycles, and the
pure packages load without PySpark or a web framework.

The source of every module is scanned (its AST, so an import inside a function counts as much as one
at the top), the layers are checked against the map in ``docs/architecture.md``, the checker is shown
to catch each kind of crossing on a planted package tree, and the pure modules are imported in a fresh
interpreter.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import irbis

ROOT = Path(irbis.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"

#: The layers, from the ground up: a module may import its own layer and those below it, never one above.
#: A module belongs to the longest package of this table that holds it (``irbis`` alone is the package's
#: face, which re-exports the public names of every layer).
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["irbis.errors", "irbis.refs"]),
    ("extras", ["irbis.extras"]),
    ("ground", ["irbis.models"]),
    ("kernels", ["irbis.kernels"]),
    ("explain", ["irbis.explain"]),
    ("training", ["irbis.train"]),
    ("spark", ["irbis.spark"]),
    ("stages", ["irbis.ml"]),
    ("serving", ["irbis.serving"]),
    ("apps", ["irbis.demo", "irbis.cli", "irbis"]),
]
PURE_LAYERS = ("base", "ground", "kernels", "explain", "training")
#: Third-party imports a pure module may not make, at any depth of its code.
FORBIDDEN = ["pyspark", "flask", "fastapi", "starlette", "py4j", "uvicorn", "aiohttp", "werkzeug"]


# -- the checker ---------------------------------------------------------------------------------------
def module_files(package_dir: Path) -> dict[str, Path]:
    """Every module of the package in ``package_dir``, by dotted name (a package by its ``__init__``)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_names(tree: ast.AST, module: str, is_package: bool = False) -> list[str]:
    """Every name an AST imports, wherever the import statement is (relative imports resolved): for
    ``from a import b`` both ``a`` and ``a.b``."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module if is_package else module.rsplit(".", 1)[0]
                parent = parent.rsplit(".", node.level - 1)[0] if node.level > 1 else parent
                base = f"{parent}.{base}" if base else parent
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (the longest module each imported name names)."""
    files = module_files(package_dir)
    graph = {}
    for module, path in files.items():
        found = set()
        for name in imported_names(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            parts = name.split(".")
            known = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in files), None)
            if known is not None and known != module:
                found.add(known)
        graph[module] = found
    return graph


def layer_of(module: str, layers: list[tuple[str, list[str]]] = LAYERS) -> tuple[int, str] | None:
    """The (index, name) of the layer whose longest package holds ``module``; None when none does."""
    best = None
    for index, (name, packages) in enumerate(layers):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and (best is None or len(package) > best[0]):
                best = (len(package), index, name)
    return None if best is None else best[1:]


def upward_imports(graph: dict[str, set[str]], layers: list[tuple[str, list[str]]] = LAYERS) -> list[str]:
    """``a (layer) -> b (layer)`` for every import of a module of a higher layer."""
    found = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module, layers)
        for target in sorted(targets):
            theirs = layer_of(target, layers)
            if mine and theirs and theirs[0] > mine[0]:
                found.append(f"{module} ({mine[1]}) -> {target} ({theirs[1]})")
    return found


def sibling_imports(graph: dict[str, set[str]], layers: list[tuple[str, list[str]]] = LAYERS) -> list[str]:
    """``a -> b`` for every import between two packages that share a layer below the apps (siblings know
    nothing of each other; the apps are one program: the command line runs the demo)."""
    def package(module: str, packages: list[str]) -> str | None:
        held = [p for p in packages if module == p or module.startswith(p + ".")]
        return max(held, key=len) if held else None

    found = []
    for name, siblings in layers:
        if name == "apps":
            continue
        for module, targets in sorted(graph.items()):
            mine = package(module, siblings)
            found += [f"{module} -> {t}" for t in sorted(targets)
                      if mine and package(t, siblings) not in (None, mine)]
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other in a loop (strongly connected components of more than one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def forbidden_imports(tree: ast.AST, module: str) -> list[str]:
    return sorted({n for n in imported_names(tree, module) for bad in FORBIDDEN if n == bad or n.startswith(bad + ".")})


# -- the code as it is ---------------------------------------------------------------------------------
GRAPH = import_graph(ROOT)


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(GRAPH) == [], "imports must point down (see docs/architecture.md)"


def test_packages_of_one_layer_do_not_import_each_other():
    assert sibling_imports(GRAPH) == [], "packages that share a layer are siblings (see docs/architecture.md)"


def test_no_modules_import_each_other_in_a_loop():
    assert import_cycles(GRAPH) == [], "modules that import each other, lazily or not, are one thing or a crossing"


def test_every_module_has_a_layer():
    assert [m for m in GRAPH if layer_of(m) is None] == []


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if layer_of(m)[1] in PURE_LAYERS))
def test_pure_module_source_imports_no_spark_or_web_framework(module):
    path = module_files(ROOT)[module]
    bad = forbidden_imports(ast.parse(path.read_text()), module)
    assert not bad, f"{module} ({path.name}) imports {bad}; pure packages must not import Spark or web frameworks"


# -- the checker catches each crossing, planted in a package tree of its own ---------------------------
def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [root / "irbis", *(p for p in (root / "irbis").rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return root / "irbis"


CLEAN = {
    "irbis/errors.py": "class ParamValueError(ValueError):\n    pass\n",
    "irbis/models/preprocess.py": "COLOR_FORMATS = {'RGB': 3}\n",
    "irbis/kernels/image/ops.py": "from irbis.models.preprocess import COLOR_FORMATS\n",
    "irbis/kernels/image/network_input.py": "def f():\n    from .ops import COLOR_FORMATS\n",
    "irbis/ml/params.py": "from irbis.errors import ParamValueError\n",
    "irbis/spark/resources.py": "from irbis.errors import ParamValueError\n",
    "irbis/train/ps/__init__.py": "DONE = 2\n",
    "irbis/train/ps/driver.py": "def served(spec, strategy):\n    return strategy\n",
    "irbis/train/strategies/__init__.py": "from irbis.train.strategies.downpour import Downpour\n",
    "irbis/train/strategies/downpour.py": "from irbis.train.ps import DONE\nclass Downpour: pass\n",
    "irbis/serving/predictor.py": "from irbis.ml import params\n",
    "irbis/serving/spark_predictor.py": "from irbis.serving.predictor import x\n",
}


def test_the_checker_finds_nothing_in_a_clean_tree(tmp_path):
    graph = import_graph(_plant(tmp_path, CLEAN))
    assert graph["irbis.kernels.image.network_input"] == {"irbis.kernels.image.ops"}
    assert upward_imports(graph) == [] and sibling_imports(graph) == [] and import_cycles(graph) == []


@pytest.mark.parametrize("planted,expected", [
    # the ground importing the image kernels, lazily, inside a function
    ({"irbis/models/preprocess.py": "def preprocess_rgb(image, spec):\n"
                                    "    from irbis.kernels.image.ops import resize\n"},
     "upward: irbis.models.preprocess (ground) -> irbis.kernels.image.ops (kernels)\n"
     "cycle: irbis.kernels.image.ops, irbis.models.preprocess"),
    # Spark glue importing an error from the stages' Params, lazily
    ({"irbis/spark/resources.py": "def check_device():\n    from irbis.ml.params import ParamValueError\n"},
     "upward: irbis.spark.resources (spark) -> irbis.ml.params (stages)"),
    # the same, relative and at the top
    ({"irbis/spark/resources.py": "from ..ml.params import ParamValueError\n"},
     "upward: irbis.spark.resources (spark) -> irbis.ml.params (stages)"),
    # the parameter servers asking the strategy registry, whose strategies import the parameter servers
    ({"irbis/train/ps/__init__.py": "DONE = 2\ndef start():\n    from irbis.train.ps.driver import join\n",
      "irbis/train/ps/driver.py": "def served(spec):\n    from irbis.train.strategies import make_strategy\n"},
     "cycle: irbis.train.ps, irbis.train.ps.driver, irbis.train.strategies, irbis.train.strategies.downpour"),
    # the kernels importing the training loop, which sits above them
    ({"irbis/kernels/image/network_input.py": "def f():\n    from irbis.train.ps import DONE\n"},
     "upward: irbis.kernels.image.network_input (kernels) -> irbis.train.ps (training)"),
    # the kernels importing LIME's explanations, which sit above them
    ({"irbis/kernels/image/network_input.py": "from irbis.explain.explanations import explain_image\n",
      "irbis/explain/explanations.py": "def explain_image():\n    pass\n"},
     "upward: irbis.kernels.image.network_input (kernels) -> irbis.explain.explanations (explain)"),
    # one package of the base layer importing its sibling
    ({"irbis/refs.py": "from irbis.errors import ParamValueError\n"},
     "sibling: irbis.refs -> irbis.errors"),
    # two serving modules importing each other
    ({"irbis/serving/predictor.py": "def load():\n    from irbis.serving.spark_predictor import SparkPredictor\n"},
     "cycle: irbis.serving.predictor, irbis.serving.spark_predictor"),
])
def test_the_checker_catches_each_crossing_planted_in_a_tree(tmp_path, planted, expected):
    graph = import_graph(_plant(tmp_path, {**CLEAN, **planted}))
    found = [f"upward: {u}" for u in upward_imports(graph)] + [f"sibling: {u}" for u in sibling_imports(graph)] + \
        [f"cycle: {', '.join(c)}" for c in import_cycles(graph)]
    assert found == expected.split("\n")


def test_the_scan_sees_imports_inside_functions_and_forbidden_packages():
    tree = ast.parse("def f():\n    from irbis.ml import TorchModel\n    import pyspark.sql\nfrom ... import spark\n")
    assert set(imported_names(tree, "irbis.train.backends.x")) >= {"irbis.ml.TorchModel", "irbis.spark", "pyspark.sql"}
    assert forbidden_imports(tree, "irbis.train.backends.x") == ["pyspark.sql"]


# -- the map in docs/architecture.md -------------------------------------------------------------------
def doc_layers() -> list[tuple[str, list[str]]]:
    """The layer table of docs/architecture.md, from the ground up: (layer, packages in backticks)."""
    rows = re.findall(r"^\| \*\*(\w+)\*\* \|([^|]*)\|", DOC.read_text(), re.MULTILINE)
    return [(name, re.findall(r"`(irbis[\w.]*)`", cell)) for name, cell in reversed(rows)]


def test_the_architecture_doc_lists_the_layers_of_this_test_in_order():
    assert doc_layers() == LAYERS


def test_every_irbis_name_in_the_architecture_doc_exists():
    files = module_files(ROOT)
    for name in sorted(set(re.findall(r"`(irbis(?:\.\w+)*)`", DOC.read_text()))):
        parent, _, attr = name.rpartition(".")
        assert name in files or (parent in files and hasattr(importlib.import_module(parent), attr)), \
            f"docs/architecture.md names {name}, which the code does not have"


# -- the pure modules in a fresh interpreter -----------------------------------------------------------
# One fresh interpreter imports the pure modules one by one and reports, after each import, which
# forbidden top-level packages have appeared; the first module that brings one in is the culprit.
SCRIPT = """
import importlib, json, sys
forbidden, found = set(FORBIDDEN), {}
for name in MODULES:
    importlib.import_module(name)
    loaded = sorted({m.split('.')[0] for m in sys.modules} & forbidden)
    if loaded:
        found[name] = loaded
        break
print(json.dumps(found))
"""


def test_pure_modules_import_no_spark_or_web_framework():
    pure = sorted(["irbis"] + [m for m in GRAPH if layer_of(m)[1] in PURE_LAYERS])
    code = f"FORBIDDEN = {FORBIDDEN!r}\nMODULES = {pure!r}\n" + SCRIPT
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {}, f"a pure module pulls in Spark or a web framework: {out.stdout}"


def test_public_entry_points_import_first_in_a_fresh_interpreter():
    # Each statement runs first in its own interpreter, so an import cycle between packages shows up
    # whatever the import order of the rest of the suite.
    statements = ["from irbis.ml import TorchEstimator, TorchModel",
                  "from irbis.spark.barrier import SparkBarrierBackend",
                  "import irbis; irbis.TorchEstimator; irbis.read_images; irbis.ImageFeaturizer",
                  "from irbis.spark.images import read_images", "from irbis.demo.camera_trap import run_demo"]
    for statement in statements:
        out = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True)
        assert out.returncode == 0, f"{statement!r} fails in a fresh interpreter:\n{out.stderr[-2000:]}"
