"""Imports point down: the pure packages load without PySpark or a web framework."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import irbis.explain
import irbis.kernels
import irbis.models

PURE = ["irbis", "irbis.models", "irbis.explain", "irbis.train.strategies", "irbis.train.comm", "irbis.train.loop"] + [
    m.name for pkg in (irbis.kernels, irbis.models, irbis.explain) for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + ".")
]
FORBIDDEN = ["pyspark", "flask", "fastapi", "starlette", "py4j"]

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
    statements = ["from irbis.train import TorchEstimator", "from irbis.ml import TorchEstimator, TorchModel",
                  "import irbis; irbis.TorchEstimator; irbis.read_images; irbis.ImageFeaturizer",
                  "from irbis.spark.images import read_images", "from irbis.demo.camera_trap import run_demo"]
    for statement in statements:
        out = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True)
        assert out.returncode == 0, f"{statement!r} fails in a fresh interpreter:\n{out.stderr[-2000:]}"
