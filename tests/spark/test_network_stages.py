"""TorchModel and ONNXModel on real Spark: equality with PyTorch / ONNX Runtime, persistence, streaming, errors."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pandas as pd
import pytest
import torch
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import IntegerType, StructField, StructType
from pyspark.sql.utils import PythonException

from irbis import ONNXModel, TorchModel
from irbis.models import build_model

pytestmark = pytest.mark.spark

OPTIONS = {"in_features": 64, "hidden": 32, "out_features": 10}


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    return (load_digits().data[:40] / 16.0).astype(np.float32)


@pytest.fixture(scope="module")
def net():
    return build_model("mlp", **OPTIONS)


@pytest.fixture(scope="module")
def digits_df(spark, digits):
    rows = [(i, Vectors.dense(x.tolist())) for i, x in enumerate(digits)] + [(len(digits), None)]
    schema = StructType([StructField("id", IntegerType()), StructField("features", VectorUDT())])
    return spark.createDataFrame(rows, schema).repartition(2)


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory, net):
    path = tmp_path_factory.mktemp("onnx") / "mlp.onnx"
    torch.onnx.export(net, (torch.zeros(1, 64),), str(path), input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "n"}, "logits": {0: "n"}}, dynamo=False)
    return path


def _by_id(df, col):
    return {r.id: (None if r[col] is None else np.asarray(r[col])) for r in df.select("id", col).collect()}


def test_torch_model_equals_plain_pytorch_and_keeps_nulls(digits_df, digits, net):
    stage = TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="features",
                                   outputCol="logits", miniBatchSize=8)
    got = _by_id(stage.transform(digits_df), "logits")
    with torch.no_grad():
        expected = net(torch.from_numpy(digits)).numpy()
    assert got[len(digits)] is None
    np.testing.assert_allclose(np.stack([got[i] for i in range(len(digits))]), expected, rtol=1e-5, atol=1e-5)


def test_output_layer_and_array_inputs(spark, digits, net):
    hidden = [name for name, _ in net.named_modules() if name][2]
    seen = []
    dict(net.named_modules())[hidden].register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.no_grad():
        net(torch.from_numpy(digits))
    nested = [(i, x.reshape(8, 8).tolist()) for i, x in enumerate(digits)]
    df = spark.createDataFrame(nested, "id int, pixels array<array<float>>")
    stage = TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="pixels",
                                   outputCol="hidden", outputLayer=hidden, outputFormat="array")
    got = _by_id(stage.transform(df), "hidden")
    np.testing.assert_allclose(np.stack([got[i] for i in range(len(digits))]), seen[0].numpy(), rtol=1e-5, atol=1e-5)


def test_pipeline_with_torch_and_onnx_round_trips(digits_df, net, onnx_path, tmp_path):
    torch_stage = TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="features",
                                         outputCol="t")
    onnx_stage = ONNXModel(network=str(onnx_path), feedDict={"input": "features"}, fetchDict={"o": "logits"})
    model = Pipeline(stages=[torch_stage, onnx_stage]).fit(digits_df)
    model.save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    # The networks were saved beside the params, and the loaded stages read those copies.
    assert all(str(tmp_path) in stage.getNetwork() for stage in loaded.stages)
    before, after = model.transform(digits_df), loaded.transform(digits_df)
    for col in ("t", "o"):
        b, a = _by_id(before, col), _by_id(after, col)
        assert all((b[k] is None and a[k] is None) or np.allclose(b[k], a[k]) for k in b)
    t, o = _by_id(after, "t"), _by_id(after, "o")
    assert np.allclose(t[0], o[0], atol=1e-4)


def test_onnx_model_equals_onnxruntime_and_fetches_inner_nodes(digits_df, digits, onnx_path):
    import onnx

    inner = onnx.load(str(onnx_path)).graph.node[1].output[0]
    stage = ONNXModel(network=str(onnx_path), feedDict={"input": "features"},
                      fetchDict={"logits": "logits", "inner": inner}, miniBatchSize=16)
    out = stage.transform(digits_df)
    expected = ort.InferenceSession(str(onnx_path)).run(["logits"], {"input": digits})[0]
    got = _by_id(out, "logits")
    np.testing.assert_allclose(np.stack([got[i] for i in range(len(digits))]), expected, rtol=1e-5, atol=1e-5)
    assert _by_id(out, "inner")[0].shape == (32,)


def test_streaming_query_scores_new_files(spark, net, tmp_path, digits):
    source = tmp_path / "incoming"
    source.mkdir()
    spark.createDataFrame([(i, x.tolist()) for i, x in enumerate(digits[:10])], "id int, x array<float>") \
        .write.parquet(str(source / "batch1"))
    stream = spark.readStream.schema("id int, x array<float>").parquet(str(source / "batch1"))
    stage = TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="y")
    query = stage.transform(stream).writeStream.format("memory").queryName("scored").start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    rows = spark.sql("select id, y from scored").collect()
    assert len(rows) == 10
    with torch.no_grad():
        expected = net(torch.from_numpy(digits[:10])).numpy()
    for r in rows:
        np.testing.assert_allclose(r.y.toArray(), expected[r.id], rtol=1e-5, atol=1e-5)


def test_wrong_shape_names_column_and_shapes(spark, net):
    df = spark.createDataFrame([(1, [0.5] * 63)], "id int, x array<float>")
    stage = TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="y",
                                   inputShape=[64])
    with pytest.raises(PythonException, match=r"column 'x'.*shape \[63\].*expects shape \[64\]"):
        stage.transform(df).collect()


def test_wrong_type_and_missing_column_are_named(spark, net):
    df = spark.createDataFrame([(1, "text")], "id int, x string")
    stage = TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="y")
    with pytest.raises(TypeError, match="column 'x' has type string"):
        stage.transform(df)
    with pytest.raises(ValueError, match="input column 'missing' not found"):
        stage.setInputCol("missing").transform(df)


def test_missing_model_file_names_the_path(spark):
    df = spark.createDataFrame([(1, [0.5])], "id int, x array<float>")
    with pytest.raises(FileNotFoundError, match="does-not-exist.pt"):
        TorchModel(network="/nowhere/does-not-exist.pt", inputCol="x", outputCol="y").transform(df)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_stages_reading_different_layers_share_the_cached_network_and_leave_it_untouched(digits, order):
    """Pandas path (same process), so the cache the stages use is this process's (eager engine)."""
    from irbis.kernels.inference import cached_networks, clear_cache

    clean = build_model("mlp", **OPTIONS, seed=5)
    with torch.no_grad():
        x = torch.from_numpy(digits)
        expected = [clean[:2](x).numpy(), clean(x).numpy()]  # after the hidden ReLU, and the logits
    clear_cache()
    base = TorchModel.from_module(clean, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="y",
                                  engine="torch")
    stages = [base.copy({base.outputLayer: "1"}), base]
    frame = pd.DataFrame({"x": list(digits)})
    for _ in range(2):
        for i in order:
            np.testing.assert_allclose(np.stack(stages[i].transform(frame)["y"]), expected[i], rtol=1e-5, atol=1e-5)
    (cached,) = cached_networks()
    assert all(not m._forward_hooks and "forward" not in vars(m) for m in cached.modules())
