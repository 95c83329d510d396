"""One public face: ``irbis.X`` for every public name of ``irbis.ml`` and for every name the documentation uses.

The stages' table lives in ``irbis.ml`` alone and the top level reads it, so a stage added there is at the top
level too; ``import irbis`` stays light (no torch, no PySpark) because both tables import on first use.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import irbis
import irbis.ml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_public_name_of_the_stages_is_at_the_top_level_and_is_the_same_object():
    missing = sorted(set(irbis.ml.__all__) - set(irbis.__all__))
    assert not missing, f"irbis.ml names missing from irbis: {missing}"
    for name in irbis.ml.__all__:
        assert getattr(irbis, name) is getattr(irbis.ml, name), name


@pytest.mark.parametrize("name", sorted(irbis.__all__))
def test_every_top_level_name_imports(name):
    assert getattr(irbis, name) is not None
    assert name in dir(irbis)


def _documented() -> set[tuple[str, str]]:
    """(page, name) for each ``irbis.Name`` and ``from irbis import a, b`` of the README and the docs."""
    found = set()
    for page in PAGES:
        text = page.read_text()
        for name in re.findall(r"\birbis\.([A-Za-z_]\w*)\b(?!\.)", text):
            found.add((page.name, name))
        for names in re.findall(r"from irbis import ([\w, ]+)", text):
            found |= {(page.name, n.strip()) for n in names.split(",") if n.strip()}
    return found


@pytest.mark.parametrize("page,name", sorted(_documented()))
def test_every_name_the_documentation_uses_exists(page, name):
    exists = hasattr(irbis, name) or importlib.util.find_spec(f"irbis.{name}") is not None
    assert exists, f"{page} names irbis.{name}, which does not exist"


def test_an_unknown_name_is_an_attribute_error_that_names_it():
    with pytest.raises(AttributeError, match="TextEmbeder"):
        irbis.TextEmbeder  # noqa: B018


def test_importing_the_package_imports_neither_torch_nor_pyspark():
    code = ("import json, sys, irbis; irbis.__all__; "
            "print(json.dumps([m for m in ('torch', 'pyspark') if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == []
