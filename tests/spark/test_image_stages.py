"""ImageTransformer, UnrollImage, ImageSetAugmenter, ImageDecoder: Spark and pandas paths, persistence."""
from __future__ import annotations

import cv2
import numpy as np
import pandas as pd
import pytest
from pyspark.ml import Pipeline, PipelineModel
from skimage import data as skdata

from irbis.kernels.image.decode import array_to_struct, struct_to_array
from irbis.kernels.image.op_chain import ImageChain
from irbis.ml.image import ImageDecoder, ImageSetAugmenter, ImageTransformer, UnrollImage
from irbis.ml.image_featurizer import ImageFeaturizer
from irbis.spark.images import IMAGE_STRUCT

CAT_BGR = np.ascontiguousarray(skdata.chelsea()[::4, ::4, ::-1])  # 75x113x3
COFFEE_BGR = np.ascontiguousarray(skdata.coffee()[::8, ::8, ::-1])  # 50x75x3


def _frame():
    return pd.DataFrame({"id": [1, 2, 3], "image": [array_to_struct(CAT_BGR, "cat"),
                                                    array_to_struct(COFFEE_BGR, "coffee"), None]})


def _spark_frame(spark):
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("id", LongType()), StructField("image", IMAGE_STRUCT, True)])
    return spark.createDataFrame([(int(r.id), r.image) for r in _frame().itertuples()], schema)


def _chain_transformer(**kwargs):
    return (ImageTransformer(inputCol="image", **kwargs).resize(48, 48, keepAspectRatio=True)
            .centerCrop(40, 40).colorFormat("RGB").normalize([127.0, 120.0, 110.0], 64.0))


def test_transformer_builder_validates_eagerly():
    with pytest.raises(ValueError, match="must be odd|invalid"):
        ImageTransformer().blur(4, 4)
    with pytest.raises(ValueError, match="outputFormat"):
        ImageTransformer(outputFormat="png")
    tr = ImageTransformer(ops='[{"op": "flip", "flip_code": 0}]').threshold(10, 255)
    assert [o["op"] for o in tr.getOps()] == ["flip", "threshold"]


def test_pandas_path_matches_the_kernel_chain():
    tr = _chain_transformer(outputCol="x", outputFormat="array")
    out = tr.transform(_frame())
    expected = ImageChain(tr.getOps())(CAT_BGR).transpose(2, 0, 1).reshape(-1)
    np.testing.assert_allclose(out["x"][0], expected)
    assert out["x"][2] is None and list(out["id"]) == [1, 2, 3]
    aug = ImageSetAugmenter(flipUpDown=True).transform(_frame())
    assert list(aug["id"]) == [1, 1, 1, 2, 2, 2, 3]
    assert list(aug["augmentation"][:3]) == ["original", "flipLeftRight", "flipUpDown"]
    np.testing.assert_array_equal(struct_to_array(aug["image"][1]), CAT_BGR[:, ::-1])
    unrolled = UnrollImage(outputCol="v").transform(_frame())
    np.testing.assert_array_equal(unrolled["v"][1], COFFEE_BGR.transpose(2, 0, 1).reshape(-1))
    png = cv2.imencode(".png", CAT_BGR)[1].tobytes()
    flipped = ImageTransformer(inputCol="b", outputCol="f").flip(0).transform(pd.DataFrame({"b": [png]}))
    np.testing.assert_array_equal(struct_to_array(flipped["f"][0]), CAT_BGR[::-1])
    decoded = ImageDecoder(inputCol="b").transform(pd.DataFrame({"b": [png, b"x"]}))
    np.testing.assert_array_equal(struct_to_array(decoded["image"][0]), CAT_BGR)
    assert decoded["image"][1] is None and "not an image" in decoded["error"][1]


@pytest.mark.spark
def test_spark_transform_chain_unroll_and_augment(spark):
    df = _spark_frame(spark)
    as_image = _chain_transformer(outputCol="img")
    as_vector = _chain_transformer(outputCol="vec", outputFormat="vector")
    out = UnrollImage(inputCol="image", outputCol="pixels").transform(
        as_vector.transform(as_image.transform(df)))
    rows = {r.id: r for r in out.orderBy("id").collect()}
    expected = ImageChain(as_image.getOps())(CAT_BGR)
    np.testing.assert_allclose(struct_to_array(rows[1].img.asDict()), expected)
    assert rows[1].img.mode == 21  # CV_32FC3 after normalize
    np.testing.assert_allclose(rows[1].vec.toArray(), expected.transpose(2, 0, 1).reshape(-1), rtol=1e-6)
    np.testing.assert_array_equal(rows[2].pixels.toArray(), COFFEE_BGR.transpose(2, 0, 1).reshape(-1))
    assert rows[3].img is None and rows[3].vec is None and rows[3].pixels is None


