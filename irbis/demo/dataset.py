"""Camera-trap image sets on disk: find the images and their metadata, check them, split by camera.

Pure pandas (no Spark): the demo calls these on the driver before any Spark job, so bad input fails
in a second with a message that says what is needed.

A set is a folder ``DIR`` in one of two layouts:

* ``DIR/metadata.csv`` with the columns ``path`` (relative to ``DIR``, or absolute), ``label``,
  ``camera`` and ``burst`` (``timestamp`` and any other columns are kept);
* no CSV: images at ``DIR/<label>/<camera>/<burst>/<file>`` (``.jpg``, ``.jpeg``, ``.png``, ``.bmp``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["IMAGE_SUFFIXES", "MIN_TEST_CAMERAS", "REQUIRED_COLUMNS", "check_labels", "check_test_cameras",
           "load_metadata", "split_by_camera"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
#: Columns a ``metadata.csv`` must have.
REQUIRED_COLUMNS = ("path", "label", "camera", "burst")
#: Test cameras needed for a bootstrap interval that says something about new places.
MIN_TEST_CAMERAS = 2
_LAYOUT = "DIR/metadata.csv (columns path,label,camera,burst) or DIR/<label>/<camera>/<burst>/<image>"


def load_metadata(folder: str | Path) -> pd.DataFrame:
    """One row per image: absolute ``path``, ``label``, ``camera``, ``burst`` (+ the CSV's other columns).

    Raises
    ------
    ValueError
        When the folder does not exist, holds no images, the CSV misses columns or names files that
        do not exist, or an image is not at ``<label>/<camera>/<burst>/<image>`` depth.
    """
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"--images {folder}: not a folder; expected {_LAYOUT}")
    csv = root / "metadata.csv"
    meta = _from_csv(root, csv) if csv.is_file() else _from_folders(root)
    meta = meta.astype({"label": str, "camera": str, "burst": str})
    return meta.sort_values("path", ignore_index=True)


def _from_csv(root: Path, csv: Path) -> pd.DataFrame:
    meta = pd.read_csv(csv, dtype=str, keep_default_na=False)
    missing = [c for c in REQUIRED_COLUMNS if c not in meta.columns]
    if missing:
        raise ValueError(f"{csv}: missing column(s) {missing}; found {list(meta.columns)}; the CSV needs "
                         f"{list(REQUIRED_COLUMNS)} (path relative to the CSV's folder)")
    if meta.empty:
        raise ValueError(f"{csv}: no rows; list one image per row with columns {list(REQUIRED_COLUMNS)}")
    empty = [c for c in REQUIRED_COLUMNS if (meta[c].str.strip() == "").any()]
    if empty:
        raise ValueError(f"{csv}: empty values in column(s) {empty}; every image needs a {', '.join(REQUIRED_COLUMNS)}")
    meta["path"] = [str((root / p).resolve()) for p in meta["path"]]
    absent = [p for p in meta["path"] if not Path(p).is_file()]
    if absent:
        raise ValueError(f"{csv}: {len(absent)} listed image(s) do not exist, e.g. {absent[0]}")
    return meta


def _from_folders(root: Path) -> pd.DataFrame:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"--images {root}: no images ({', '.join(IMAGE_SUFFIXES)}) and no metadata.csv; "
                         f"expected {_LAYOUT}")
    rows = []
    for p in files:
        parts = p.relative_to(root).parts
        if len(parts) != 4:
            raise ValueError(f"--images {root}: {'/'.join(parts)} is not at <label>/<camera>/<burst>/<image>; "
                             f"move the images there or add a metadata.csv (columns {','.join(REQUIRED_COLUMNS)})")
        rows.append({"path": str(p.resolve()), "label": parts[0], "camera": parts[1], "burst": parts[2]})
    return pd.DataFrame(rows)


def check_labels(meta: pd.DataFrame, positive: str) -> np.ndarray:
    """Binary labels (1.0 for ``positive``) after checking that both classes and two cameras exist."""
    labels = sorted(meta["label"].unique())
    if positive not in labels:
        raise ValueError(f"positive label {positive!r} not found; the labels are {labels}; "
                         f"name the class to detect with --positive")
    if len(labels) < 2:
        raise ValueError(f"only one class ({labels[0]!r}) found; the demo needs images of {positive!r} "
                         f"and images without it (any other label)")
    cameras = meta["camera"].nunique()
    if cameras < 2:
        raise ValueError(f"only one camera ({meta['camera'].iloc[0]!r}) found; the train/test split is by "
                         f"camera (frames of a burst are correlated), so at least 2 cameras are needed")
    return (meta["label"] == positive).to_numpy(np.float64)


def split_by_camera(meta: pd.DataFrame, y: np.ndarray, test_fraction: float = 0.25,
                    seed: int = 0, tries: int = 200) -> np.ndarray:
    """A boolean ``is_test`` per image: whole cameras go to the test set, never single images.

    About ``test_fraction`` of the cameras (at least one) are held out; of the seeded random splits
    the first whose train and test sets both hold both classes is taken.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), found {test_fraction}")
    cameras = np.array(sorted(meta["camera"].unique()))
    n_test = min(max(int(round(test_fraction * len(cameras))), 1), len(cameras) - 1)
    rng = np.random.default_rng(seed)
    cam = meta["camera"].to_numpy()
    for _ in range(tries):
        is_test = np.isin(cam, rng.permutation(cameras)[:n_test])
        if len(set(y[is_test])) == 2 and len(set(y[~is_test])) == 2:
            return is_test
    raise ValueError(f"no split of the {len(cameras)} cameras into train and test with both classes on each "
                     f"side; each side needs positive and negative images, so add cameras that saw both")


def check_test_cameras(meta: pd.DataFrame) -> None:
    """Raise when the held-out cameras (``is_test``) are too few for confidence intervals."""
    test = meta[meta["is_test"]]
    cameras = test["camera"].nunique()
    if cameras < MIN_TEST_CAMERAS:
        raise ValueError(f"too few test cameras for confidence intervals: {cameras} held out of "
                         f"{meta['camera'].nunique()}, need at least {MIN_TEST_CAMERAS}; add cameras "
                         f"(at least {2 * MIN_TEST_CAMERAS + 2}) or raise the test share")
