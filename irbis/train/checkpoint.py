"""Atomic training checkpoints: one file per worker plus a manifest written last.

Layout under the run directory::

    step-000120/rank-0.pt ...   weights, optimizer and strategy state, data position
    latest.json                 {"step": 120, "worldSize": 2, "history": [...]}

Every worker writes its own file (temporary name + ``os.replace``); after a
barrier rank 0 replaces ``latest.json`` and removes older steps. A worker that
dies mid-checkpoint therefore leaves the previous manifest, and every file it
names, intact. Files hold tensors and plain containers only, read back with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch

MANIFEST = "latest.json"


def _step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:09d}")


def save_worker(root: str, step: int, rank: int, payload: dict[str, Any]) -> None:
    """Write this worker's checkpoint for ``step`` atomically."""
    d = _step_dir(root, step)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"rank-{rank}.pt")
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def commit(root: str, step: int, manifest: dict[str, Any]) -> None:
    """Point ``latest.json`` at ``step`` (rank 0, after every worker saved), drop older steps."""
    path = os.path.join(root, MANIFEST)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({**manifest, "step": step}, f)
    os.replace(tmp, path)
    keep = os.path.basename(_step_dir(root, step))
    for name in os.listdir(root):
        if name.startswith("step-") and name != keep:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def latest(root: str | None) -> dict[str, Any] | None:
    """The manifest of the last committed checkpoint, or None."""
    if not root:
        return None
    try:
        with open(os.path.join(root, MANIFEST)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def load_worker(root: str, step: int, rank: int, device: str = "cpu") -> dict[str, Any]:
    """Read this worker's checkpoint for ``step``."""
    path = os.path.join(_step_dir(root, step), f"rank-{rank}.pt")
    return torch.load(path, map_location=device, weights_only=True)
