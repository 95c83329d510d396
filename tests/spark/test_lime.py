"""LIME stages on Spark: SparkML kernels equal SparkML, known answers, bad input, persistence, photos."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from pyspark.ml import PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.feature import SQLTransformer, VectorAssembler
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import IntegerType, StructField, StructType

from irbis.kernels.blocks import Tensor
from irbis.kernels.image.decode import array_to_struct
from irbis.kernels.sparkml.stage_kernels import sparkml_kernel
from irbis.ml import ImageLIME, TabularLIME, TabularLIMEModel
from irbis.ml.torch_model import TorchModel
from irbis.spark.images import IMAGE_STRUCT

pytestmark = pytest.mark.spark


class Quadrant(torch.nn.Module):
    """Scores an image by the mean of its top-left quadrant only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[2] // 2, x.shape[3] // 2
        return x[:, :, :h, :w].mean(dim=(1, 2, 3)).unsqueeze(1) / 255.0


def _table(spark, rows=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6))
    y = (2.0 * x[:, 1] - 3.0 * x[:, 4] + 0.3 * rng.normal(size=rows) > 0).astype(int)
    schema = StructType([StructField("features", VectorUDT()), StructField("label", IntegerType())])
    return spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(x, y)], schema)


@pytest.fixture(scope="module")
def table(spark):
    return _table(spark)


@pytest.fixture(scope="module")
def lr_model(table):
    return LogisticRegression(maxIter=50).fit(table)


def _images(spark):
    from skimage import data

    photos = [data.chelsea()[::4, ::4, ::-1], data.coffee()[::6, ::6, ::-1]]
    rows = [(i, array_to_struct(p.copy(), f"p{i}")) for i, p in enumerate(photos)] + [(2, None)]
    schema = StructType([StructField("id", IntegerType()), StructField("image", IMAGE_STRUCT, True)])
    return spark.createDataFrame(rows, schema).repartition(2), photos


# -- the SparkML kernel registry ------------------------------------------------------------------
@pytest.mark.parametrize("family,threshold", [("binomial", 0.5), ("binomial", 0.3), ("multinomial", 0.5)])
def test_logistic_regression_kernel_equals_sparkml(spark, table, family, threshold):
    from pyspark.sql import functions as F

    df = table if family == "binomial" else table.withColumn("label", (F.col("label") + (F.rand(1) > 0.6).cast("int")))
    model = LogisticRegression(family=family, threshold=threshold, maxIter=30).fit(df)
    rows = model.transform(df).select("features", "probability", "rawPrediction", "prediction").collect()
    x = np.array([r.features.toArray() for r in rows])
    out = sparkml_kernel(model).fn({"features": Tensor(x, np.ones(len(x), bool))})
    np.testing.assert_allclose(out["probability"].values, [r.probability.toArray() for r in rows], atol=1e-9)
    np.testing.assert_allclose(out["rawPrediction"].values, [r.rawPrediction.toArray() for r in rows], atol=1e-9)
    np.testing.assert_array_equal(out["prediction"], [r.prediction for r in rows])


def test_vector_assembler_kernel_equals_sparkml(spark):
    from pyspark.sql.types import DoubleType

    schema = StructType([StructField("a", DoubleType()), StructField("v", VectorUDT()),
                         StructField("b", IntegerType())])
    df = spark.createDataFrame([(1.0, Vectors.dense([2.0, 3.0]), 4), (5.0, Vectors.dense([6.0, 7.0]), 8)], schema)
    stage = VectorAssembler(inputCols=["a", "v", "b"], outputCol="out")
    expected = [r.out.toArray() for r in stage.transform(df).collect()]
    blocks = {"a": np.array([1.0, 5.0]), "v": Tensor(np.array([[2.0, 3.0], [6.0, 7.0]]), np.ones(2, bool)),
              "b": np.array([4, 8])}
    np.testing.assert_array_equal(sparkml_kernel(stage).fn(blocks)["out"].values, expected)


