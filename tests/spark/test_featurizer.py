"""ImageFeaturizer on real photographs: ImageNet classes end to end, and transfer learning."""
from __future__ import annotations

import cv2
import numpy as np
import pandas as pd
import pytest
from skimage import data as skdata

from irbis.ml.image_featurizer import ImageFeaturizer
from irbis.spark.images import read_images

# ImageNet-1k indices accepted in the top 5 (see the research baselines: same weights, same photos).
EXPECTED = {"chelsea": {281, 282, 285}, "coffee": {967}, "rocket": {657, 744, 812}}


def test_params_pick_the_entry_layers_and_validate():
    assert ImageFeaturizer(cutOutputLayers=0).feature_layer() == ""
    assert ImageFeaturizer(cutOutputLayers=2).feature_layer() == "_head_act"
    assert ImageFeaturizer(network="resnet50").feature_layer() == "flatten"
    with pytest.raises(ValueError, match="supports cutting 1..5 layers"):
        ImageFeaturizer(cutOutputLayers=9)
    with pytest.raises(ValueError, match="Param network='vgg' is not allowed; expected one of 'efficientnet_lite0'"):
        ImageFeaturizer(network="vgg")


def test_explicit_output_layer_wins_over_cut_output_layers():
    feat = ImageFeaturizer(cutOutputLayers=2, outputLayer="_blocks.10")
    assert feat.getOutputLayer() == "_blocks.10" and feat.feature_layer() == "_blocks.10"
    assert feat.setOutputLayer("").feature_layer() == "_head_act"
    with pytest.raises(ValueError, match="outputLayer 'nope' is not a module of network 'efficientnet_lite0'"):
        feat.setOutputLayer("nope")
    assert feat.getOutputLayer() == ""  # a refused value leaves the stage as it was
    photo = cv2.imencode(".jpg", skdata.coffee()[:, :, ::-1])[1].tobytes()
    frame = pd.DataFrame({"b": [photo]})
    by_name = feat.copy({feat.outputLayer: "_blocks.15", feat.inputCol: "b"}).transform(frame)["features"][0]
    by_cut = ImageFeaturizer(inputCol="b", cutOutputLayers=3).transform(frame)["features"][0]
    assert by_name.shape == (320 * 7 * 7,)
    np.testing.assert_array_equal(by_name, by_cut)


def test_several_layers_in_one_pass_equal_single_layer_featurizers_and_are_validated():
    photos = [cv2.imencode(".jpg", im[:, :, ::-1])[1].tobytes() for im in (skdata.coffee(), skdata.chelsea())]
    frame = pd.DataFrame({"b": photos + [b"\xff\xd8 truncated"]})
    both = ImageFeaturizer(inputCol="b", outputLayers=["_flatten", "_blocks.15"], outputCols=["pooled", "block"],
                           errorCol="why")
    out = both.transform(frame)
    assert list(out.columns) == ["b", "pooled", "block", "why"]
    assert out["pooled"][2] is None and out["block"][2] is None and "truncated" in out["why"][2]
    pooled = ImageFeaturizer(inputCol="b", outputCol="pooled", cutOutputLayers=1).transform(frame[:2])["pooled"]
    block = ImageFeaturizer(inputCol="b", outputCol="block", outputLayer="_blocks.15").transform(frame[:2])["block"]
    for i in range(2):
        assert out["pooled"][i].shape == (1280,) and out["block"][i].shape == (320 * 7 * 7,)
        np.testing.assert_allclose(out["pooled"][i], pooled[i], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["block"][i], block[i], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"outputLayers: layer '_block.15' is not a module of the network; "
                                         r"the nearest names: \['_blocks.15'"):
        both.setOutputLayers(["_flatten", "_block.15"])
    assert both.getOutputLayers() == ["_flatten", "_blocks.15"]  # a refused value leaves the stage as it was
    with pytest.raises(ValueError, match=r"same length.*found 2 layer\(s\).*and 1 column\(s\) \['pooled'\]"):
        both.setOutputCols(["pooled"])
    with pytest.raises(ValueError, match="must each name different items"):
        ImageFeaturizer(outputLayers=["_flatten", "_blocks.15"], outputCols=["f", "f"])


