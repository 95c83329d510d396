"""The engine Param on real Spark: every engine equals eager PyTorch, cut at inner layers, and persists."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import torch
from pyspark.errors import PythonException
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import IntegerType, StructField, StructType
from skimage import data as skdata

from irbis import TorchModel
from irbis.kernels.engines import ENGINES
from irbis.ml.image_featurizer import ImageFeaturizer
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


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["torch"] + EXPORTED)
def test_rows_the_network_refuses_name_column_and_shapes_on_every_engine(spark, digits, engine):
    """LeNet takes 1x8x8 digits; rows reshaped to 4x4x4 have the right count but 4 channels."""
    net = build_model("lenet_digits").eval()
    df = spark.createDataFrame([(i, x.tolist()) for i, x in enumerate(digits[:4])], "id int, x array<float>")
    stage = TorchModel.from_module(net, architecture="lenet_digits", inputCol="x", outputCol="y",
                                   inputShape=[4, 4, 4], engine=engine)
    with pytest.raises(PythonException, match=r"TorchModel: rows of column 'x' have shape \[4, 4, 4\], "
                                              r"which the network does not accept.*channels"):
        stage.transform(df).collect()


@pytest.mark.parametrize("engine", EXPORTED)
def test_image_featurizer_engines_equal_eager(engine):
    photos = [cv2.imencode(".jpg", img[:, :, ::-1])[1].tobytes() for img in (skdata.coffee(), skdata.chelsea())]
    frame = pd.DataFrame({"b": photos})
    eager = ImageFeaturizer(inputCol="b", engine="torch").transform(frame)["features"]
    other = ImageFeaturizer(inputCol="b", engine=engine).transform(frame)["features"]
    for a, b in zip(eager, other):
        assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(a).max())


class Gate(torch.nn.Module):
    """Branches on the data, which torch.export cannot capture; importable by name from this module."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


def _user_network():
    torch.manual_seed(2)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(),
                               torch.nn.Sequential(torch.nn.Conv2d(4, 2, 3), torch.nn.Flatten()),
                               torch.nn.Linear(2 * 4 * 4, 3)).eval()


@pytest.mark.parametrize("engine", ["torch"] + EXPORTED)
def test_any_layer_of_a_user_module_on_every_engine(engine):
    net = _user_network()
    x = np.random.default_rng(0).normal(size=(5, 3, 8, 8)).astype(np.float32)
    seen = []
    handle = net[2][0].register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.no_grad():
        final = net(torch.from_numpy(x)).numpy()
    handle.remove()
    stage = TorchModel.from_module(net, inputCol="x", outputCol="y", inputShape=[3, 8, 8], engine=engine)
    assert stage.getNetwork().endswith(".pt2")
    frame = pd.DataFrame({"x": list(x.reshape(5, -1))})
    np.testing.assert_allclose(np.stack(stage.transform(frame)["y"]), final, rtol=1e-4, atol=1e-5)
    cut = stage.copy({stage.outputLayer: "2.0"}).transform(frame)["y"]
    np.testing.assert_allclose(np.stack(cut), seen[0].reshape(5, -1).numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"nearest names: .*'2.0'"):
        stage.copy({stage.outputLayer: "2.O"}).transform(frame)


@pytest.mark.spark
def test_pt2_stage_in_a_pipeline_model_saves_and_loads(spark, tmp_path):
    net = _user_network()
    x = np.random.default_rng(1).normal(size=(6, 3 * 8 * 8)).astype(np.float32)
    df = spark.createDataFrame([(i, row.tolist()) for i, row in enumerate(x)], "id int, x array<float>")
    stage = TorchModel.from_module(net, inputCol="x", outputCol="y", inputShape=[3, 8, 8], outputLayer="1")
    Pipeline(stages=[stage]).fit(df).save(str(tmp_path / "p"))
    loaded = PipelineModel.load(str(tmp_path / "p")).stages[0]
    assert loaded.getNetwork().startswith(str(tmp_path)) and loaded.getNetwork().endswith(".pt2")
    rows = {r.id: r.y.toArray() for r in loaded.transform(df).collect()}
    with torch.no_grad():
        expected = net[:2](torch.from_numpy(x.reshape(6, 3, 8, 8))).reshape(6, -1).numpy()
    np.testing.assert_allclose(np.stack([rows[i] for i in range(6)]), expected, rtol=1e-4, atol=1e-5)


