"""Binary tensor columns on real Spark: every engine equals the array<float> column, bad lengths are
named, float16/uint8 rows, persistence of inputDtype, and the helpers that write such columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from pyspark.errors import PythonException
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import ArrayType, FloatType, IntegerType, StructField, StructType

from irbis import ONNXModel, TorchModel
from irbis.kernels.engines import ENGINES
from irbis.ml.params import ParamValueError
from irbis.models import build_model
from irbis.spark.tensors import tensor_bytes, tensor_bytes_column

pytestmark = pytest.mark.spark

EXPORTED = [name for name in ("onnxruntime", "openvino") if ENGINES[name].installed()]
SHAPE = [1, 8, 8]


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    return load_digits().data[:24].astype(np.float32)  # integers 0..16


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return build_model("lenet_digits").eval()


@pytest.fixture(scope="module")
def frame(spark, digits):
    """id, x (array<float>), v (vector) and b (x as float32 bytes, by the helper); the last row null."""
    rows = [(i, x.tolist(), Vectors.dense(x.tolist())) for i, x in enumerate(digits)] + [(len(digits), None, None)]
    schema = StructType([StructField("id", IntegerType()), StructField("x", ArrayType(FloatType())),
                         StructField("v", VectorUDT())])
    df = spark.createDataFrame(rows, schema).repartition(2)
    return tensor_bytes_column(df, "x", "b").cache()


def _outputs(df, col="y"):
    rows = {r.id: r[col] for r in df.select("id", col).collect()}
    return np.stack([np.asarray(rows[i]) for i in sorted(rows) if rows[i] is not None]), rows


def _expected(net, x):
    with torch.no_grad():
        return net(torch.from_numpy(np.asarray(x, np.float32).reshape(-1, *SHAPE))).numpy()


@pytest.mark.parametrize("engine", ["torch"] + EXPORTED)
def test_torch_model_on_tensor_bytes_equals_the_array_column(frame, digits, net, engine):
    stage = TorchModel.from_module(net, architecture="lenet_digits", inputCol="x", outputCol="y",
                                   inputShape=SHAPE, engine=engine, miniBatchSize=8)
    from_array, _ = _outputs(stage.transform(frame))
    from_bytes, rows = _outputs(stage.setInputCol("b").transform(frame))
    assert rows[len(digits)] is None and len(from_bytes) == len(digits)
    np.testing.assert_array_equal(from_bytes, from_array)
    np.testing.assert_allclose(from_bytes, _expected(net, digits), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", EXPORTED)
def test_onnx_model_on_tensor_bytes_equals_the_array_column(frame, digits, net, engine, tmp_path):
    path = tmp_path / "lenet.onnx"
    torch.onnx.export(net, (torch.zeros(1, *SHAPE),), str(path), input_names=["input"], output_names=["out"],
                      dynamic_axes={"input": {0: "n"}, "out": {0: "n"}}, dynamo=False)
    stage = ONNXModel(network=str(path), inputCol="x", outputCol="y", engine=engine)
    from_array, _ = _outputs(stage.transform(frame))
    from_bytes, rows = _outputs(stage.setInputCol("b").transform(frame))
    assert rows[len(digits)] is None
    np.testing.assert_array_equal(from_bytes, from_array)
    np.testing.assert_allclose(from_bytes, _expected(net, digits), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_float16_and_uint8_bytes_are_cast_in_the_worker(spark, frame, digits, net, dtype):
    packed = tensor_bytes_column(frame, "v", "small", dtype=dtype)  # from the vector column
    assert dict(packed.dtypes)["small"] == "binary"
    stage = TorchModel.from_module(net, architecture="lenet_digits", inputCol="small", outputCol="y",
                                   inputShape=SHAPE, inputDtype=dtype, engine="torch")
    got, rows = _outputs(stage.transform(packed))
    assert rows[len(digits)] is None
    np.testing.assert_allclose(got, _expected(net, digits.astype(dtype)), rtol=1e-5, atol=1e-5)
    first = packed.filter("id = 0").first().small
    assert np.array_equal(np.frombuffer(first, dtype), digits[0].astype(dtype))


@pytest.mark.parametrize("stage_class", [TorchModel, ONNXModel])
def test_rows_of_the_wrong_byte_length_name_the_column_and_the_shape(spark, net, stage_class, tmp_path):
    df = spark.createDataFrame([(0, bytes(63 * 4))], "id int, b binary")
    if stage_class is TorchModel:
        stage = TorchModel.from_module(net, architecture="lenet_digits", inputCol="b", outputCol="y",
                                       inputShape=SHAPE, engine="torch")
    else:
        path = tmp_path / "lenet.onnx"
        torch.onnx.export(net, (torch.zeros(1, *SHAPE),), str(path), input_names=["input"],
                          dynamic_axes={"input": {0: "n"}}, dynamo=False)
        stage = ONNXModel(network=str(path), inputCol="b", outputCol="y", inputShape=SHAPE)
    with pytest.raises(PythonException, match=rf"{stage_class.__name__}: rows of column 'b' have shape \[63\].*"
                                              r"expected: \[1, 8, 8\].*252 bytes.*float32 take 256 bytes"):
        stage.transform(df).collect()


def test_tensor_bytes_need_an_input_shape(spark, tmp_path):
    df = spark.createDataFrame([(0, bytes(16))], "id int, b binary")
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.ReLU())
    stage = TorchModel.from_module(net, inputCol="b", outputCol="y", inputShape=[4])
    stage.clear(stage.inputShape)
    with pytest.raises(ValueError, match=r"TorchModel: column 'b' holds tensor bytes.*set inputShape"):
        stage.transform(df)


def test_input_dtype_is_checked_and_persists(net, tmp_path):
    with pytest.raises(ParamValueError, match=r"inputDtype='int32'.*'float32', 'float16', 'uint8'"):
        TorchModel(inputDtype="int32")
    with pytest.raises(ParamValueError, match="inputDtype"):
        ONNXModel().setInputDtype("float64")
    stage = TorchModel.from_module(net, architecture="lenet_digits", inputCol="b", outputCol="y",
                                   inputShape=SHAPE, inputDtype="uint8")
    stage.save(str(tmp_path / "stage"))
    loaded = TorchModel.load(str(tmp_path / "stage"))
    assert loaded.getInputDtype() == "uint8" and TorchModel().getInputDtype() == "float32"


def test_numpy_tensor_bytes_written_by_pyarrow_are_scored_by_spark(spark, digits, net, tmp_path):
    valid = np.arange(len(digits) + 1) != 3
    values = np.zeros((len(digits) + 1, *SHAPE), np.float32)
    values[valid] = digits.reshape(-1, *SHAPE)
    column = tensor_bytes(values[valid], valid)
    pq.write_table(pa.table({"id": np.arange(len(valid)), "b": column}), tmp_path / "part-0.parquet")
    df = spark.read.parquet(str(tmp_path))
    stage = TorchModel.from_module(net, architecture="lenet_digits", inputCol="b", outputCol="y",
                                   inputShape=SHAPE, engine="torch")
    got, rows = _outputs(stage.transform(df))
    assert rows[3] is None
    np.testing.assert_allclose(got, _expected(net, digits), rtol=1e-4, atol=1e-5)
    back = {r.id: r.b for r in df.collect()}
    assert np.array_equal(np.frombuffer(back[5], "<f4").reshape(SHAPE), values[5])


def test_onnx_model_workers_do_not_import_torch(net, tmp_path):
    """ONNXModel's batch function, unpickled in a fresh interpreter as a Python worker does, runs
    without importing torch (~300 MiB per worker)."""
    import subprocess
    import sys

    import cloudpickle

    path = tmp_path / "lenet.onnx"
    torch.onnx.export(net, (torch.zeros(1, *SHAPE),), str(path), input_names=["input"],
                      dynamic_axes={"input": {0: "n"}}, dynamo=False)
    stage = ONNXModel(network=str(path), inputCol="b", outputCol="y", inputShape=SHAPE,
                      softMaxDict={"y": "p"}, argMaxDict={"y": "label"})
    (tmp_path / "fn.pkl").write_bytes(cloudpickle.dumps(stage._make_batch_fn()))
    x = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, pickle, numpy as np; from irbis.kernels.blocks import from_arrow, tensor_bytes; "
            f"fn = pickle.loads(open({str(tmp_path / 'fn.pkl')!r}, 'rb').read()); "
            f"out = fn({{'b': from_arrow(tensor_bytes(np.load({str(tmp_path / 'x.npy')!r})))}}); "
            "print(*[float(v) for v in out['label']], 'torch' in sys.modules)")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert found[-1] == "False"
    assert [float(v) for v in found[:-1]] == _expected(net, x).argmax(1).astype(float).tolist()
