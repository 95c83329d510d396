"""Python workers of an executor are killed during inference on local-cluster: Spark retries the task,
and the job gives exactly one output row per input row, nothing duplicated or lost."""

import os

import cv2
import numpy as np
import pytest
import torch
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

from irbis import TorchModel
from irbis.spark.images import read_images

pytestmark = [pytest.mark.spark, pytest.mark.slow,
              pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker processes in /proc")]


def kill_workers_once(marker: str, return_type: str):
    """A pass-through pandas UDF that, the first time it runs anywhere, SIGKILLs every Python worker of
    its executor (the processes forked by the same daemon, the stage's other workers included), as
    the loss of an executor's Python side would."""

    def kill_siblings() -> None:
        import signal

        me, daemon = os.getpid(), os.getppid()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == daemon and int(pid) != me:
                os.kill(int(pid), signal.SIGKILL)
        os.kill(me, signal.SIGKILL)

    @pandas_udf(return_type)
    def pass_through(values):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return values
        kill_siblings()
        return values

    return pass_through


def test_torch_model_job_survives_killed_python_workers(cluster_spark, tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).eval()
    x = np.random.default_rng(1).normal(size=(48, 6)).astype(np.float32)
    df = cluster_spark.createDataFrame([(i, r.tolist()) for i, r in enumerate(x)], "id int, x array<float>")
    marker = str(tmp_path / "killed")
    faulty = df.repartition(4).withColumn("x", kill_workers_once(marker, "array<float>")(F.col("x")))
    out = TorchModel.from_module(net, inputCol="x", outputCol="y", miniBatchSize=8).transform(faulty)
    rows = out.select("id", "y").collect()
    assert os.path.exists(marker), "the fault was never injected"
    assert sorted(r.id for r in rows) == list(range(48))  # one row per input: none lost, none twice
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    got = np.stack([r.y.toArray() for r in sorted(rows)])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_read_images_job_survives_killed_python_workers(cluster_spark, tmp_path):
    from sklearn.datasets import load_digits

    folder = tmp_path / "digits"
    folder.mkdir()
    digits = load_digits().images[:12]
    for i, image in enumerate(digits):
        cv2.imwrite(str(folder / f"{i:02d}.png"), (image * 15).astype(np.uint8))
    marker = str(tmp_path / "killed")
    images = read_images(str(folder))  # no shuffle: the fault hits the stage that decodes the files
    faulty = images.withColumn("path", kill_workers_once(marker, "string")(F.col("path")))
    rows = faulty.select("path", "image.height", "image.width", "image.data").collect()
    assert os.path.exists(marker), "the fault was never injected"
    names = sorted(r.path.rsplit("/", 1)[-1] for r in rows)
    assert names == [f"{i:02d}.png" for i in range(12)]  # one row per file: none lost, none twice
    for row in rows:
        i = int(row.path.rsplit("/", 1)[-1][:2])
        assert (row.height, row.width) == (8, 8)
        np.testing.assert_array_equal(np.frombuffer(row.data, np.uint8), (digits[i] * 15).astype(np.uint8).ravel())
