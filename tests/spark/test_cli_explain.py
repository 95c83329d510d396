"""``irbis explain``: the demo's kind of saved pipeline (ImageFeaturizer + LogisticRegression) explained."""
from __future__ import annotations

import shutil

import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.sql import functions as F

from irbis.cli import main

pytestmark = [pytest.mark.spark,
              pytest.mark.classic_only(reason="the command runs on its own session from --master local[2], a "
                                              "classic one, which a Spark Connect client process cannot have")]


def test_explain_writes_one_overlay_per_image_and_a_page(spark, tiny_images, tmp_path, capsys):
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.images import read_images

    folder = tmp_path / "photos"
    folder.mkdir()
    for path in tiny_images.values():
        shutil.copy(path, folder / path.name)
    (folder / "broken.jpg").write_bytes(b"not an image")
    featurizer = ImageFeaturizer(inputCol="image", outputCol="f1", cutOutputLayers=1)
    train = featurizer.transform(read_images(str(folder), dropInvalid=True, spark=spark))
    train = train.withColumn("y", F.col("path").contains("chelsea").cast("double"))
    lr = LogisticRegression(featuresCol="f1", labelCol="y", maxIter=20).fit(train)
    PipelineModel(stages=[featurizer, lr]).save(str(tmp_path / "model"))
    out = tmp_path / "explained"
    assert main(["explain", str(tmp_path / "model"), str(folder), "--output", str(out), "--samples", "16",
                 "--cell-size", "120", "--master", "local[2]"]) == 0
    assert "explained 3 of 4 images" in capsys.readouterr().out
    page = (out / "index.html").read_text()
    for name in ("chelsea", "coffee", "rocket"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG") and f"{name}.png" in page
    assert "broken.jpg" in page and "no explanation" in page
