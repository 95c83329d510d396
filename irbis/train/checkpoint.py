"""Atomic training checkpoints: one file per worker plus a manifest written last.

Layout under the run directory::

    step-000120/rank-0.pt ...   weights, optimizer and strategy state, data position
    latest.json                 {"step": 120, "worldSize": 2, "history": [...]}

Every worker writes its own file (temporary name, then a move); after a
barrier rank 0 replaces ``latest.json`` and removes older steps. A worker that
dies mid-checkpoint therefore leaves the previous manifest, and every file it
names, intact. Files hold tensors and plain containers only, read back with
``torch.load(weights_only=True)``.

The run directory is a local path or a URI of a file system that pyarrow opens
(``hdfs://``, ``s3://``, ``gs://``, ``abfs://``, ``file://``, as its build
supports): on a cluster the workers write from the executors' hosts and a
restarted task may run on another host, so it must be a directory every executor
sees, a shared mount or such a URI. A move is atomic on local and HDFS file
systems; on object stores each file is one put, and the manifest, written last,
still names only complete files.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
from typing import Any

import torch

MANIFEST = "latest.json"


def filesystem(root: str) -> tuple[Any, str]:
    """pyarrow's file system of ``root`` and the path within it (a local path is made absolute)."""
    from pyarrow import fs

    if "://" not in root:
        return fs.LocalFileSystem(), os.path.abspath(root)
    return fs.FileSystem.from_uri(root)


def make_run_dir(root: str) -> None:
    """Create the run directory ``root`` (and its parents)."""
    store, path = filesystem(root)
    store.create_dir(path, recursive=True)


def _write(store: Any, path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with store.open_output_stream(tmp) as out:
        out.write(data)
    store.move(tmp, path)


def _read(store: Any, path: str) -> bytes:
    with store.open_input_stream(path) as src:
        return src.read()


def _step_dir(root: str, step: int) -> str:
    return posixpath.join(root, f"step-{step:09d}")


def save_worker(root: str, step: int, rank: int, payload: dict[str, Any]) -> None:
    """Write this worker's checkpoint for ``step`` atomically."""
    store, base = filesystem(root)
    folder = _step_dir(base, step)
    store.create_dir(folder, recursive=True)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    _write(store, posixpath.join(folder, f"rank-{rank}.pt"), buffer.getvalue())


def commit(root: str, step: int, manifest: dict[str, Any]) -> None:
    """Point ``latest.json`` at ``step`` (rank 0, after every worker saved), drop older steps."""
    from pyarrow.fs import FileSelector, FileType

    store, base = filesystem(root)
    _write(store, posixpath.join(base, MANIFEST), json.dumps({**manifest, "step": step}).encode())
    keep = posixpath.basename(_step_dir(base, step))
    for info in store.get_file_info(FileSelector(base)):
        if info.type == FileType.Directory and info.base_name.startswith("step-") and info.base_name != keep:
            try:
                store.delete_dir(info.path)
            except OSError:  # another rank's late cleanup, or a store that lists what it already removed
                pass


def latest(root: str | None) -> dict[str, Any] | None:
    """The manifest of the last committed checkpoint, or None."""
    if not root:
        return None
    store, base = filesystem(root)
    try:
        return json.loads(_read(store, posixpath.join(base, MANIFEST)))
    except FileNotFoundError:
        return None


def load_worker(root: str, step: int, rank: int, device: str = "cpu") -> dict[str, Any]:
    """Read this worker's checkpoint for ``step``."""
    store, base = filesystem(root)
    data = _read(store, posixpath.join(_step_dir(base, step), f"rank-{rank}.pt"))
    return torch.load(io.BytesIO(data), map_location=device, weights_only=True)
