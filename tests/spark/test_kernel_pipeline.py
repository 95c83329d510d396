"""Pipelines as chains of kernels: ``load_local`` against ``load``, stages without a kernel, and the saved
folders of tests/data/saved_stages loaded both ways."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.feature import VectorAssembler

from irbis.errors import NoKernelError
from irbis.kernels.blocks import Images, block_to_rows, rows_in, run_steps
from irbis.ml import ImageTransformer, SelectColumns, TorchModel, load_local
from irbis.ml.kernel_pipeline import flatten, stage_kernel

pytestmark = pytest.mark.spark
SAVED = Path(__file__).resolve().parents[1] / "data" / "saved_stages"


def _run(kernels, columns: dict[str, list]) -> dict:
    return run_steps([(k.inputs, k.fn) for k in kernels], {c: rows_in(v, c) for c, v in columns.items()})


def test_a_pipeline_with_a_stage_without_kernel_names_it(spark, tmp_path):
    path = str(tmp_path / "model")
    stages = [VectorAssembler(inputCols=["a", "b"], outputCol="features"), SelectColumns(cols=["features"])]
    PipelineModel(stages=stages).save(path)
    with pytest.raises(NoKernelError, match=r"no kernel: SelectColumns \(SelectColumns_") as info:
        load_local(path)
    assert info.value.classes == ["SelectColumns"]
    with pytest.raises(NoKernelError, match="SelectColumns"):
        [stage_kernel(s) for s in flatten(PipelineModel.load(path))]


def test_live_and_saved_sparkml_kernels_agree(spark, tmp_path):
    """A live fitted stage's kernel (LIME's path) and the saved one's (serving's) declare the same columns,
    kinds and types and give the same values."""
    path = str(SAVED / "tabular_pipeline")
    live = [stage_kernel(s) for s in flatten(PipelineModel.load(path))]
    saved = load_local(path)
    assert [(k.inputs, k.outputs, k.kinds, k.types, k.nulls) for k in live] == \
           [(k.inputs, k.outputs, k.kinds, k.types, k.nulls) for k in saved]
    columns = {"a": [0.5, -1.0], "b": [1.5, 0.0], "c": [2.0, 0.25]}
    got, want = _run(live, columns), _run(saved, columns)
    for column in ("probability", "scores"):
        np.testing.assert_allclose(got[column].values, want[column].values, rtol=1e-6)


def test_a_saved_pipeline_gives_its_saved_outputs_with_load_and_load_local(spark):
    expected = json.loads((SAVED / "expected.json").read_text())
    rows, outputs = expected["inputs"], expected["outputs"]
    frame = spark.createDataFrame([(r["a"], r["b"], r["c"]) for r in rows], "a double, b double, c double")
    loaded = PipelineModel.load(str(SAVED / "tabular_pipeline")).transform(frame).collect()
    local = _run(load_local(str(SAVED / "tabular_pipeline")), {c: [r[c] for r in rows] for c in "abc"})
    for i, want in enumerate(outputs):
        for column in ("scaled", "probability", "scores"):
            np.testing.assert_allclose(loaded[i][column].toArray(), want[column], rtol=1e-6)
            np.testing.assert_allclose(block_to_rows(local[column])[i], want[column], rtol=1e-6)
        assert loaded[i]["prediction"] == want["prediction"] == local["prediction"][i]


def test_saved_stages_load_with_load_and_load_local(spark):
    from skimage import data

    network = TorchModel.load(str(SAVED / "torch_model"))
    assert Path(network.getNetwork()).is_relative_to(SAVED / "torch_model")  # the sidecar, not the saved path
    (kernel,) = load_local(str(SAVED / "torch_model"))
    x = np.array([[0.5, -1.0, 2.0]])
    want = network.transform(spark.createDataFrame([(x[0].tolist(),)], "scaled array<double>")).first()["scores"]
    np.testing.assert_allclose(kernel.fn({"scaled": rows_in(list(x), "scaled")})["scores"].values[0],
                               want.toArray(), rtol=1e-6)
    photo = data.chelsea()[::8, ::8, ::-1].copy()
    transformer = ImageTransformer.load(str(SAVED / "image_transformer"))
    (kernel,) = load_local(str(SAVED / "image_transformer"))
    assert transformer.getOrDefault("ops") and kernel.kinds == {"image": frozenset({"image"})}
    local = kernel.fn({"image": Images.from_arrays([photo])})["small"]
    frame = transformer.kernel().fn({"image": Images.from_arrays([photo])})["small"]
    np.testing.assert_array_equal(local.values, frame.values)
    assert local.values.shape == (1, 4 * 4 * 3)
