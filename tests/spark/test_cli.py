"""The command line's Spark jobs: classify, featurize and train, on the test run's session."""

from __future__ import annotations

import json

import numpy as np
import pytest

from irbis.cli import main

pytestmark = pytest.mark.spark


def test_classify_names_the_photographs(spark, tiny_images, capsys):
    folder = str(tiny_images["coffee"].parent)
    assert main(["classify", folder, "--master", "local[2]", "--top", "3"]) == 0
    out = capsys.readouterr().out
    coffee = out[out.index("coffee.jpg"):].splitlines()[1:4]
    assert any("espresso" in line for line in coffee), out


def test_featurize_writes_pooled_features(spark, tiny_images, tmp_path, capsys):
    import shutil

    folder = tmp_path / "photos"
    folder.mkdir()
    for path in tiny_images.values():
        shutil.copy(path, folder / path.name)
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "features.parquet"
    assert main(["featurize", str(folder), str(out), "--master", "local[2]", "--precision", "fp32"]) == 0
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == len(tiny_images)
    assert all(r.features.size == 1280 and np.isfinite(r.features.toArray()).all() for r in rows)


def test_train_fits_and_saves_a_torch_model(spark, tmp_path, capsys):
    from pyspark.ml.linalg import Vectors
    from sklearn.datasets import load_digits

    from irbis import TorchModel

    x, y = load_digits(return_X_y=True)
    data = tmp_path / "digits.parquet"
    spark.createDataFrame([(Vectors.dense(a / 16.0), int(b)) for a, b in zip(x[:400], y[:400])],
                          ["features", "label"]).write.parquet(str(data))
    options = json.dumps({"in_features": 64, "hidden": 32, "out_features": 10})
    model_dir = tmp_path / "model"
    code = main(["train", str(data), str(model_dir), "--network-options", options, "--epochs", "3",
                 "--workers", "2", "--master", "local[2]"])
    assert code == 0
    assert "epoch 3" in capsys.readouterr().out
    loaded = TorchModel.load(str(model_dir))
    assert len(loaded.training_summary) == 3


def test_train_reports_a_missing_column(spark, tmp_path, capsys):
    data = tmp_path / "bad.parquet"
    spark.createDataFrame([(1.0, 0)], ["x", "label"]).write.parquet(str(data))
    assert main(["train", str(data), str(tmp_path / "m"), "--master", "local[2]"]) == 2
    assert "featuresCol 'features' not found" in capsys.readouterr().err
