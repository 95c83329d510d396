"""Spark backend: one barrier stage, one task per worker, torch.distributed inside.

``df.mapInArrow(fn, schema, barrier=True)`` hands each task its partition as
Arrow record batches (no per-row Python objects). The driver serves the
rendezvous ``TCPStore`` on a free port (executors reach the driver anyway);
every worker joins the gloo (CPU) or NCCL (CUDA) process group on it, under a
prefix unique to the job and the stage attempt: handshakes, no sleeps. (A
rendezvous through ``BarrierTaskContext.allGather`` costs about a second here:
the first task to arrive polls for the answer once a second.) A failed task
fails the stage; Spark re-runs it and the workers resume from the last
checkpoint in the job's checkpoint directory (on ``local[N]`` masters a failed
task fails the job: Spark retries tasks only on cluster masters).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, NumericType

from irbis.train.comm import serve_store
from irbis.train.data import Shard
from irbis.train.loop import TrainSpec, WorkerResult

RESULT_SCHEMA = ("rank int, error string, history string, state binary, info string, loopSeconds double, "
                 "resumedFrom long")
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
    for role, col in (("featuresCol", features_col), ("labelCol", label_col)):
        if col not in df.columns:
            raise ValueError(f"TorchEstimator: {role} {col!r} not found; the DataFrame has columns {df.columns}")
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


def arrow_to_shard(batches: Iterator[pa.RecordBatch]) -> tuple[Shard | None, np.ndarray]:
    """A partition's record batches as dense numpy arrays, and its profile for the checks.

    The shard is None when rows are null or of unequal length (the checks then fail on every worker).
    """
    import pyarrow.compute as pc

    from irbis.train.checks import shard_profile

    got = list(batches)
    if got:
        feats = pa.chunked_array([b.column(FEATURES) for b in got]).combine_chunks()
        labels = pa.chunked_array([b.column(LABEL) for b in got]).combine_chunks()
    else:
        feats, labels = pa.array([], pa.list_(pa.float32())), pa.array([], pa.float64())
    y = pc.fill_null(labels, float("nan")).to_numpy(zero_copy_only=False)
    lengths = pc.list_value_length(feats).drop_null().to_numpy(zero_copy_only=False)
    profile = shard_profile(lengths, y, feats.null_count)
    if feats.null_count or (len(lengths) and lengths.min() != lengths.max()):
        return None, profile
    x = feats.flatten().to_numpy(zero_copy_only=False).reshape(len(y), -1 if len(y) else 0)
    return Shard(x, y), profile


def _join(rendezvous: tuple[str, int, str], rank: int, world: int, timeout_s: float) -> Any:
    """Connect to the driver's store, under a prefix unique to this job and stage attempt.

    Every task of a barrier stage starts once per stage attempt, so the number of
    starts of this rank names the attempt the same way on every rank.
    """
    import torch.distributed as dist

    from irbis.train.comm import connect_store

    host, port, job = rendezvous
    store = connect_store(host, port, rank, world, timeout_s)
    attempt = store.add(f"{job}/starts/{rank}", 1)
    return dist.PrefixStore(f"{job}/{attempt}", store)


_ARROW_RESULT = pa.schema([("rank", pa.int32()), ("error", pa.string()), ("history", pa.string()),
                           ("state", pa.binary()), ("info", pa.string()), ("loopSeconds", pa.float64()),
                           ("resumedFrom", pa.int64())])


def barrier_worker(spec: TrainSpec, world: int, columns: tuple[str, str], rendezvous: tuple[str, int, str],
                   progress: tuple[str, int, str] | None, timeout_s: float,
                   batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The body of each barrier task (module level, so it pickles by reference)."""
    import torch
    import torch.distributed as dist
    from pyspark import BarrierTaskContext

    from irbis.train.checks import merge_profiles, validation_error
    from irbis.train.comm import init_torch_group
    from irbis.train.loop import train_worker
    from irbis.train.networks import build_network
    from irbis.train.progress import ProgressClient
    from irbis.train.strategy import WorkerContext

    t0 = time.perf_counter()
    shard, profile = arrow_to_shard(batches)
    rank = BarrierTaskContext.get().partitionId()
    t1 = time.perf_counter()
    comm = init_torch_group(_join(rendezvous, rank, world, timeout_s), rank, world, spec.device, timeout_s)
    t2 = time.perf_counter()
    report = ProgressClient(progress) if rank == 0 else None
    try:
        merged = merge_profiles([t.numpy() for t in comm.all_gather(torch.from_numpy(profile))])
        module = build_network(spec.network)
        error = validation_error(merged, module, spec, *columns, world)
        res = None if error else train_worker(spec, shard, WorkerContext(comm, rank, world, spec.device),
                                              report, module)
    finally:
        if report is not None:
            report.close()
        dist.destroy_process_group()
    info = {"readSeconds": t1 - t0, "rendezvousSeconds": t2 - t1, "taskSeconds": time.perf_counter() - t0,
            "features": merged["max_len"]}
    row = {"rank": rank, "error": error, "info": json.dumps(info)}
    if res is not None:
        row.update(history=json.dumps(res.history), state=res.state, loopSeconds=res.loop_seconds,
                   resumedFrom=res.resumed_from)
    yield pa.RecordBatch.from_pylist([row], schema=_ARROW_RESULT)


