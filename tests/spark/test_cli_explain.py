"""``irbis explain``: a saved image pipeline (ImageFeaturizer + LogisticRegression) and a text pipeline explained."""
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


def _one_word_classifier(spark, path: str) -> None:
    """A TextEmbedder on a tiny BERT into a logistic regression fitted on texts whose label is whether the
    word "excellent" is in them: that word alone decides."""
    import numpy as np
    from pyspark.ml import Pipeline

    from irbis.ml import TextEmbedder
    from text_networks import tiny_text_network

    rng = np.random.default_rng(0)
    filler = "the room staff food view bed was were kind clean quiet and small with a at night".split()
    rows = []
    for i in range(160):
        words = list(rng.choice(filler, size=int(rng.integers(5, 12))))
        if i % 2:
            words.insert(int(rng.integers(0, len(words) + 1)), "excellent")
        rows.append((" ".join(words), float(i % 2)))
    frame = spark.createDataFrame(rows, "review string, label double")
    Pipeline(stages=[TextEmbedder(network=tiny_text_network("embedding"), inputCol="review", outputCol="features",
                                  engine="torch"),
                     LogisticRegression(maxIter=200, regParam=0.001)]).fit(frame).save(path)


def test_explain_finds_the_word_that_decides_a_text_classifier(spark, tmp_path, capsys):
    import json

    _one_word_classifier(spark, str(tmp_path / "model"))
    texts = ["the staff were kind and the food excellent at night", "the room was quiet and clean"]
    csv = tmp_path / "reviews.csv"
    csv.write_text("id,review\n" + "".join(f'{i},"{t}"\n' for i, t in enumerate(texts)) + "2,\n")
    runs = {"given": ["--text", texts[0], "--text", texts[1]], "file": [str(csv), "--rows", "3"]}
    for name, source in runs.items():
        out = tmp_path / name
        assert main(["explain", str(tmp_path / "model"), *source, "--output", str(out), "--samples", "200",
                     "--master", "local[2]"]) == 0
        found = json.loads((out / "explanations.json").read_text())
        first = found[0]
        assert first["words"][max(range(len(first["words"])), key=first["weights"].__getitem__)] == "excellent"
        assert first["r2"] > 0.5 and found[1]["weights"] is not None
        page = (out / "index.html").read_text()
        assert 'excellent</span>' in page
        assert (out / f"{first['name'].replace(' ', '_')}.png").read_bytes()[:4] == b"\x89PNG"
    assert found[2]["weights"] is None and found[2]["error"] == "null text" and "no explanation" in page
    assert "explained 2 of 3 texts" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="give either texts"):
        main(["explain", str(tmp_path / "model"), str(csv), "--text", "both", "--master", "local[2]"])
