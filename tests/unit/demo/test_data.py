"""The camera-trap set builder: layout, metadata and determinism (no JVM)."""
from __future__ import annotations

import csv
import hashlib

import cv2
import numpy as np
import pytest

from irbis.demo.data import FRAME_SIZE, METADATA_COLUMNS, build_camera_trap_set


def _digest(root):
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    return build_camera_trap_set(tmp_path_factory.mktemp("a"), cameras=3, bursts_per_camera=3,
                                 frames_per_burst=2, seed=7)


def test_layout_and_metadata(small_set):
    with open(small_set / "metadata.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == METADATA_COLUMNS
    assert len(rows) == 3 * 3 * 2
    for row in rows:
        assert row["path"] == f"{row['label']}/{row['camera']}/{row['burst']}/{row['frame']}.jpg"
        assert (small_set / row["path"]).is_file()
    img = cv2.imread(str(small_set / rows[0]["path"]))
    assert img.shape == (*FRAME_SIZE, 3)
    by_camera = {}
    for row in rows:
        by_camera.setdefault(row["camera"], set()).add(row["label"])
    assert all(labels == {"animal", "empty"} for labels in by_camera.values())
    stamps = [row["timestamp"] for row in rows if row["burst"] == rows[0]["burst"]]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


def test_same_seed_same_files(small_set, tmp_path):
    again = build_camera_trap_set(tmp_path, cameras=3, bursts_per_camera=3, frames_per_burst=2, seed=7)
    assert _digest(again) == _digest(small_set)


def test_other_seed_other_pixels(small_set, tmp_path):
    other = build_camera_trap_set(tmp_path, cameras=3, bursts_per_camera=3, frames_per_burst=2, seed=8)
    assert _digest(other) != _digest(small_set)


def test_frames_of_a_burst_differ_but_stay_close(small_set):
    burst = sorted((small_set / "empty" / "cam00").iterdir())[0]
    f0, f1 = (cv2.imread(str(p)).astype(np.float64) for p in sorted(burst.glob("*.jpg")))
    assert 0.0 < np.abs(f0 - f1).mean() < 60.0


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="bursts_per_camera"):
        build_camera_trap_set(tmp_path, bursts_per_camera=1)
    with pytest.raises(ValueError, match="animal_fraction"):
        build_camera_trap_set(tmp_path, animal_fraction=1.0)