# -- known answers on Spark ----------------------------------------------------------------------
def test_image_lime_on_spark_finds_the_quadrant_and_gives_null_images_a_reason(spark):
    df, photos = _images(spark)
    model = TorchModel.from_module(Quadrant(), inputCol="image", outputCol="score")
    lime = ImageLIME(model=model, targetCol="score", numSamples=150, cellSize=12.0, miniBatchSize=50)
    rows = {r.id: r for r in lime.transform(df).collect()}
    assert rows[2].weights is None and rows[2].explainError == "the image is null"
    for i, photo in enumerate(photos):
        row = rows[i]
        assert row.explainError is None and row.r2[0] > 0.99
        segments = np.array(row.superpixels).reshape(photo.shape[:2])
        inside = np.zeros(segments.shape, bool)
        inside[: segments.shape[0] // 2, : segments.shape[1] // 2] = True
        for label in np.argsort(-np.array(row.weights[0]))[:3]:
            assert inside[segments == label].mean() > 0.5
    local = lime.transform(df.toPandas()).set_index("id")
    np.testing.assert_allclose(local["weights"][0][0], rows[0].weights[0], atol=1e-6)


def test_tabular_lime_on_spark_ranks_the_two_features_of_the_model_first(spark, table, lr_model):
    lime = TabularLIME(model=lr_model, inputCol="features", targetClasses=[1], numSamples=400).fit(table)
    assert isinstance(lime, TabularLIMEModel) and len(lime.stats().mean) == 6
    rows = lime.transform(table.limit(20)).collect()
    for row in rows:
        top = np.argsort(-np.abs(row.weights[0]))[:2]
        assert set(top) == {1, 4} and row.weights[0][1] > 0 > row.weights[0][4]


def test_a_model_without_pandas_kernels_runs_as_spark_jobs_and_says_so(spark, table, caplog):
    scaler = SQLTransformer(statement="SELECT *, features AS scaled FROM __THIS__")  # a stage with no kernel
    lr = LogisticRegression(featuresCol="scaled", maxIter=30).fit(scaler.transform(table))
    lime = TabularLIME(model=PipelineModel([scaler, lr]), targetClasses=[1], numSamples=100).fit(table)
    with caplog.at_level(logging.WARNING, logger="irbis.explain"):
        rows = lime.transform(table.limit(3)).collect()
    assert "Spark job" in caplog.text and len(rows) == 3
    for row in rows:
        assert set(np.argsort(-np.abs(row.weights[0]))[:2]) == {1, 4}


# -- bad input -----------------------------------------------------------------------------------
def test_bad_input_gets_errors_naming_the_value(spark, table, lr_model):
    fitted = TabularLIME(model=lr_model, targetCol="scores").fit(table)
    with pytest.raises(ValueError, match="does not produce targetCol 'scores'.*probability"):
        fitted.transform(table).collect()
    with pytest.raises(ValueError, match="numSamples=4 is below the number of features .6."):
        TabularLIME(model=lr_model, numSamples=4).fit(table).transform(table)
    with pytest.raises(Exception, match="target class 5 is out of range: the model's 'probability' has 2"):
        TabularLIME(model=lr_model, targetClasses=[5], numSamples=20).fit(table).transform(table).collect()
    with pytest.raises(ValueError, match="targetClasses"):
        ImageLIME(targetClasses=[-1])
    with pytest.raises(TypeError, match="model must be a fitted Transformer"):
        ImageLIME(model="not a model")
    tiny = np.zeros((8, 8, 3), np.uint8)
    schema = StructType([StructField("id", IntegerType()), StructField("image", IMAGE_STRUCT, True)])
    df = spark.createDataFrame([(0, array_to_struct(_images(spark)[1][0].copy())), (1, array_to_struct(tiny))],
                               schema)
    lime = ImageLIME(model=TorchModel.from_module(Quadrant(), inputCol="image", outputCol="score"),
                     targetCol="score", numSamples=10, cellSize=12.0)
    reasons = {r.id: r.explainError for r in lime.transform(df).collect()}
    assert "numSamples=10 is below the number of superpixels" in reasons[0]
    assert "8x8 pixels is smaller than one superpixel (cellSize=12)" in reasons[1]
    with pytest.raises(Exception, match="'image': the image of 8x8 pixels is smaller"):
        lime.setErrorCol("").transform(df.where("id = 1")).collect()
    with pytest.raises(Exception, match="does not produce targetCol 'probability'"):
        ImageLIME(model=lime.getModel(), numSamples=200).transform(df).collect()


def test_both_stages_save_and_load_with_their_model(spark, tmp_path, table, lr_model):
    tab = TabularLIME(model=lr_model, targetClasses=[1], numSamples=50).fit(table)
    tab.save(str(tmp_path / "tab"))
    again = TabularLIMEModel.load(str(tmp_path / "tab"))
    assert type(again.getModel()).__name__ == "LogisticRegressionModel"
    assert again.transform(table.limit(5)).collect() == tab.transform(table.limit(5)).collect()
    img = ImageLIME(model=PipelineModel([TorchModel.from_module(Quadrant(), inputCol="image", outputCol="s")]),
                    targetCol="s", numSamples=60, cellSize=12.0)
    img.save(str(tmp_path / "img"))
    loaded = ImageLIME.load(str(tmp_path / "img"))
    df, _ = _images(spark)
    assert loaded.getNumSamples() == 60 and isinstance(loaded.getModel(), PipelineModel)
    assert sorted(loaded.transform(df).collect()) == sorted(img.transform(df).collect())


# -- real photographs with EfficientNet-Lite0 ----------------------------------------------------
def test_image_lime_finds_the_cat_that_efficientnet_sees(spark, tmp_path):
    """A photograph whose answer is known: the cat of scikit-image's ``chelsea`` in one corner of a black
    canvas four times its size. The superpixels that raise the cat classes most must lie on the cat,
    which covers a quarter of the picture."""
    import cv2
    from skimage import data

    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.images import read_images

    cat = data.chelsea()[::2, ::2, ::-1]
    h, w = cat.shape[:2]
    canvas = np.zeros((2 * h, 2 * w, 3), np.uint8)
    canvas[h:, w:] = cat
    cv2.imwrite(str(tmp_path / "cat.png"), canvas)
    on_cat = np.zeros(canvas.shape[:2], bool)
    on_cat[h:, w:] = True
    net = ImageFeaturizer(inputCol="image", outputCol="logits", cutOutputLayers=0)
    lime = ImageLIME(model=net, targetCol="logits", targetClasses=[285, 281], numSamples=48, cellSize=75.0,
                     miniBatchSize=48)
    row = lime.transform(read_images(str(tmp_path / "cat.png"), spark=spark)).collect()[0]
    assert row.explainError is None and len(row.weights) == 2
    segments = np.array(row.superpixels).reshape(on_cat.shape)
    for weights in row.weights:
        top = np.argsort(-np.array(weights))[:3]
        assert on_cat[np.isin(segments, top)].mean() > 0.75, (on_cat.mean(), weights)  # chance: 0.25
