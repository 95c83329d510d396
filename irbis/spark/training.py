"""Spark side of training: the training frame, and the per-rank function of the barrier stage.

:func:`training_frame` selects the features as ``array<float>`` and the label as
double; :func:`train_partition` is what every rank of
:class:`~irbis.spark.barrier.SparkBarrierBackend` runs: read its Arrow batches into
a dense shard, all-gather the partitions' profiles, run the checks of
:mod:`irbis.train.checks` on every rank alike (returning, not raising, a problem),
then the one training loop.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, NumericType

from irbis.errors import NonFiniteLossError, require_columns, with_fields
from irbis.train.backends.base import Rank
from irbis.train.data import Shard
from irbis.train.loop import TrainSpec, WorkerResult
from irbis.spark.columns import column

FEATURES, LABEL = "__features", "__label"


def training_frame(df: DataFrame, features_col: str, label_col: str, stage: str = "TorchEstimator") -> DataFrame:
    """Select features as ``array<float>`` and the label as double, under fixed names."""
    require_columns(stage, df.columns, [features_col], role="featuresCol")
    require_columns(stage, df.columns, [label_col], role="labelCol")
    ftype = df.schema[features_col].dataType
    if isinstance(ftype, VectorUDT):
        feats = vector_to_array(column(features_col), "float32")
    elif isinstance(ftype, ArrayType) and isinstance(ftype.elementType, NumericType):
        feats = column(features_col).cast("array<float>")
    else:
        raise with_fields(TypeError(f"featuresCol {features_col!r} must be a vector or an array of numbers, "
                                    f"found {ftype}"), column=features_col, expected="vector", found=str(ftype))
    ltype = df.schema[label_col].dataType
    if not isinstance(ltype, NumericType):
        raise with_fields(TypeError(f"labelCol {label_col!r} must be numeric, found {ltype}; index string labels "
                                    "first (e.g. pyspark.ml.feature.StringIndexer)"),
                          column=label_col, expected="numeric", found=str(ltype))
    return df.select(feats.alias(FEATURES), column(label_col).cast("double").alias(LABEL))


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
    if feats.null_count or (len(lengths) and lengths.min() != lengths.max()):
        return None, shard_profile(lengths, y, feats.null_count)
    x = feats.flatten().to_numpy(zero_copy_only=False).reshape(len(y), -1 if len(y) else 0)
    nonfinite = int((~np.isfinite(x).all(axis=1) | ~np.isfinite(y)).sum()) if len(y) else 0
    return Shard(x, y), shard_profile(lengths, y, 0, nonfinite)


def train_partition(spec: TrainSpec, columns: tuple[str, str], progress: tuple[str, int, str] | None,
                    rank: Rank, num_workers: int | None = None) -> WorkerResult | Exception:
    """One rank's training over its partition; bad data is returned (alike on every rank), not raised.

    ``columns`` are the user's feature and label column names, for the error messages; ``progress``
    is the driver's progress endpoint (rank 0 reports to it), or None. Ranks from ``num_workers`` on
    (default: none) are dedicated parameter servers, with empty partitions.
    """
    import torch

    from irbis.train.checks import merge_profiles, validation_error
    from irbis.train.roles import run_rank
    from irbis.train.networks import build_network
    from irbis.train.progress import ProgressClient

    spec = replace(spec, device=rank.device)
    t0 = time.perf_counter()
    shard, profile = arrow_to_shard(rank.data)
    read_s = time.perf_counter() - t0
    workers = rank.world_size if num_workers is None else num_workers
    profiles = rank.comm.all_gather(torch.from_numpy(profile))[:workers]  # the servers' partitions are empty
    merged = merge_profiles([t.numpy() for t in profiles])
    module = build_network(spec.network)
    error = validation_error(merged, module, spec, *columns, workers)
    if error is not None:
        return error
    report = ProgressClient(progress) if rank.rank == 0 else None
    try:
        result = run_rank(spec, workers, shard, rank.comm, rank.rank, spec.device, rank.host, report, module)
    except NonFiniteLossError as err:
        return err  # every rank stops at the same epoch with the same error
    finally:
        if report is not None:
            report.close()
    result.info.update(readSeconds=read_s, features=merged["max_len"])
    return result


__all__ = ["FEATURES", "LABEL", "arrow_to_shard", "train_partition", "training_frame"]