def test_a_network_torch_export_cannot_capture_runs_eagerly_from_its_class(caplog):
    net = Gate().eval()
    x = np.random.default_rng(2).normal(size=(4, 4)).astype(np.float32)
    with caplog.at_level("WARNING", logger="irbis.models"):
        stage = TorchModel.from_module(net, options={"width": 4}, inputCol="x", outputCol="y", inputShape=[4])
    assert any("torch.export cannot capture" in r.getMessage() for r in caplog.records)
    assert (Path(stage.getNetwork()) / "architecture.json").is_file()
    got = np.stack(stage.transform(pd.DataFrame({"x": list(x)}))["y"])
    with torch.no_grad():
        np.testing.assert_allclose(got, net(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_a_network_no_format_can_store_is_refused_with_the_ways_out():
    class Local(torch.nn.Module):
        def forward(self, x):
            return torch.from_numpy(x.numpy() * 2) if x.sum() > 0 else x

    with pytest.raises(TypeError, match="torch.export cannot capture.*cannot be imported.*TorchScript"):
        TorchModel.from_module(Local(), inputCol="x", outputCol="y", inputShape=[4])


def test_cutting_a_torchscript_file_says_how_to_get_a_cuttable_one(tmp_path):
    path = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())), str(path))
    stage = TorchModel(network=str(path), inputCol="x", outputCol="y", outputLayer="0", engine="torch")
    frame = pd.DataFrame({"x": [np.ones(4, np.float32)]})
    assert stage.copy({stage.outputLayer: ""}).transform(frame)["y"][0].shape == (3,)
    with pytest.raises(ValueError, match=r"torch.export archive.*network.pt2"):
        stage.transform(frame)


@pytest.mark.skipif("openvino" not in EXPORTED, reason="openvino is not installed")
def test_onnx_model_on_openvino_equals_onnxruntime_with_inner_nodes(tmp_path):
    import onnx

    from irbis import ONNXModel
    from irbis.kernels.engines.export import export_onnx

    torch.manual_seed(3)
    net = build_model("mlp", **OPTIONS).eval()
    path = str(export_onnx(lambda: net, None, (64,), "mlp-graph", tmp_path))
    inner = next(n.output[0] for n in onnx.load(path).graph.node if n.op_type == "Relu")
    x = np.random.default_rng(3).normal(size=(9, 64)).astype(np.float32)
    frame = pd.DataFrame({"x": list(x)})
    with pytest.raises(ParamValueError, match="engine"):
        ONNXModel(engine="torch")
    for layer in ("", inner):
        by = {e: np.stack(ONNXModel(network=path, inputCol="x", outputCol="y", outputLayer=layer, engine=e,
                                    miniBatchSize=4).transform(frame)["y"]) for e in ("onnxruntime", "openvino")}
        np.testing.assert_allclose(by["openvino"], by["onnxruntime"], rtol=1e-4, atol=1e-5)
    assert by["openvino"].shape == (9, OPTIONS["hidden"])


def test_models_check_prints_agreement_and_speed_on_real_photos(capsys):
    from irbis.cli import main
    from irbis.demo.photos import check_precision

    engine = EXPORTED[-1] if EXPORTED else "torch"
    result = check_precision("efficientnet_lite0", "fp32", engine=engine, crops_per_photo=2)
    assert result["crops"] == 14 and result["agreement"] == 1.0 and result["images_per_s"] > 0
    assert main(["models", "check", "efficientnet_lite0", "--engine", "torch"]) == 0
    assert "top-1 agreement with eager fp32 1.000 on 56 real-photo crops" in capsys.readouterr().out


