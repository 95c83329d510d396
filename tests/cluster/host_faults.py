"""The driver of the host-fault tests: a scoring job on a standalone cluster across simulated hosts.

Run as a process of its own (the test run's process keeps its local session)::

    python host_faults.py --master spark://10.213.0.1:7077 --driver-host 10.213.0.1 --out DIR --rows 480

It scores ``--rows`` rows (ids 0..rows-1, features made from the id) with a ``TorchModel`` in 16 partitions,
each partition first marking that it started (``DIR/started/<partition>-<attempt>``) and taking a second, so
that the test can kill a host while the job runs; the scores go to ``DIR/scores`` as Parquet and ``DIR/done``
is written at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from jvm_options import executor_jvm_options

#: The scored network: fixed weights, so that the test can compute every row's expected score.
WEIGHTS = np.arange(24, dtype=np.float32).reshape(3, 8) / 24
PARTITIONS = 16


def features(ids: np.ndarray) -> np.ndarray:
    """The features of rows ``ids``: 8 values each, made from the id."""
    return np.stack([np.sin(ids * (k + 1) / 7) for k in range(8)], axis=1).astype(np.float32)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--driver-host", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", type=int, default=480)
    args = parser.parse_args(argv)
    out = Path(args.out)
    (out / "started").mkdir(parents=True, exist_ok=True)

    import pandas as pd
    import torch

    import irbis
    from irbis.ml import TorchModel

    os.environ["SPARK_LOCAL_IP"] = args.driver_host
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = irbis.get_spark(args.master, app_name="irbis-host-faults", **{
        "spark.driver.host": args.driver_host, "spark.ui.enabled": "false",
        "spark.driver.memory": "1g", "spark.executor.memory": "1g", "spark.cores.max": "2",
        **executor_jvm_options(),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        # a dead host answers nothing: its executor is declared lost after this, and its tasks run again
        "spark.network.timeout": "15s", "spark.network.timeoutInterval": "5s",
        "spark.executor.heartbeatInterval": "2s",
        "spark.task.maxFailures": "8"})
    marks = str(out / "started")

    def mark_and_wait(batches):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        Path(marks, f"{ctx.partitionId()}-{ctx.attemptNumber()}").touch()
        time.sleep(1.0)
        for batch in batches:
            batch["features"] = [features(np.array([i]))[0].tolist() for i in batch["id"]]
            yield batch

    try:
        rows = (spark.range(args.rows, numPartitions=PARTITIONS)
                .mapInPandas(mark_and_wait, "id long, features array<float>"))
        net = torch.nn.Linear(8, 3, bias=False)
        with torch.no_grad():
            net.weight.copy_(torch.from_numpy(WEIGHTS))
        model = TorchModel.from_module(net, inputCol="features", outputCol="score")
        model.transform(rows).select("id", "score").write.parquet(str(out / "scores"))
        (out / "done").write_text(str(pd.Timestamp.now()))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
