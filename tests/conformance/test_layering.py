"""Imports point down: the pure packages load without PySpark or a web framework.

Two checks: the source of every module under the pure packages is scanned (its AST, so an
import inside a function counts), and the pure modules are imported in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import irbis
import irbis.explain
import irbis.kernels
import irbis.models
import irbis.train

PURE_PACKAGES = ["irbis.train", "irbis.kernels", "irbis.models", "irbis.explain"]
PURE = ["irbis", "irbis.errors", "irbis.models", "irbis.train", "irbis.explain"] + [
    m.name for pkg in (irbis.kernels, irbis.models, irbis.train, irbis.explain)
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
]
FORBIDDEN = ["pyspark", "flask", "fastapi", "starlette", "py4j"]
#: Imports a pure module may not make, at any depth of its code: the runtimes and the layers above.
FORBIDDEN_IMPORTS = FORBIDDEN + ["uvicorn", "aiohttp", "werkzeug", "irbis.ml", "irbis.spark", "irbis.serving"]
ROOT = Path(irbis.__file__).parent


def imported_names(tree: ast.AST, module: str) -> list[str]:
    """Every module an AST imports, wherever the import statement is (relative imports resolved)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.rsplit(".", node.level)[0]
                base = f"{parent}.{base}" if base else parent
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def forbidden_imports(tree: ast.AST, module: str) -> list[str]:
    return sorted({n for n in imported_names(tree, module)
                   for bad in FORBIDDEN_IMPORTS if n == bad or n.startswith(bad + ".")})


def pure_sources() -> list[tuple[str, Path]]:
    out = []
    for package in PURE_PACKAGES:
        folder = ROOT / package.split(".", 1)[1]
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = ("irbis",) + rel.parts
            out.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return out


@pytest.mark.parametrize("module,path", pure_sources(), ids=[m for m, _ in pure_sources()])
def test_pure_module_source_imports_nothing_above_it(module, path):
    bad = forbidden_imports(ast.parse(path.read_text()), module)
    assert not bad, f"{module} ({path.name}) imports {bad}; pure packages must not import Spark, web " \
                    "frameworks or the layers above them (irbis.ml, irbis.spark, irbis.serving)"


def test_the_scan_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from irbis.ml import TorchModel\n    import pyspark.sql\n"
                     "from ... import spark\n")
    assert forbidden_imports(tree, "irbis.train.backends.x") == ["irbis.ml", "irbis.ml.TorchModel",
                                                                 "irbis.spark", "pyspark.sql"]

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
    code = f"FORBIDDEN = {FORBIDDEN!r}\nMODULES = {sorted(set(PURE))!r}\n" + SCRIPT
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {}, f"a pure module pulls in Spark or a web framework: {out.stdout}"


def test_public_entry_points_import_first_in_a_fresh_interpreter():
    # Each statement runs first in its own interpreter, so an import cycle between packages shows up
    # whatever the import order of the rest of the suite.
    statements = ["from irbis.ml import TorchEstimator, TorchModel", "from irbis.spark.barrier import SparkBarrierBackend",
                  "import irbis; irbis.TorchEstimator; irbis.read_images; irbis.ImageFeaturizer",
                  "from irbis.spark.images import read_images", "from irbis.demo.camera_trap import run_demo"]
    for statement in statements:
        out = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True)
        assert out.returncode == 0, f"{statement!r} fails in a fresh interpreter:\n{out.stderr[-2000:]}"
