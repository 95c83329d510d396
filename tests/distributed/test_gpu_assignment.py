"""Each task runs on the GPU Spark assigned it, on a local-cluster whose workers advertise fake GPUs.

The cluster session's two workers each advertise one GPU through a discovery script (``"0"`` on one, ``"1"``
on the other; see ``cluster_spark`` in tests/conftest.py) and every task asks for one. Each task runs the hook
that every stage's UDF runs first (:func:`irbis.spark.resources.task_cores`) and reports the device the
one device rule gives it on a worker that sees two GPUs; nothing touches CUDA.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_each_task_runs_on_the_gpu_spark_assigned_it(cluster_spark):
    # defined here, so that it is pickled by value (the executors cannot import the test modules)
    def _report(batches):
        from pyspark import TaskContext

        from irbis.kernels.device import assigned, task_device
        from irbis.spark.resources import task_cores

        with task_cores(None):
            for _ in batches:
                pass
        context = TaskContext.get()
        gpu = context.resources().get("gpu")
        yield pa.RecordBatch.from_pylist([{"partition": context.partitionId(),
                                           "address": gpu.addresses[0] if gpu else None,
                                           "device": task_device("auto", assigned(), visible=2)}])

    rows = (cluster_spark.range(0, 16, numPartitions=8)
            .mapInArrow(_report, "partition long, address string, device string").collect())
    assert sorted(r.partition for r in rows) == list(range(8))
    assert all(r.address is not None for r in rows), rows
    assert all(r.device == f"cuda:{r.address}" for r in rows), rows
    assert {r.address for r in rows} == {"0", "1"}, "the tasks ran on one worker only"