def _collect(df: DataFrame, fn: Any, retriable: bool) -> list[Any]:
    out = df.mapInArrow(fn, RESULT_SCHEMA, barrier=True)
    # A shuffle after the barrier stage makes it a ShuffleMapStage, which Spark re-runs when a task
    # fails (a failed barrier ResultStage is never retried); local[N] never retries tasks anyway.
    return sorted((out.repartition(1) if retriable else out).collect(), key=lambda r: r["rank"])


def run_spark(df: DataFrame, spec: TrainSpec, num_workers: int, columns: tuple[str, str] = ("features", "label"),
              progress: tuple[str, int, str] | None = None, timeout_s: float = 600.0) -> list[WorkerResult]:
    """Train on ``df`` (columns ``__features`` array<float>, ``__label`` double) with ``num_workers`` tasks.

    ``columns`` are the user's feature and label column names, for error messages.

    Raises
    ------
    ValueError
        Too many workers for the cluster's slots, or bad data found by the workers' checks.
    """
    from functools import partial

    sc = df.sparkSession.sparkContext
    slots = available_slots(sc, wanted=num_workers)
    if num_workers > slots:
        raise ValueError(f"numWorkers={num_workers} but the cluster can run only {slots} tasks at once "
                         f"(a barrier stage needs all of them together); set numWorkers <= {slots}")
    if df.rdd.getNumPartitions() != num_workers:
        df = df.repartition(num_workers)
    retriable = not (sc.master == "local" or (sc.master.startswith("local[") and "," not in sc.master))
    host = sc.getConf().get("spark.driver.host", "127.0.0.1")
    store = serve_store(host, num_workers, timeout_s)
    fn = partial(barrier_worker, spec, num_workers, columns, (host, store.port, uuid.uuid4().hex), progress,
                 timeout_s)
    try:
        rows = _collect(df, fn, retriable)
    except Exception as err:  # noqa: BLE001 - py4j wraps the JVM exception
        if "BarrierJobUnsupportedRDDChainException" not in str(err):
            raise
        # e.g. a coalesce() in the same stage: give the barrier stage its own shuffled input
        rows = _collect(df.repartition(num_workers), fn, retriable)
    del store
    if rows[0]["error"]:
        kind, _, msg = rows[0]["error"].partition(": ")
        raise (TypeError if kind == "TypeError" else ValueError)(msg)
    return [WorkerResult(r["rank"], json.loads(r["history"]), r["state"], r["loopSeconds"], r["resumedFrom"],
                         json.loads(r["info"])) for r in rows]
