"""The command line's Spark jobs: classify, featurize and train, on the test run's session."""

from __future__ import annotations

import json

import numpy as np
import pytest

from irbis.cli import main

pytestmark = [pytest.mark.spark,
              pytest.mark.classic_only(reason="the command runs on its own session from --master local[2], a "
                                              "classic one, which a Spark Connect client process cannot have")]


def test_classify_names_the_photographs(spark, tiny_images, capsys):
    folder = str(tiny_images["coffee"].parent)
    assert main(["classify", folder, "--master", "local[2]", "--top", "3"]) == 0
    out = capsys.readouterr().out
    coffee = out[out.index("coffee.jpg"):].splitlines()[1:4]
    assert any("espresso" in line for line in coffee), out


def test_featurize_writes_the_features_that_image_featurizer_gives(spark, tiny_images, tmp_path, capsys):
    import shutil
    from pathlib import Path

    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.images import read_images

    folder = tmp_path / "photos"
    folder.mkdir()
    for path in tiny_images.values():
        shutil.copy(path, folder / path.name)
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "features.parquet"
    assert main(["featurize", str(folder), "--output", str(out), "--master", "local[2]"]) == 0
    written = {Path(r.path).name: np.asarray(r.features) for r in spark.read.parquet(str(out)).collect()}
    assert dict(spark.read.parquet(str(out)).dtypes)["features"] == "array<float>"  # what pandas reads as float32
    stage = ImageFeaturizer(inputCol="image", outputCol="features", cutOutputLayers=1, precision="fp32")
    images = read_images([str(p) for p in tiny_images.values()], spark=spark)
    expected = {Path(r.path).name: r.features.toArray() for r in stage.transform(images).collect()}
    assert sorted(written) == sorted(expected) == sorted(p.name for p in tiny_images.values())
    for name, features in expected.items():
        assert features.shape == (1280,)
        np.testing.assert_allclose(written[name], features, rtol=1e-4, atol=1e-4 * np.abs(features).max())


def test_train_fits_and_saves_a_torch_model_that_classifies_held_out_digits(spark, tmp_path, capsys):
    from pyspark.ml.linalg import Vectors
    from sklearn.datasets import load_digits

    from irbis import TorchModel

    x, y = load_digits(return_X_y=True)
    rows = [(Vectors.dense(a / 16.0), int(b)) for a, b in zip(x, y)]
    data = tmp_path / "digits.parquet"
    spark.createDataFrame(rows[:1000], ["features", "label"]).write.parquet(str(data))
    options = json.dumps({"in_features": 64, "hidden": 32, "out_features": 10})
    model_dir = tmp_path / "model"
    code = main(["train", str(data), "--task", "vectors", "--output", str(model_dir), "--network-options", options,
                 "--epochs", "3", "--workers", "2", "--learning-rate", "0.01", "--master", "local[2]"])
    assert code == 0
    assert "epoch 3" in capsys.readouterr().out
    loaded = TorchModel.load(str(model_dir))
    assert len(loaded.training_summary) == 3
    held_out = spark.createDataFrame(rows[1000:], ["features", "label"])
    scored = loaded.transform(held_out).select("label", loaded.getOutputCol()).collect()
    accuracy = np.mean([int(np.argmax(r[1])) == r.label for r in scored])
    assert len(scored) == len(y) - 1000 and accuracy > 0.7, accuracy  # chance 0.1; plain PyTorch, same steps: 0.87-0.89


def test_train_reports_a_missing_column(spark, tmp_path, capsys):
    data = tmp_path / "bad.parquet"
    spark.createDataFrame([(1.0, 0)], ["x", "label"]).write.parquet(str(data))
    code = main(["train", str(data), "--task", "vectors", "--output", str(tmp_path / "m"),
                 "--master", "local[2]"])
    assert code == 2
    assert "inputCol 'features' not found" in capsys.readouterr().err


def test_train_on_a_folder_of_images_saves_a_pipeline_that_names_the_classes(spark, tmp_path, capsys):
    """``irbis train FOLDER --task image --output OUT``: <label>/ sub-folders of photographs in, a fitted
    PipelineModel out, whose predictions are the folders' names; it tells the cat from the coffee cup on
    held-out crops."""
    import cv2
    from pyspark.ml import PipelineModel
    from skimage import data

    rng = np.random.default_rng(0)
    held_out = []
    for name, photo in (("cat", data.chelsea()), ("cup", data.coffee())):
        (tmp_path / "images" / name / "a").mkdir(parents=True)
        h, w = photo.shape[:2]
        for i in range(14):
            s = int(rng.integers(min(h, w) // 3, min(h, w)))
            y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
            jpeg = cv2.imencode(".jpg", cv2.resize(np.ascontiguousarray(photo[y:y + s, x:x + s, ::-1]), (128, 128)))[1]
            if i < 10:
                (tmp_path / "images" / name / "a" / f"{i}.jpg").write_bytes(jpeg.tobytes())
            else:
                held_out.append((jpeg.tobytes(), name))
    out = str(tmp_path / "model")
    assert main(["train", str(tmp_path / "images"), "--task", "image", "--output", out, "--epochs", "1",
                 "--batch-size", "8", "--freeze-until", "_blocks.14", "--master", "local[2]"]) == 0
    assert "IndexToString over ['cat', 'cup']" in capsys.readouterr().out
    model = PipelineModel.load(out)
    scored = model.transform(spark.createDataFrame(held_out, "content binary, truth string")).toPandas()
    assert (scored["predictedLabel"] == scored["truth"]).mean() >= 0.75


def test_train_help_lists_every_strategy(capsys):
    from irbis.train.strategies import STRATEGIES

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in STRATEGIES), text
