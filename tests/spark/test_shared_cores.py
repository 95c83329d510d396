"""A network stage's tasks share their executor's cores (irbis.spark.resources.SharedCores): an input of one
partition (one small Parquet file is one) runs its one task on every core of local[2], and two tasks running
at once take one core each. The stage here is a kernel that reports the thread count the runner gave it,
row by row, beside the input's own columns (which come out as they went in, in order)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType

from irbis.ml.base import IrbisTransformer

pytestmark = pytest.mark.spark


class ThreadProbe(IrbisTransformer):
    """Writes the kernel's thread count (``irbis.kernels.threads.task_threads``) into ``threads``. With a
    ``meeting`` folder, each of ``tasks`` tasks waits there at its first and at its ``batches``-th batch until
    every task has arrived: in between, every task is known to run while the others do."""

    def __init__(self, meeting: str = "", tasks: int = 2, batches: int = 0) -> None:
        super().__init__()
        self.meeting, self.tasks, self.batches = meeting, tasks, batches

    def _input_columns(self) -> list[str]:
        return ["id"]

    def _output_columns(self) -> list:
        return [("threads", DoubleType())]

    def _make_batch_fn(self):
        meeting, tasks, batches = self.meeting, self.tasks, self.batches
        calls = [0]

        def meet(place: Path) -> None:
            import os

            place.mkdir(exist_ok=True)
            (place / str(os.getpid())).touch()
            deadline = time.monotonic() + 60
            while len(list(place.iterdir())) < tasks and time.monotonic() < deadline:
                time.sleep(0.01)

        def fn(blocks):
            from irbis.kernels.threads import task_threads

            threads = float(task_threads())  # as the runner set it before this batch
            calls[0] += 1
            if meeting and calls[0] in (1, batches):
                meet(Path(meeting) / str(calls[0]))
            return {"threads": np.full(len(blocks["id"]), threads)}

        return fn


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import a test module


@pytest.fixture
def small_batches(spark):
    """Arrow batches of 8 rows, so that a task reads its share again after the meeting."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "8")
    yield
    spark.conf.set(key, before)


def test_one_partition_runs_on_every_core_and_keeps_its_rows(spark, tmp_path, small_batches):
    spark.range(64).coalesce(1).write.parquet(str(tmp_path / "one"))
    df = spark.read.parquet(str(tmp_path / "one"))  # one small file: one partition
    out = ThreadProbe().transform(df).collect()
    assert [r.id for r in out] == list(range(64))
    assert {r.threads for r in out} == {2.0}


def test_two_tasks_at_once_take_one_core_each(spark, tmp_path, small_batches):
    df = spark.range(64).repartition(2).withColumn("part", F.spark_partition_id())  # 4 batches a task
    out = ThreadProbe(str(tmp_path), tasks=2, batches=4).transform(df).collect()
    assert len(list((tmp_path / "1").iterdir())) == len(list((tmp_path / "4").iterdir())) == 2  # both met, twice
    assert sorted(r.id for r in out) == list(range(64))
    by_part = {p: [r.threads for r in out if r.part == p] for p in (0, 1)}
    for part, threads in by_part.items():  # between the meetings a task has its own core
        assert len(threads) == 32 and set(threads[8:]) == {1.0}, (part, threads)
