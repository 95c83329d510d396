"""Shipping model files to executors that do not share the driver's filesystem."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from irbis.models.fetch import cached_sha256

_SHIPPED: dict[str, str] = {}


def ship_file(path: str) -> str | None:
    """Make a local file or folder available to every executor; returns the name to look it up by.

    On ``local[...]`` masters the executors share the driver's filesystem and nothing is shipped
    (``None``). Elsewhere (``local-cluster``, real clusters) the file goes through
    ``SparkContext.addFile`` under a content-derived name, so two different files called
    ``network.pt`` never collide.
    """
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None or sc.master.startswith("local["):
        return None
    if path in _SHIPPED:
        return _SHIPPED[path]
    src = Path(path)
    if src.is_dir():
        name = src.name
        sc.addFile(str(src), recursive=True)
    else:
        name = f"{cached_sha256(src)[:24]}{src.suffix}"
        staged = Path(tempfile.mkdtemp(prefix="irbis-ship-")) / name
        try:
            os.link(src, staged)
        except OSError:
            shutil.copy2(src, staged)
        sc.addFile(str(staged))
    _SHIPPED[path] = name
    return name


def localize(path: str, shipped: str | None) -> str:
    """On an executor: ``path`` when this machine has it, else the shipped copy."""
    if shipped is None or os.path.exists(path):
        return path
    from pyspark import SparkFiles

    return SparkFiles.get(shipped)
