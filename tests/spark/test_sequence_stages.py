"""TorchModel and ONNXModel over variable-length rows (variableLength=True): outputs equal the network
applied to each row alone, in any order of lengths; bad rows get a reason or a clear error."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from pyspark.ml.linalg import VectorUDT
from pyspark.sql.types import ArrayType, FloatType, IntegerType, StructField, StructType

from irbis.ml.onnx_model import ONNXModel
from irbis.ml.torch_model import TorchModel
from tests.sequence_networks import LSTMIds, MeanPooledIds, MeanPooledSteps, PerStep, unpadded


def _ids(seed: int = 0, count: int = 37) -> list[np.ndarray]:
    """Token-id rows of lengths 1..count in a random order."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 50, size=n).astype(np.int64) for n in rng.permutation(np.arange(1, count + 1))]


def _reference(net: torch.nn.Module, rows: list[np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        return [unpadded(net, torch.from_numpy(r)).numpy() for r in rows]


def _close(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cls", [MeanPooledIds, LSTMIds])
def test_outputs_equal_the_network_row_by_row(cls):
    torch.manual_seed(0)
    net, rows = cls().eval(), _ids()
    stage = TorchModel.from_module(net, inputCol="x", outputCol="y", variableLength=True, tokenBudget=64,
                                   miniBatchSize=5, outputFormat="array")
    _close(stage.transform(pd.DataFrame({"x": rows}))["y"], _reference(net, rows))


def test_float_steps_equal_the_network_row_by_row():
    torch.manual_seed(0)
    net, rng = MeanPooledSteps().eval(), np.random.default_rng(1)
    rows = [rng.normal(size=(n, 4)).astype(np.float32) for n in rng.permutation(np.arange(1, 20))]
    stage = TorchModel.from_module(net, inputCol="x", outputCol="y", variableLength=True, tokenBudget=40)
    _close(stage.transform(pd.DataFrame({"x": rows}))["y"], _reference(net, rows))


def test_batches_are_cut_by_the_token_budget(monkeypatch):
    """Each forward pass holds at most tokenBudget padded tokens (or one row) and miniBatchSize rows."""
    net = MeanPooledIds().eval()
    shapes = []
    forward = MeanPooledIds.forward
    monkeypatch.setattr(MeanPooledIds, "forward", lambda self, ids, mask: shapes.append(ids.shape) or
                        forward(self, ids, mask))
    stage = TorchModel.from_module(net, inputCol="x", outputCol="y", variableLength=True, tokenBudget=64,
                                   miniBatchSize=3)
    stage.transform(pd.DataFrame({"x": _ids(count=30)}))
    assert sum(s[0] for s in shapes) == 30
    assert all(s[1] % 8 == 0 and s[0] <= 3 and (s[0] * s[1] <= 64 or s[0] == 1) for s in shapes)


def test_bad_rows_get_a_reason_or_fail_naming_the_column():
    torch.manual_seed(0)
    frame = pd.DataFrame({"x": [np.array([1, 2]), None, np.array([], np.int64), np.array([4, 5, 6])]})
    kept = TorchModel.from_module(MeanPooledIds(), inputCol="x", outputCol="y", variableLength=True, errorCol="why")
    out = kept.transform(frame)
    assert [y is None for y in out["y"]] == [False, True, True, False]
    assert list(out["why"]) == [None, "null row", "empty sequence", None]
    strict = kept.copy().setErrorCol("")
    with pytest.raises(ValueError, match=r"column 'x' row 2 .*empty sequence.*errorCol"):
        strict.transform(frame)
    out = strict.transform(frame.iloc[[0, 1, 3]])  # a null row alone gives a null output, as fixed rows do
    assert [y is None for y in out["y"]] == [False, True, False]


def test_per_step_outputs_and_other_engines_are_refused():
    stage = TorchModel.from_module(PerStep(), inputCol="x", outputCol="y", variableLength=True)
    with pytest.raises(ValueError, match="one output per step"):
        stage.transform(pd.DataFrame({"x": _ids(count=3)}))
    lstm = TorchModel.from_module(LSTMIds(), inputCol="x", outputCol="y", variableLength=True)
    for param, value in (("engine", "onnxruntime"), ("precision", "int8"), ("outputLayer", "lstm")):
        with pytest.raises(ValueError, match=f"variableLength=True .*{param}="):
            lstm.copy({lstm.getParam(param): value}).transform(pd.DataFrame({"x": _ids(count=3)}))


def test_column_kinds_are_checked_naming_the_column_and_the_param():
    stage = TorchModel.from_module(MeanPooledIds(), inputCol="x", outputCol="y", variableLength=True)
    for dtype in (VectorUDT(), ArrayType(FloatType())):
        with pytest.raises(TypeError, match="column 'x'.*variableLength"):
            stage.transform_schema(StructType([StructField("x", dtype)]))
    stage.transform_schema(StructType([StructField("x", ArrayType(IntegerType()))]))
    fixed = TorchModel.from_module(torch.nn.Linear(2, 1), inputCol="x", outputCol="y")
    with pytest.raises(ValueError, match="column .x.: rows have different (lengths|shapes).*variableLength=True"):
        fixed.transform(pd.DataFrame({"x": [np.ones(2, np.float32), np.ones(3, np.float32)]}))


def test_fixed_shape_rows_report_nulls_in_the_error_column():
    stage = TorchModel.from_module(torch.nn.Linear(2, 1), inputCol="x", outputCol="y", errorCol="why")
    out = stage.transform(pd.DataFrame({"x": [np.ones(2, np.float32), None]}))
    assert out["y"][1] is None and list(out["why"]) == [None, "null row"]


def _onnx(net: torch.nn.Module, folder) -> str:
    path = str(folder / "net.onnx")
    axes = {0: "batch", 1: "steps"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.ones(2, 8, dtype=torch.int64), torch.ones(2, 8, dtype=torch.int64)), path,
                          input_names=["input_ids", "attention_mask"], output_names=["logits"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes}, dynamo=False)
    return path


def test_onnx_outputs_equal_the_network_row_by_row(tmp_path):
    torch.manual_seed(0)
    net, rows = MeanPooledIds().eval(), _ids()
    path = _onnx(net, tmp_path)
    stage = ONNXModel(network=path, feedDict={"input_ids": "x", "attention_mask": "x"}, fetchDict={"y": "logits"},
                      variableLength=True, tokenBudget=64, miniBatchSize=5, argMaxDict={"y": "label"})
    out = stage.transform(pd.DataFrame({"x": rows + [None]}))
    want = _reference(net, rows)
    _close(out["y"][:-1], want)
    assert out["y"].iloc[-1] is None
    assert list(out["label"][:-1]) == [float(np.argmax(w)) for w in want]
    with pytest.raises(ValueError, match="column 'x' row 0 .*empty sequence"):
        stage.transform(pd.DataFrame({"x": [np.array([], np.int64)]}))


@pytest.mark.spark
def test_spark_save_load_and_pipeline(spark, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel

    torch.manual_seed(0)
    net, rows = LSTMIds().eval(), _ids(count=12)
    df = spark.createDataFrame([(i, r.tolist()) for i, r in enumerate(rows)] + [(99, None), (98, [])],
                               "i int, ids array<int>").repartition(2)
    stage = TorchModel.from_module(net, inputCol="ids", outputCol="y", variableLength=True, tokenBudget=32,
                                   miniBatchSize=4, errorCol="why")
    want = _reference(net, rows)
    stage.save(str(tmp_path / "stage"))
    pipeline = Pipeline(stages=[stage]).fit(df)
    pipeline.save(str(tmp_path / "pipeline"))
    for model in (stage, TorchModel.load(str(tmp_path / "stage")), PipelineModel.load(str(tmp_path / "pipeline"))):
        got = {r.i: r for r in model.transform(df).collect()}
        _close([got[i].y.toArray() for i in range(len(rows))], want)
        assert (got[99].y, got[99].why, got[98].y, got[98].why) == (None, "null row", None, "empty sequence")
