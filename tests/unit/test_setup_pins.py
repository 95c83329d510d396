"""``make setup`` on a machine whose pip sees only the public registry: every pin of ``constraints.txt`` is
a public version, and the PyTorch the Makefile installs first is the one the constraints pin."""
from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def pins() -> dict[str, Requirement]:
    """The requirements of ``constraints.txt``, by package name."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    reqs = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {req.name.lower(): req for req in reqs}


def test_no_pin_carries_a_local_version_label_only_a_private_index_holds():
    local = [str(req) for req in pins().values()
             if any(Version(spec.version).local for spec in req.specifier if spec.operator == "==")]
    assert local == []


def test_the_makefile_installs_the_torch_the_constraints_pin_and_its_cpu_build_satisfies_them():
    makefile = (ROOT / "Makefile").read_text()
    installed = re.search(r"pip install[^\n]*\btorch==([\w.+]+)", makefile)
    assert installed, "the Makefile installs no pinned torch"
    torch = pins()["torch"]
    assert torch.specifier.contains(installed.group(1))
    assert torch.specifier.contains(f"{installed.group(1)}+cpu")
