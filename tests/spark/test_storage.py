"""Saving through Spark's FileSystem API: URIs, pipelines, and files written by executors."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from pyspark.ml import PipelineModel

from irbis.ml import TorchModel
from irbis.ml.persistence import PART_BYTES, is_local_path

pytestmark = pytest.mark.spark


def _scores(stage, frame):
    return np.stack(stage.transform(frame)["y"].tolist())


def test_uri_paths_go_through_spark_and_load_back(spark, tmp_path):
    torch.manual_seed(0)
    big = torch.nn.Linear(2048, 1100)  # 9 MB of weights: more than one part row
    stage = TorchModel.from_module(big, inputCol="x", outputCol="y", inputShape=[2048])
    frame = pd.DataFrame({"x": list(np.random.default_rng(0).normal(size=(3, 2048)).astype(np.float32))})
    uri = (tmp_path / "model").as_uri()
    assert not is_local_path(uri) and is_local_path(str(tmp_path))
    PipelineModel([stage]).save(uri)
    stored = spark.read.parquet(f"{uri}/stages/0_{stage.uid}/data")
    assert stored.count() >= 2 and max(r.n for r in stored.selectExpr("length(bytes) n").collect()) == PART_BYTES
    loaded = PipelineModel.load(uri).stages[0]
    np.testing.assert_allclose(_scores(loaded, frame), _scores(stage, frame), rtol=1e-6)


@pytest.mark.slow
def test_executors_write_the_files_on_a_cluster(cluster_spark, tmp_path):
    torch.manual_seed(1)
    stage = TorchModel.from_module(torch.nn.Linear(4, 2), inputCol="x", outputCol="y", inputShape=[4])
    uri = (tmp_path / "on-cluster").as_uri()
    stage.save(uri)
    loaded = TorchModel.load(uri)
    frame = pd.DataFrame({"x": [np.arange(4, dtype=np.float32)]})
    np.testing.assert_allclose(_scores(loaded, frame), _scores(stage, frame))
    df = cluster_spark.createDataFrame([(np.arange(4, dtype=float).tolist(),)], "x array<double>")
    assert len(loaded.transform(df).collect()[0].y) == 2


def test_shipped_names_follow_the_content(tmp_path):
    import os

    from irbis.spark.files import _content_name

    f = tmp_path / "network.pt"
    f.write_bytes(b"one")
    first = _content_name(f)
    f.write_bytes(b"two")
    os.utime(f, ns=(1, 1))  # a rewrite that even keeps the size: the name still changes
    assert _content_name(f) != first and _content_name(f).endswith(".pt")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "w").write_bytes(b"x")
    (tmp_path / "b" / "w").write_bytes(b"y")
    assert _content_name(tmp_path / "a") != _content_name(tmp_path / "b")
