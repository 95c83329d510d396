"""Spark backend: one barrier stage, one task per worker, torch.distributed inside.

``df.mapInArrow(fn, schema, barrier=True)`` hands each task its partition as
Arrow record batches (no per-row Python objects). Rank 0 starts a
``TCPStore`` on a free port of its host and shares the port through
``BarrierTaskContext.allGather``; every worker then joins the gloo (CPU) or
NCCL (CUDA) process group on that store: handshakes, no sleeps. A failed task
fails the stage; Spark re-runs it and the workers resume from the last
checkpoint in the job's checkpoint directory (on ``local[N]`` masters a failed
task fails the job: Spark retries tasks only on cluster masters).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, NumericType

from irbis.train.data import Shard
from irbis.train.loop import TrainSpec, WorkerResult

RESULT_SCHEMA = "rank int, history string, state binary, loopSeconds double, resumedFrom long"
FEATURES, LABEL = "__features", "__label"


def available_slots(spark_context: Any, wait_s: float = 30.0, wanted: int = 0) -> int:
    """Tasks the cluster can run at once; waits up to ``wait_s`` for executors to register."""
    jsc = spark_context._jsc.sc()

    def slots() -> int:
        try:
            profile = jsc.resourceProfileManager().defaultResourceProfile()
            return int(jsc.maxNumConcurrentTasks(profile))
        except Exception:  # py4j surface differs across Spark versions
            return int(spark_context.defaultParallelism)

    found, deadline, tick = slots(), time.monotonic() + wait_s, threading.Event()
    while found < wanted and time.monotonic() < deadline:
        tick.wait(0.25)
        found = slots()
    return found


def training_frame(df: DataFrame, features_col: str, label_col: str) -> DataFrame:
    """Select features as ``array<float>`` and the label as double, under fixed names."""
    ftype = df.schema[features_col].dataType
    if isinstance(ftype, VectorUDT):
        feats = vector_to_array(F.col(features_col), "float32")
    elif isinstance(ftype, ArrayType) and isinstance(ftype.elementType, NumericType):
        feats = F.col(features_col).cast("array<float>")
    else:
        raise TypeError(f"featuresCol {features_col!r} must be a vector or an array of numbers, found {ftype}")
    ltype = df.schema[label_col].dataType
    if not isinstance(ltype, NumericType):
        raise TypeError(f"labelCol {label_col!r} must be numeric, found {ltype}; index string labels first "
                        "(e.g. pyspark.ml.feature.StringIndexer)")
    return df.select(feats.alias(FEATURES), F.col(label_col).cast("double").alias(LABEL))


def arrow_to_shard(batches: Iterator[pa.RecordBatch]) -> Shard:
    """Concatenate a partition's record batches into dense numpy features and labels."""
    xs, ys = [], []
    for b in batches:
        col = b.column(FEATURES)
        n = len(col)
        if n == 0:
            continue
        values = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        xs.append(values.reshape(n, -1))
        ys.append(b.column(LABEL).to_numpy(zero_copy_only=False))
    if not xs:
        return Shard(np.zeros((0, 0), np.float32), np.zeros(0))
    return Shard(np.concatenate(xs), np.concatenate(ys))


def _rendezvous(ctx: Any, rank: int, world: int, timeout_s: float) -> Any:
    host = ctx.getTaskInfos()[0].address.rsplit(":", 1)[0]
    store, port = None, 0
    if rank == 0:
        from irbis.train.comm import serve_store

        store = serve_store(host, world, timeout_s)
        port = store.port
    ports = [json.loads(m)["port"] for m in ctx.allGather(json.dumps({"port": port}))]
    if rank != 0:
        from irbis.train.comm import connect_store

        store = connect_store(host, ports[0], rank, world, timeout_s)
    return store


def barrier_worker(spec: TrainSpec, world: int, progress: tuple[str, int, str] | None, timeout_s: float,
                   batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The body of each barrier task (module level, so it pickles by reference)."""
    from pyspark import BarrierTaskContext

    from irbis.train.comm import init_torch_group
    from irbis.train.loop import train_worker
    from irbis.train.progress import ProgressClient
    from irbis.train.strategy import WorkerContext

    shard = arrow_to_shard(batches)
    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    store = _rendezvous(ctx, rank, world, timeout_s)
    comm = init_torch_group(store, rank, world, spec.device, timeout_s)
    report = ProgressClient(progress) if rank == 0 else None
    try:
        res = train_worker(spec, shard, WorkerContext(comm, rank, world, spec.device), report)
    finally:
        if report is not None:
            report.close()
        import torch.distributed as dist

        dist.destroy_process_group()
    yield pa.RecordBatch.from_pylist(
        [{"rank": rank, "history": json.dumps(res.history), "state": res.state,
          "loopSeconds": res.loop_seconds, "resumedFrom": res.resumed_from}],
        schema=pa.schema([("rank", pa.int32()), ("history", pa.string()), ("state", pa.binary()),
                          ("loopSeconds", pa.float64()), ("resumedFrom", pa.int64())]))


def run_spark(df: DataFrame, spec: TrainSpec, num_workers: int,
              progress: tuple[str, int, str] | None = None, timeout_s: float = 600.0) -> list[WorkerResult]:
    """Train on ``df`` (columns ``__features`` array<float>, ``__label`` double) with ``num_workers`` tasks."""
    from functools import partial

    sc = df.sparkSession.sparkContext
    slots = available_slots(sc, wanted=num_workers)
    if num_workers > slots:
        raise ValueError(f"numWorkers={num_workers} but the cluster can run only {slots} tasks at once "
                         f"(a barrier stage needs all of them together); set numWorkers <= {slots}")
    if df.rdd.getNumPartitions() != num_workers:
        df = df.repartition(num_workers)
    fn = partial(barrier_worker, spec, num_workers, progress, timeout_s)
    # The shuffle after the barrier stage makes it a ShuffleMapStage, which Spark re-runs when a task
    # fails; a failed barrier ResultStage is never retried.
    rows = df.mapInArrow(fn, RESULT_SCHEMA, barrier=True).repartition(1).collect()
    return [WorkerResult(r["rank"], json.loads(r["history"]), r["state"], r["loopSeconds"], r["resumedFrom"])
            for r in sorted(rows, key=lambda r: r["rank"])]