@pytest.mark.spark
@pytest.mark.skipif("onnxruntime" not in EXPORTED, reason="needs onnxruntime")
def test_static_int8_stage_persists_its_calibration_and_equals_the_kernel(spark, digits, tmp_path):
    from irbis.kernels.inference import make_torch_predict_fn, resolve_source

    calibration = tmp_path / "calibration"
    calibration.mkdir()
    np.save(calibration / "rows.npy", digits[:32])
    torch.manual_seed(2)
    net = build_model("mlp", **OPTIONS).eval()
    stage = TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="y",
                                   engine="onnxruntime", precision="int8", calibrationData=str(calibration))
    stage.save(str(tmp_path / "stage"))
    loaded = TorchModel.load(str(tmp_path / "stage"))
    assert loaded.getPrecision() == "int8"  # the sample is saved with the stage, as a copy of the folder
    assert loaded.getCalibrationData() == str(tmp_path / "stage" / "data" / "calibration")
    df = spark.createDataFrame([(i, Vectors.dense(x.tolist())) for i, x in enumerate(digits)], ["id", "x"])
    got = np.stack([r.y.toArray() for r in loaded.transform(df).orderBy("id").collect()])
    kernel = make_torch_predict_fn(resolve_source(loaded.getNetwork()), engine="onnxruntime", precision="int8",
                                   calibration_data=str(calibration))(digits)
    np.testing.assert_allclose(got, kernel, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert not np.allclose(got, net(torch.from_numpy(digits)).numpy(), atol=1e-6)  # quantised, not fp32


@pytest.mark.spark
def test_dynamic_int8_on_torch_equals_the_kernel_and_is_quantised(spark, digits):
    from irbis.kernels.inference import make_torch_predict_fn, resolve_source

    torch.manual_seed(4)
    net = build_model("mlp", **OPTIONS).eval()
    stage = TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="y",
                                   inputShape=[64], engine="torch", precision="int8", miniBatchSize=1)
    df = spark.createDataFrame([(i, Vectors.dense(x.tolist())) for i, x in enumerate(digits)], ["id", "x"])
    got = np.stack([r.y.toArray() for r in stage.transform(df).orderBy("id").collect()])
    # the inputs' ranges are measured per batch, so the kernel meets the same batches: one row each
    kernel = make_torch_predict_fn(resolve_source(stage.getNetwork()), engine="torch", precision="int8",
                                   batch_size=1)(digits)
    np.testing.assert_allclose(got, kernel, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        fp32 = net(torch.from_numpy(digits)).numpy()
    assert not np.allclose(got, fp32, atol=1e-6)  # quantised, not fp32
    assert np.abs(got - fp32).max() <= 0.05 * np.abs(fp32).max()


@pytest.mark.spark
def test_a_local_session_starts_the_export_on_the_driver_ahead_of_the_job(spark, digits, monkeypatch):
    import irbis.ml.export_ahead_of_job as ahead
    from irbis.spark.session import is_connect

    calls = []
    monkeypatch.setattr(ahead, "export_ahead", lambda source, shape, **kw: calls.append((shape, kw)))
    torch.manual_seed(2)
    net = build_model("mlp", **OPTIONS).eval()
    df = spark.createDataFrame([(x.tolist(),) for x in digits[:4]], "x array<float>")
    TorchModel.from_module(net, architecture="mlp", options=OPTIONS, inputCol="x", outputCol="y",
                           inputShape=[64], outputLayer="0", engine="onnxruntime").transform(df)
    photos = spark.createDataFrame([(b"not a jpeg",)], "content binary")
    ImageFeaturizer(inputCol="content", outputCol="f", cutOutputLayers=1).transform(photos)
    if is_connect(spark):  # the driver is not where the workers are: nothing is exported ahead
        assert calls == []
        return
    (shape, kw), (image_shape, image_kw) = calls
    assert shape == [64] and kw["output_layer"] == "0" and kw["engine"] == "onnxruntime"
    assert image_shape == [3, 224, 224] and image_kw["output_layer"] and image_kw["engine"] == "auto"