def _pixels(image):
    """A uint8 image struct's pixels read with numpy alone (no irbis decoding)."""
    assert image.mode == cv2.CV_8UC3
    return np.frombuffer(bytes(image.data), np.uint8).reshape(image.height, image.width, image.nChannels)


@pytest.mark.spark
def test_spark_augmenter_emits_each_copy_with_its_pixels(spark):
    aug = ImageSetAugmenter(flipLeftRight=True, flipUpDown=True, cropFraction=0.5,
                            exposureGain=1.5).transform(_spark_frame(spark))
    photos = {1: ("cat", CAT_BGR), 2: ("coffee", COFFEE_BGR)}
    seen = []
    for r in aug.collect():
        seen.append((r.id, r.augmentation))
        if r.id == 3:  # a null image is kept once, without pixels
            assert r.image is None or r.image.data is None
            continue
        origin, photo = photos[r.id]
        (h, w), (ch, cw) = photo.shape[:2], (round(photo.shape[0] / 2), round(photo.shape[1] / 2))
        centre = photo[(h - ch) // 2:(h - ch) // 2 + ch, (w - cw) // 2:(w - cw) // 2 + cw]
        expected = {"original": photo, "flipLeftRight": np.flip(photo, axis=1), "flipUpDown": np.flip(photo, axis=0),
                    "crop": cv2.resize(centre, (w, h), interpolation=cv2.INTER_LINEAR),
                    "exposure": np.clip(photo.astype(np.float32) * 1.5, 0, 255).astype(np.uint8)}[r.augmentation]
        assert r.image.origin == origin
        np.testing.assert_array_equal(_pixels(r.image), expected, err_msg=f"{origin} {r.augmentation}")
    variants = ["original", "flipLeftRight", "flipUpDown", "crop", "exposure"]
    assert sorted(seen) == sorted([(i, v) for i in (1, 2) for v in variants] + [(3, "original")])


@pytest.mark.spark
def test_spark_op_error_names_op_image_and_arguments(spark):
    df = _spark_frame(spark)
    bad = ImageTransformer(outputCol="c", errorCol="why").crop(0, 0, 60, 100)
    rows = {r.id: r for r in bad.transform(df).collect()}
    assert rows[1].why is None and (rows[1].c.height, rows[1].c.width) == (60, 100)
    assert rows[2].c is None
    assert "image 'coffee': crop(x=0, y=0, height=60, width=100) on a 50x75x3 uint8" in rows[2].why
    with pytest.raises(Exception, match=r"crop\(x=0, y=0, height=60, width=100\) on a 50x75x3"):
        ImageTransformer(outputCol="c").crop(0, 0, 60, 100).transform(df).collect()


@pytest.mark.spark
def test_pipeline_of_image_stages_saves_and_loads(spark, tmp_path):
    stages = [ImageDecoder(inputCol="content", outputCol="image", originCol="path", maxPixels=10**6),
              _chain_transformer(outputCol="x", outputFormat="vector"),
              UnrollImage(inputCol="image", outputCol="u"),
              ImageSetAugmenter(inputCol="image", outputCol="image", flipUpDown=True),
              ImageFeaturizer(inputCol="image", outputCol="f", cutOutputLayers=2, miniBatchSize=8)]
    model = Pipeline(stages=stages).fit(spark.createDataFrame([(1,)], "a int"))
    model.write().overwrite().save(str(tmp_path / "pipe"))
    loaded = PipelineModel.load(str(tmp_path / "pipe"))
    for before, after in zip(stages, loaded.stages):
        assert type(after) is type(before)
        assert {p.name: v for p, v in after.extractParamMap().items()} == \
               {p.name: v for p, v in before.extractParamMap().items()}
    frame = pd.DataFrame({"content": [cv2.imencode(".jpg", CAT_BGR)[1].tobytes()], "path": ["cat.jpg"]})
    out = PipelineModel(loaded.stages[:4]).transform(frame)
    assert len(out) == 3 and out["x"][0].shape == (3 * 40 * 40,) and out["image"][0]["origin"] == "cat.jpg"
