"""calibrationData given as a DataFrame on real Spark: the same int8 network as a folder of the same rows,
persistence where the cache folder is gone, and the errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from pyspark.ml import PipelineModel
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import IntegerType, StructField, StructType
from skimage import data as skdata

from irbis import TorchModel
from irbis.errors import ColumnNotFoundError
from irbis.kernels.engines import ENGINES
from irbis.kernels.image.network_input import preprocess_images
from irbis.ml.image_featurizer import ImageFeaturizer
from irbis.models import build_model, get_entry
from irbis.spark.images import read_images

pytestmark = [pytest.mark.spark,
              pytest.mark.skipif(not ENGINES["onnxruntime"].installed(), reason="needs onnxruntime")]
OPTIONS = {"in_features": 64, "hidden": 32, "out_features": 10}
SCHEMA = StructType([StructField("id", IntegerType()), StructField("x", VectorUDT())])


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("IRBIS_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    return (load_digits().data[:40] / 16.0).astype(np.float32)


@pytest.fixture
def frame(spark, digits):
    return spark.createDataFrame([(i, Vectors.dense(x.tolist())) for i, x in enumerate(digits)] + [(99, None)],
                                 SCHEMA).repartition(2)


def int8_mlp(**params):
    torch.manual_seed(2)
    net = build_model("mlp", **OPTIONS).eval()
    params = {"engine": "onnxruntime", "precision": "int8", **params}
    return TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="y", **params)


def scores(stage, df, col="y"):
    return np.stack([r[col].toArray() for r in stage.transform(df).where(f"{col} is not null").orderBy("id").collect()])


def test_torch_model_calibrated_on_a_frame_equals_a_folder_of_the_same_rows(spark, frame, digits, tmp_path):
    stage = int8_mlp(calibrationData=frame)
    folder = Path(stage.getCalibrationData())
    sample = np.load(folder / "rows.npy")
    assert sample.shape == (40, 64)  # the null row is left out
    np.testing.assert_array_equal(np.sort(sample, axis=0), np.sort(digits, axis=0))
    assert int8_mlp().setCalibrationData(frame).getCalibrationData() == str(folder)  # seeded: same folder
    own = tmp_path / "own"
    own.mkdir()
    np.save(own / "rows.npy", digits)
    by_frame, by_folder = scores(stage, frame), scores(int8_mlp(calibrationData=str(own)), frame)
    np.testing.assert_allclose(by_frame, by_folder, rtol=1e-5, atol=1e-5)
    fp32 = int8_mlp(precision="fp32", engine="torch")
    assert not np.allclose(by_frame, scores(fp32, frame), atol=1e-6)  # quantised, not fp32


@pytest.mark.parametrize("uri", [False, True])
def test_saved_pipeline_carries_its_calibration_sample(spark, frame, tmp_path, uri):
    stage = int8_mlp(calibrationData=frame.limit(24))
    before = scores(stage, frame)
    target = tmp_path / "pipeline"
    PipelineModel(stages=[stage]).save(f"file://{target}" if uri else str(target))
    shutil.rmtree(stage.getCalibrationData())  # the cache folder is gone on the loading machine
    metadata = json.loads(next((target / "stages").glob("*/metadata/part-*")).read_text())
    assert metadata["paramMap"]["calibrationData"] == stage.getCalibrationData()
    loaded = PipelineModel.load(f"file://{target}" if uri else str(target)).stages[0]
    assert Path(loaded.getCalibrationData()).name == "calibration"
    assert np.load(Path(loaded.getCalibrationData()) / "rows.npy").shape == (24, 64)
    np.testing.assert_allclose(scores(loaded, frame), before, rtol=1e-5, atol=1e-5)


def test_bad_calibration_frames_are_named(spark, frame):
    with pytest.raises(ColumnNotFoundError, match=r"TorchModel: input column of the calibration DataFrame 'x' "
                                                  r"not found; the DataFrame has columns \['id', 'z'\]"):
        int8_mlp().setCalibrationData(frame.withColumnRenamed("x", "z"))
    with pytest.raises(ValueError, match="no non-null rows in column 'x'"):
        int8_mlp(calibrationData=frame.where("id = 99"))
    short = spark.createDataFrame([(0, Vectors.dense([1.0, 2.0]))], SCHEMA)
    with pytest.raises(ValueError, match=r"column 'x': a row has shape \[2\].*expects shape \[64\]"):
        int8_mlp(calibrationData=short)
    stage = int8_mlp()
    with pytest.raises(TypeError, match="column 'id' has type int"):
        stage.setInputCol("id").setCalibrationData(frame)
    assert stage.getCalibrationData() == ""  # a refused sample leaves the Param as it was
    with pytest.raises(TypeError, match="input column 'x' must be an image struct or binary"):
        ImageFeaturizer(inputCol="x", calibrationData=frame)


def test_featurizer_calibrated_on_an_image_frame_equals_a_folder_of_the_same_rows(spark, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("coffee", "chelsea", "astronaut", "rocket"):
        cv2.imwrite(str(photos / f"{name}.png"), getattr(skdata, name)()[::8, ::8, ::-1])
    images = read_images(str(photos), spark=spark).withColumnRenamed("path", "id")
    torch.manual_seed(3)
    net = build_model("small_cnn").eval()
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "architecture.json").write_text(json.dumps({"architecture": "small_cnn", "options": {}}))
    torch.save(net.state_dict(), weights / "weights.pt")
    params = dict(network="small_cnn_cifar", weights=str(weights), cutOutputLayers=0, engine="onnxruntime",
                  precision="int8", outputCol="y")
    by_frame = ImageFeaturizer(calibrationData=images, **params)
    structs = [r.image.asDict() for r in images.orderBy("id").collect()]
    own = tmp_path / "own"
    own.mkdir()
    np.save(own / "rows.npy", preprocess_images(structs, get_entry("small_cnn_cifar").preprocessing)[0])
    by_folder = ImageFeaturizer(calibrationData=str(own), **params)
    np.testing.assert_allclose(np.sort(np.load(Path(by_frame.getCalibrationData()) / "rows.npy"), axis=0),
                               np.sort(np.load(own / "rows.npy"), axis=0))
    np.testing.assert_allclose(scores(by_frame, images), scores(by_folder, images), rtol=1e-5, atol=1e-5)
    by_frame.save(str(tmp_path / "featurizer"))
    loaded = ImageFeaturizer.load(str(tmp_path / "featurizer"))
    assert loaded.getCalibrationData().startswith(str(tmp_path / "featurizer"))
    assert not ImageFeaturizer(**params)._has_extra()  # nothing to save without a sample
