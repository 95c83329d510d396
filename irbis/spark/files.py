"""Shipping model files to executors that do not share the driver's filesystem."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from irbis.models.fetch import cached_sha256

#: Names already added to the running SparkContext (content-derived, so equal content ships once).
_SHIPPED: set[str] = set()


def _content_name(src: Path) -> str:
    """A name derived from the content: a file's sha256, or a folder's files' sha256s and names."""
    if not src.is_dir():
        return f"{cached_sha256(src)[:24]}{src.suffix}"
    digest = hashlib.sha256()
    for file in sorted(p for p in src.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(src).as_posix()}:{cached_sha256(file)}|".encode())
    return f"{src.name}-{digest.hexdigest()[:24]}"


def ship_file(path: str) -> str | None:
    """Make a local file or folder available to every executor; returns the name to look it up by.

    On ``local[...]`` masters the executors share the driver's filesystem and nothing is shipped
    (``None``). Elsewhere (``local-cluster``, real clusters) the file goes through
    ``SparkContext.addFile`` (a folder as a zip through ``SparkContext.addArchive``) under a name
    derived from its content: two different files called ``network.pt`` never collide, a file
    rewritten at the same path ships anew, and the same content
    at another path (a stage saved and loaded again) is not added twice.
    """
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None or (sc.master or "").startswith("local["):
        return None
    src = Path(path)
    name = _content_name(src)
    if name in _SHIPPED:
        return name
    staged = Path(tempfile.mkdtemp(prefix="irbis-ship-")) / name
    # the driver serves the staged copy for as long as the context lives: it goes when the process ends
    atexit.register(shutil.rmtree, staged.parent, ignore_errors=True)
    if src.is_dir():
        # Spark adds no local folder on a cluster master: the folder travels as a zip archive, which
        # each executor unpacks into a folder called ``name``.
        archive = shutil.make_archive(str(staged), "zip", root_dir=src)
        sc.addArchive(f"{archive}#{name}")
    else:
        try:
            os.link(src, staged)
        except OSError:
            shutil.copy2(src, staged)
        sc.addFile(str(staged))
    _SHIPPED.add(name)
    return name


def localize(path: str, shipped: str | None) -> str:
    """On an executor: ``path`` when this machine has it, else the shipped copy."""
    if shipped is None or os.path.exists(path):
        return path
    from pyspark import SparkFiles

    return SparkFiles.get(shipped)


def shipped_kernel(fn: Any) -> Any:
    """A stage's kernel ready to run on the executors: the local files it reads (its ``files``, where it has
    any) shipped with :func:`ship_file`, and on an executor the kernel reading them where they landed (its
    ``relocated``, called once per task with :func:`localize`'s paths). Without files to ship, ``fn`` itself."""
    names = {path: ship_file(path) for path in getattr(fn, "files", ())}
    return ShippedKernel(fn, names) if any(names.values()) else fn


class ShippedKernel:
    """A kernel whose files were shipped (:func:`shipped_kernel`): picklable, called like the kernel."""

    def __init__(self, kernel: Any, names: dict[str, str | None]) -> None:
        self.kernel, self.names = kernel, names
        self._local: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_local": None}

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        if self._local is None:
            self._local = self.kernel.relocated({path: localize(path, name) for path, name in self.names.items()})
        return self._local(blocks)
