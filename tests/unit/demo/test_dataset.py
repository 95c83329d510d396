"""Finding, checking and splitting camera-trap sets (no JVM)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from irbis.demo.dataset import check_labels, load_metadata, split_by_camera


def _touch(root, rel):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xd8not really a jpeg")
    return path


def test_folder_layout(tmp_path):
    for rel in ["animal/c1/b1/0.jpg", "animal/c1/b1/1.jpg", "empty/c2/b2/0.png"]:
        _touch(tmp_path, rel)
    meta = load_metadata(tmp_path)
    assert list(meta[["label", "camera", "burst"]].itertuples(index=False, name=None)) == [
        ("animal", "c1", "b1"), ("animal", "c1", "b1"), ("empty", "c2", "b2")]
    assert all(p.startswith(str(tmp_path.resolve())) for p in meta["path"])


def test_csv_layout_keeps_extra_columns(tmp_path):
    _touch(tmp_path, "x/a.jpg")
    _touch(tmp_path, "y/b.jpg")
    (tmp_path / "metadata.csv").write_text("path,label,camera,burst,timestamp\n"
                                           "x/a.jpg,leopard,c1,b1,2024-01-01\ny/b.jpg,goat,c2,b7,2024-01-02\n")
    meta = load_metadata(tmp_path)
    assert list(meta["label"]) == ["leopard", "goat"] and "timestamp" in meta


@pytest.mark.parametrize("setup, message", [
    (lambda root: None, "no images"),
    (lambda root: _touch(root, "animal/c1/0.jpg"), "not at <label>/<camera>/<burst>/<image>"),
    (lambda root: (root / "metadata.csv").write_text("path,label\na.jpg,animal\n"),
     r"missing column\(s\) \['camera', 'burst'\]"),
    (lambda root: (root / "metadata.csv").write_text("path,label,camera,burst\nnope.jpg,animal,c,b\n"), "do not exist"),
])
def test_bad_layouts(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_metadata(tmp_path)


def test_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        load_metadata(tmp_path / "missing")


def _meta(labels, cameras):
    return pd.DataFrame({"path": [f"p{i}" for i in range(len(labels))], "label": labels, "camera": cameras,
                         "burst": ["b"] * len(labels)})


def test_check_labels():
    y = check_labels(_meta(["animal", "empty", "goat"], ["a", "b", "b"]), "animal")
    assert y.tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="only one class"):
        check_labels(_meta(["animal", "animal"], ["a", "b"]), "animal")
    with pytest.raises(ValueError, match="only one camera"):
        check_labels(_meta(["animal", "empty"], ["a", "a"]), "animal")
    with pytest.raises(ValueError, match="--positive"):
        check_labels(_meta(["cat", "empty"], ["a", "b"]), "animal")


def test_split_keeps_cameras_whole_and_both_classes_on_each_side():
    cams = [f"c{i}" for i in range(8) for _ in range(4)]
    labels = ["animal", "empty"] * 16
    meta = _meta(labels, cams)
    y = check_labels(meta, "animal")
    is_test = split_by_camera(meta, y, 0.25, seed=3)
    assert np.array_equal(is_test, split_by_camera(meta, y, 0.25, seed=3))
    test_cams = set(meta.loc[is_test, "camera"])
    assert len(test_cams) == 2 and not test_cams & set(meta.loc[~is_test, "camera"])
    assert set(y[is_test]) == set(y[~is_test]) == {0.0, 1.0}


def test_split_impossible():
    meta = _meta(["animal", "animal", "empty", "empty"], ["a", "a", "b", "b"])
    with pytest.raises(ValueError, match="both classes on each side"):
        split_by_camera(meta, check_labels(meta, "animal"))
