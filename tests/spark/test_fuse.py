"""Fused stages: one Python pass gives what the stages give one by one, and saves like a stage."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from pyspark.ml import PipelineModel

from irbis.ml import ImageTransformer, TorchModel, fuse
from irbis.ml.fused import FusedStages

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def photos(spark, tiny_images):
    from irbis.spark.images import read_images

    return read_images([str(p) for p in tiny_images.values()], spark=spark).select("path", "image")


def _stages():
    torch.manual_seed(0)
    crop = (ImageTransformer(inputCol="image", outputCol="crop").resize(40, 40, keepAspectRatio=True)
            .centerCrop(32, 32).flip(1).colorFormat("RGB"))
    net = TorchModel.from_module(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                                     torch.nn.Flatten()),
                                 inputCol="crop", outputCol="scores", inputShape=[3, 32, 32])
    return [crop, net]


def _scores(df):
    return {r.path: np.asarray(r.scores.toArray()) for r in df.select("path", "scores").collect()}


def test_fused_pass_equals_the_stages_and_drops_the_intermediate(spark, photos, tmp_path):
    stages = _stages()
    plain = PipelineModel(stages).transform(photos)
    fused_model = fuse(PipelineModel(stages))
    assert [type(s).__name__ for s in fused_model.stages] == ["FusedStages"]
    fused = fused_model.transform(photos)
    assert "crop" not in fused.columns and "scores" in fused.columns
    expected, found = _scores(plain), _scores(fused)
    assert expected.keys() == found.keys() and len(found) == 3
    for path in expected:
        np.testing.assert_allclose(found[path], expected[path], rtol=1e-5, atol=1e-6)

    fused_model.save(str(tmp_path / "fused"))
    loaded = PipelineModel.load(str(tmp_path / "fused"))
    assert isinstance(loaded.stages[0], FusedStages)
    again = _scores(loaded.transform(photos))
    for path in expected:
        np.testing.assert_allclose(again[path], expected[path], rtol=1e-5, atol=1e-6)


def test_keep_and_later_readers_keep_the_intermediate(spark, photos):
    from pyspark.ml.feature import VectorAssembler

    kept = fuse(_stages(), keep=["crop"]).transform(photos)
    assert {"crop", "scores"} <= set(kept.columns)
    read_later = fuse(_stages() + [VectorAssembler(inputCols=["crop"], outputCol="v")])
    assert "crop" in [n for n, _ in read_later.stages[0]._output_columns()]


def test_only_block_kernel_stages_fuse():
    from irbis.ml import SelectColumns

    with pytest.raises(TypeError, match=r"\['SelectColumns'\] cannot be fused"):
        FusedStages().setStages([SelectColumns(cols=["a"])])


def test_output_batches_split_under_a_small_byte_cap(spark, photos):
    """With a cap below one batch's output, the stage slices the batch and loses no row."""
    stage = ImageTransformer(inputCol="image", outputCol="x", outputFormat="array").resize(64, 64)
    expected = {r.path: r.x for r in stage.transform(photos).collect()}
    key = "spark.sql.execution.arrow.maxBytesPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, str(64 * 64 * 3 * 4 + 1))  # one row's output per slice
    try:
        found = {r.path: r.x for r in stage.transform(photos.repartition(1)).collect()}
    finally:
        spark.conf.set(key, before)
    assert found == expected and len(found) == 3
