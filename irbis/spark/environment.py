"""Irbis's Python environment shipped to executors whose Python lacks it.

Spark's documentation names two ways to ship a Python environment with a job: a PEX file through
``spark.files``, or a packed virtual environment through ``spark.archives``; either way the executors'
Python (``PYSPARK_PYTHON``) points into what was shipped. :func:`pack` builds the PEX with PEX itself
(maintained; venv-pack has had no release since 2018), from the packages installed in this environment,
so nothing is downloaded; :func:`environment_conf` gives :func:`irbis.get_spark` the settings for either
kind of file.

Neither kind ships the interpreter: the executors need a Python of the same minor version as the one
that packed it (the PEX's first line asks for ``python3.X``). PySpark itself refuses a worker whose
Python differs from the driver's, naming both versions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from irbis.extras import installed_requirement

#: The folder a packed virtual environment is unpacked into, in each executor's working directory.
ARCHIVE_ALIAS = "irbis-env"
#: Left out of the PEX: every Spark worker puts its own pyspark and py4j on the Python workers' path.
EXCLUDED = ("--exclude", "pyspark", "--exclude", "py4j")
#: File endings of a packed virtual environment (``spark.archives`` unpacks them).
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


@dataclass(frozen=True)
class Packed:
    """What :func:`pack` built: the file, its size, how long the build took, and the Python it needs."""

    path: Path
    bytes: int
    seconds: float
    python: str


def python_version() -> str:
    """This interpreter's ``major.minor``: the version executors running a packed environment need."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def pack(output: str | os.PathLike[str], requirements: tuple[str, ...] | None = None, compress: bool = True) -> Packed:
    """Build one PEX file holding ``requirements`` (by default Irbis with the extras its stages run on the
    executors that are installed here, :func:`irbis.extras.installed_requirement`, e.g.
    ``irbis[text,images,explain]``) and everything they need, resolved
    from the packages installed in this environment (``pex --venv-repository``; Irbis itself as a wheel
    built from this installation), for executors with Python :func:`python_version`.

    ``compress=False`` stores the zip's entries as they are: with PyTorch, built in less than half the time at
    about three times the size (``benchmarks/results/pack.txt``), for executors that read it from a fast disk.

    Raises
    ------
    ValueError
        When ``output`` does not end in ``.pex`` (refused before anything is built: the file is a PEX, and
        :func:`environment_conf` tells a PEX from a packed environment by its name).
    ImportError
        When PEX is not installed (``pip install 'irbis[pack]'``).
    RuntimeError
        When PEX fails, with its output.
    """
    if not str(output).endswith(".pex"):
        name = Path(output).name
        stem = next((name[:-len(s)] for s in ARCHIVE_SUFFIXES if name.endswith(s)), Path(name).stem) or "irbis-env"
        raise ValueError(f"irbis pack builds a PEX file, and get_spark's environment= tells a PEX from a packed "
                         f"environment by its name: name the output {stem + '.pex'!r}, not {str(output)!r}")
    try:
        import pex  # noqa: F401
    except ImportError as err:
        raise ImportError("irbis pack needs PEX: pip install 'irbis[pack]'") from err
    requirements = requirements or (installed_requirement(),)
    out = Path(output).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        wheels = _irbis_wheel(Path(tmp)) if any(r.split("[")[0] == "irbis" for r in requirements) else []
        cmd = [sys.executable, "-m", "pex", f"--venv-repository={sys.prefix}", *requirements,
               *[arg for w in wheels for arg in ("--find-links", str(w.parent))],
               # pyspark and py4j come with every Spark worker (its PYTHONPATH): left out, and let in
               *EXCLUDED, "--inherit-path=fallback",
               "--python-shebang", f"/usr/bin/env python{python_version()}",
               *([] if compress else ["--no-compress"]), "--output-file", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pex failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stdout}{done.stderr}")
    return Packed(out, out.stat().st_size, time.perf_counter() - t0, python_version())


def _irbis_wheel(folder: Path) -> list[Path]:
    """A wheel of the Irbis this interpreter imports, when it is an editable install from a source tree
    (a wheel installed from an index needs none: the repository has it)."""
    source = Path(__file__).resolve().parents[2]  # irbis/spark/environment.py -> the source tree
    if not (source / "pyproject.toml").exists():
        return []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(folder), str(source)], check=True, capture_output=True)
    return sorted(folder.glob("irbis-*.whl"))


def environment_conf(environment: str) -> tuple[dict[str, str], str]:
    """Spark settings that ship ``environment`` (a PEX file, or a packed virtual environment ending in one
    of :data:`ARCHIVE_SUFFIXES`) to the executors, and the executors' Python within it.

    Raises
    ------
    FileNotFoundError
        When ``environment`` is a local path that does not exist (named before any job starts).
    ValueError
        When its kind cannot be told from its name.
    """
    local = environment.split("#", 1)[0]
    if "://" not in local or local.startswith("file:"):
        path = Path(local.removeprefix("file://").removeprefix("file:"))
        if not path.is_file():
            raise FileNotFoundError(f"environment {environment!r} does not exist: build one with "
                                    f"`irbis pack --output irbis-env.pex`")
    name = local.rstrip("/").rsplit("/", 1)[-1]
    if name.endswith(".pex"):
        return {"spark.files": environment}, f"./{name}"
    if name.endswith(ARCHIVE_SUFFIXES):
        return {"spark.archives": f"{local}#{ARCHIVE_ALIAS}"}, f"./{ARCHIVE_ALIAS}/bin/python"
    raise ValueError(f"environment {environment!r}: a PEX file (.pex, `irbis pack`) or a packed virtual "
                     f"environment ({', '.join(ARCHIVE_SUFFIXES)}) was expected")


def merge_conf(settings: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """``settings`` with ``extra`` added; ``spark.files`` and ``spark.archives`` lists are joined, not
    replaced."""
    merged = dict(settings)
    for key, value in extra.items():
        if key in ("spark.files", "spark.archives") and merged.get(key):
            merged[key] = f"{merged[key]},{value}"
        else:
            merged[key] = value
    return merged
