"""The engine Param on real Spark: every engine equals eager PyTorch, cut at inner layers, and persists."""

from __future__ import annotations

import cv2
import numpy as np
import pandas as pd
import pytest
import torch
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import IntegerType, StructField, StructType
from skimage import data as skdata

from irbis import TorchModel
from irbis.kernels.engines import ENGINES
from irbis.ml.featurizer import ImageFeaturizer
from irbis.ml.params import ParamValueError
from irbis.models import build_model

OPTIONS = {"in_features": 64, "hidden": 32, "out_features": 10}
EXPORTED = [name for name in ("onnxruntime", "openvino") if ENGINES[name].installed()]


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    return (load_digits().data[:40] / 16.0).astype(np.float32)


def test_engine_param_is_checked_when_set():
    assert TorchModel().getEngine() == "auto" and ImageFeaturizer().getEngine() == "auto"
    with pytest.raises(ParamValueError, match="engine='tensorrt'.*'onnxruntime', 'openvino'"):
        TorchModel(engine="tensorrt")
    with pytest.raises(ParamValueError, match="engine"):
        ImageFeaturizer().setEngine("onnx")


@pytest.mark.spark
@pytest.mark.parametrize("engine", EXPORTED + ["auto"])
def test_torch_model_engines_equal_eager_at_inner_layers_and_persist(spark, digits, tmp_path, engine):
    torch.manual_seed(1)
    net = build_model("mlp", **OPTIONS).eval()
    layer = [name for name, _ in net.named_modules() if name][1]
    seen = []
    handle = net.get_submodule(layer).register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.no_grad():
        final = net(torch.from_numpy(digits)).numpy()
    handle.remove()
    rows = [(i, Vectors.dense(x.tolist())) for i, x in enumerate(digits)] + [(len(digits), None)]
    df = spark.createDataFrame(rows, StructType([StructField("id", IntegerType()),
                                                  StructField("x", VectorUDT())])).repartition(2)
    stages = [TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="y",
                                     engine=engine, miniBatchSize=8),
              TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="h",
                                     engine=engine, outputLayer=layer)]
    Pipeline(stages=stages).fit(df).save(str(tmp_path / "p"))
    loaded = PipelineModel.load(str(tmp_path / "p"))
    assert [s.getEngine() for s in loaded.stages] == [engine, engine]
    out = {r.id: r for r in loaded.transform(df).collect()}
    assert out[len(digits)].y is None
    got_y = np.stack([out[i].y.toArray() for i in range(len(digits))])
    got_h = np.stack([out[i].h.toArray() for i in range(len(digits))])
    np.testing.assert_allclose(got_y, final, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_h, seen[0].numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", EXPORTED)
def test_image_featurizer_engines_equal_eager(engine):
    photos = [cv2.imencode(".jpg", img[:, :, ::-1])[1].tobytes() for img in (skdata.coffee(), skdata.chelsea())]
    frame = pd.DataFrame({"b": photos})
    eager = ImageFeaturizer(inputCol="b", engine="torch").transform(frame)["features"]
    other = ImageFeaturizer(inputCol="b", engine=engine).transform(frame)["features"]
    for a, b in zip(eager, other):
        assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(a).max())
