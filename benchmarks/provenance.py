"""How a results file was made: the header lines every benchmark writes at the top of its results file.

A benchmark's results file (``benchmarks/results/``) opens with::

    # benchmarks/NAME.py  YYYY-MM-DD HH:MM
    # command: python benchmarks/NAME.py ARGS
    # commit: 1a2b3c4 (and uncommitted changes); measuring code: 2
    # machine: x86_64, 2 cores (AVX-512, VNNI, AMX-BF16, AMX-INT8); python 3.11.7; torch 2.13.0+cpu, ...
    # load average (1/5/15 min) before (0.9, 1.2, 1.4), after (2.1, 1.8, 1.6); run time 312 s

**The measuring code.** Each benchmark script declares ``MEASURING_CODE``, a version of what it measures,
which the run records. Bump it when a change would change the figures: what runs (the work, the data, the
settings, the contenders) or how it is timed, in the script or in the benchmark modules it imports (``peers``,
``train_sync``, ``async_e2e``, ``loadgen``...). Leave it for a rename, a refactor, a change of wording or of
layout. ``tests/unit/test_figures.py`` fails when a results file records another version than its script
declares now: the run is older than the script's measuring code and must be made again. (As airspeed
velocity's ``version`` attribute of a benchmark: a hash of the code would void every run at each rename.)
"""

from __future__ import annotations

import ast
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The module-level name of a benchmark's measuring-code version.
VERSION_NAME = "MEASURING_CODE"


def measuring_code(script: str | Path) -> str:
    """The ``MEASURING_CODE`` that ``script`` declares (read from its source, not imported)."""
    tree = ast.parse(Path(script).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == VERSION_NAME
                                                for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise LookupError(f"{Path(script).name} declares no {VERSION_NAME} (see benchmarks/provenance.py)")


def commit() -> str:
    """The repository's commit (short hash), and whether the library or the benchmarks differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "irbis", "benchmarks", ":!benchmarks/results")
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return (head or "unknown (no git)") + (" and uncommitted changes" if dirty else "")


def versions(packages: tuple[str, ...]) -> str:
    """``name version`` of each installed package of ``packages``, comma-separated."""
    import importlib.metadata as md

    found = []
    for p in packages:
        try:
            found.append(f"{p} {md.version(p)}")
        except md.PackageNotFoundError:
            continue
    return ", ".join(found)


def _load(values: tuple[float, ...]) -> str:
    return str(tuple(round(v, 1) for v in values))


#: CPU flags (Linux ``/proc/cpuinfo``) that set what reduced precision gains, with the names the header gives.
MATRIX_FLAGS = (("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"), ("amx_bf16", "AMX-BF16"), ("amx_int8", "AMX-INT8"))


def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> str:
    """`` (AVX-512, VNNI, AMX-BF16, AMX-INT8)``: the matrix instructions the CPU reports, which decide what bf16
    and int8 gain (with AMX a bf16 matrix product runs several times an fp32 one); empty where none or unknown."""
    try:
        flags = set(Path(cpuinfo).read_text().split())
    except OSError:
        return ""
    named = [name for flag, name in MATRIX_FLAGS if flag in flags]
    return f" ({', '.join(named)})" if named else ""


class Run:
    """One run of a benchmark script: started when built, described by :meth:`header` when it ends."""

    def __init__(self, script: str | Path, packages: tuple[str, ...] = ("torch", "pyspark", "numpy", "pyarrow")):
        self.script = Path(script).resolve()
        self.packages = packages
        self.argv = list(sys.argv[1:])
        self.started = time.perf_counter()
        self.date = time.strftime("%Y-%m-%d %H:%M")
        self.load_before = os.getloadavg()
        self.commit = commit()

    @property
    def name(self) -> str:
        """The script as the results files name it: ``benchmarks/NAME.py``."""
        try:
            return self.script.relative_to(ROOT).as_posix()
        except ValueError:
            return f"benchmarks/{self.script.name}"

    def header(self, *about: str) -> list[str]:
        """The results file's first lines: the script and date, the command, the commit and measuring code,
        the machine and package versions, the load before and now and the run time; then ``about`` (each a
        line of what the run did, without its ``#``)."""
        return [f"# {self.name}  {self.date}",
                "# command: " + shlex.join(["python", self.name, *self.argv]),
                f"# commit: {self.commit}; measuring code: {measuring_code(self.script)}",
                f"# machine: {platform.machine()}, {os.cpu_count()} cores{cpu_features()}; "
                f"python {platform.python_version()}; "
                + versions(self.packages),
                f"# load average (1/5/15 min) before {_load(self.load_before)}, after {_load(os.getloadavg())}; "
                f"run time {time.perf_counter() - self.started:.0f} s; compare rows within this run only",
                *(f"# {line}" for line in about)]