@pytest.mark.spark
def test_several_layers_on_spark_persist(spark, tmp_path):
    from pyspark.sql.types import BinaryType, StructType

    photo = cv2.imencode(".jpg", skdata.coffee()[:, :, ::-1])[1].tobytes()
    df = spark.createDataFrame([(photo,)], StructType().add("b", BinaryType()))
    stage = ImageFeaturizer(inputCol="b", outputLayers=["_blocks.15", "_flatten"], outputCols=["block", "pooled"],
                            miniBatchSize=4)
    stage.save(str(tmp_path / "feat"))
    loaded = ImageFeaturizer.load(str(tmp_path / "feat"))
    assert loaded.layer_columns() == [("_blocks.15", "block"), ("_flatten", "pooled")]
    row = loaded.transform(df).select("block", "pooled").first()
    single = ImageFeaturizer(inputCol="b", outputCol="pooled").transform(df).select("pooled").first()
    assert row.block.size == 320 * 7 * 7
    np.testing.assert_allclose(row.pooled.toArray(), single.pooled.toArray(), rtol=1e-5, atol=1e-5)


def test_pandas_path_bad_bytes_give_null_and_error():
    good = cv2.imencode(".jpg", skdata.coffee()[:, :, ::-1])[1].tobytes()
    frame = pd.DataFrame({"b": [good, b"\xff\xd8 truncated", None]})
    out = ImageFeaturizer(inputCol="b", outputCol="f", errorCol="why").transform(frame)
    assert out["f"][0].shape == (1280,) and out["why"][0] is None
    assert out["f"][1] is None and "corrupt or truncated jpeg" in out["why"][1]
    assert out["f"][2] is None and out["why"][2] is None


@pytest.mark.spark
def test_pretrained_top5_on_real_photos(spark, tiny_images):
    folder = str(next(iter(tiny_images.values())).parent)
    scores = ImageFeaturizer(inputCol="image", outputCol="scores", cutOutputLayers=0, miniBatchSize=2)
    rows = scores.transform(read_images(folder)).select("path", "scores").collect()
    assert len(rows) == 3
    for row in rows:
        name = row.path.rsplit("/", 1)[-1].split(".")[0]
        logits = row.scores.toArray()
        assert logits.shape == (1000,)
        top5 = set(np.argsort(-logits)[:5].tolist())
        assert top5 & EXPECTED[name], (name, sorted(top5))


def _texture_crops(image, count, rng, size=64):
    """Random crops with the same mean and contrast: raw pixels carry no easy signal."""
    crops = []
    for _ in range(count):
        y, x = rng.integers(0, image.shape[0] - size), rng.integers(0, image.shape[1] - size)
        c = image[y:y + size, x:x + size].astype(np.float32)
        crops.append(np.clip((c - c.mean()) / (c.std() + 1e-6) * 40 + 128, 0, 255).astype(np.uint8))
    return crops


@pytest.mark.spark
def test_transfer_learning_beats_raw_pixels(spark):
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql.types import BinaryType, DoubleType, StringType, StructType

    rng = np.random.default_rng(0)
    grass, gravel = skdata.grass(), skdata.gravel()
    rows = []
    for split, cols in (("train", slice(0, 256)), ("test", slice(256, 512))):  # disjoint halves
        for label, texture in ((0.0, grass), (1.0, gravel)):
            for crop in _texture_crops(texture[:, cols], 20, rng):
                png = cv2.imencode(".png", crop)[1].tobytes()
                rows.append((split, label, png, Vectors.dense(crop.reshape(-1) / 255.0)))
    schema = (StructType().add("split", StringType()).add("label", DoubleType())
              .add("content", BinaryType()).add("pixels", VectorUDT()))
    df = spark.createDataFrame(rows, schema)
    feats = ImageFeaturizer(inputCol="content", outputCol="features", miniBatchSize=16).transform(df)
    feats = feats.cache()
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy")
    results = {}
    for column in ("features", "pixels"):
        lr = LogisticRegression(featuresCol=column, maxIter=50, regParam=0.01)
        model = lr.fit(feats.filter("split = 'train'"))
        results[column] = accuracy.evaluate(model.transform(feats.filter("split = 'test'")))
    feats.unpersist()
    print("test accuracy", results)
    assert results["features"] >= 0.9, results
    assert results["features"] - results["pixels"] >= 0.2, results
