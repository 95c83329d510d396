"""Spark side of training: the training frame, and the per-rank function of the barrier stage.

:func:`training_frame` selects the features as ``array<float>`` and the label as
double; :func:`train_partition` is what every rank of
:class:`~irbis.spark.barrier.SparkBarrierBackend` runs: read its Arrow batches into
a dense shard, all-gather the partitions' profiles, run the checks of
:mod:`irbis.train.checks` on every rank alike (returning, not raising, a problem),
then the one training loop.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, NumericType

from irbis.errors import NonFiniteLossError, require_columns, with_fields
from irbis.spark.columns import column, is_image_struct, steps_of_features
from irbis.train.backends.backend import Rank
from irbis.train.loop import TrainSpec, WorkerResult
from irbis.train.stream import FEATURES, LABEL, SpilledShard
from irbis.train.worker_data import Shard


def check_step_widths(df: DataFrame, features_col: str) -> int:
    """The number of features of each step of ``features_col`` (steps of features; 0 when no row has a step);
    ``ValueError`` naming the column and both widths where the steps do not all hold the same number. One
    aggregation job; null steps are left to the workers, which skip or name their rows under ``nanPolicy``."""
    from pyspark.sql import functions as F

    widths = F.transform(F.filter(column(features_col), lambda s: s.isNotNull()), lambda s: F.size(s))
    low, high = df.select(F.min(F.array_min(widths)), F.max(F.array_max(widths))).first() or (None, None)
    if low is not None and low != high:
        raise with_fields(ValueError(f"inputCol {features_col!r}: steps have different widths ({low} and {high} "
                                     "values); every step of every row needs the same number of features"),
                          column=features_col, expected=f"{high} values per step", found=low)
    return int(high or 0)


def input_kind(df: DataFrame, features_col: str, binary_as: str = "tensor") -> str:
    """The :data:`~irbis.train.stream.INPUT_KINDS` entry of a features column: ``sequence`` (an array of
    integers, int or long: token ids; or an array of arrays of numbers: steps of features; their number free
    to vary per row), ``vector`` (a vector or an array of other numbers), ``image`` (a Spark image struct), or
    for a binary column ``binary_as`` (``tensor`` bytes or ``encoded`` image files). Raises ``TypeError``
    naming the column for anything else."""
    from pyspark.ml.linalg import VectorUDT  # here, not at the top: the workers that import this module
    # to train need no pyspark.ml, whose import costs them seconds
    ftype = df.schema[features_col].dataType
    if (isinstance(ftype, ArrayType) and isinstance(ftype.elementType, (IntegerType, LongType))) \
            or steps_of_features(ftype):
        return "sequence"
    if isinstance(ftype, VectorUDT) or (isinstance(ftype, ArrayType) and isinstance(ftype.elementType, NumericType)):
        return "vector"
    if is_image_struct(ftype):
        return "image"
    if isinstance(ftype, BinaryType):
        return binary_as
    raise with_fields(TypeError(f"inputCol {features_col!r} must be a vector or an array of numbers (of "
                                f"integers: token ids), an array of arrays of numbers (steps of features), a Spark "
                                f"image struct, or binary (encoded image files or tensor bytes), found "
                                f"{ftype.simpleString()}"), column=features_col, expected="vector", found=str(ftype))


def training_frame(df: DataFrame, features_col: str | list[str], label_col: str, stage: str = "TorchEstimator",
                   binary_as: str = "tensor", dtype: str = "float32") -> DataFrame:
    """Select the features (numbers as ``array<float>``; images and bytes as they are) and the label (see
    :func:`label_column`), under fixed names. Several feature columns (``inputCols``) become one row of their
    values side by side: numbers as one ``array<float>``, with tensor bytes (of ``dtype``) as one binary value."""
    if not isinstance(features_col, str):
        require_columns(stage, df.columns, list(features_col), role="inputCols")
        require_columns(stage, df.columns, [label_col], role="labelCol")
        return df.select(joined_features(df, list(features_col), dtype).alias(FEATURES),
                         label_column(df, label_col).alias(LABEL))
    require_columns(stage, df.columns, [features_col], role="inputCol")
    require_columns(stage, df.columns, [label_col], role="labelCol")
    return df.select(_features(df, features_col, binary_as).alias(FEATURES), label_column(df, label_col).alias(LABEL))


def column_kinds(df: DataFrame, columns: list[str]) -> dict[str, str]:
    """The kind of each of several input columns: ``vector`` (a vector or an array of numbers, integers
    included) or ``tensor`` (binary tensor bytes). Raises ``TypeError`` naming the columns for images and
    sequences of varying length, which take one column (``inputCol``)."""
    kinds = {c: input_kind(df, c) for c in columns}
    kinds = {c: "vector" if k == "sequence" and not steps_of_features(df.schema[c].dataType) else k
             for c, k in kinds.items()}
    if set(kinds.values()) <= {"vector", "tensor"}:
        return kinds
    found = ", ".join(f"{c!r}: {df.schema[c].dataType.simpleString()}" for c in columns)
    raise with_fields(TypeError(f"inputCols must each be a vector, an array of numbers or binary tensor bytes "
                                f"(of inputDtype), found {found}; images, token ids and steps of features take "
                                "one column (inputCol)"), column=columns[0],
                      expected="vectors/arrays of numbers, or tensor bytes", found=found)


def input_kinds(df: DataFrame, columns: list[str], dtype: str = "float32") -> str:
    """How the workers read several input columns joined (:func:`joined_features`): ``vector`` when every
    column holds numbers, else ``tensor`` (the numbers are written as tensor bytes beside the binary columns,
    which takes ``dtype`` float32: other tensor types would round them)."""
    kinds = column_kinds(df, columns)
    if set(kinds.values()) == {"vector"}:
        return "vector"
    mixed = [c for c, k in kinds.items() if k == "vector"]
    if mixed and dtype != "float32":
        raise with_fields(ValueError(f"inputCols {columns} mix numbers ({mixed}) and tensor bytes of inputDtype "
                                     f"{dtype!r}; the numbers travel as float32 tensor bytes beside them, so the "
                                     "tensor columns must be float32 too (write them with tensor_bytes_column)"),
                          column=mixed[0], expected="float32", found=dtype)
    return "tensor"


def input_shapes(df: DataFrame, columns: list[str], given: list[list[int]] | None,
                 dtype: str = "float32") -> list[list[int]]:
    """The row shape of each of several input columns: ``given`` (``inputShapes``) checked against the
    columns' widths in their first row without nulls (tensor bytes: values of ``dtype``), else each width as
    a flat shape. Raises naming the column whose width disagrees."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F

    kinds = column_kinds(df, columns)

    def width(c: str) -> Any:
        if kinds[c] == "tensor":
            return F.length(column(c)) / np.dtype(dtype).itemsize
        return F.size(vector_to_array(column(c)) if isinstance(df.schema[c].dataType, VectorUDT) else column(c))

    present = df
    for c in columns:
        present = present.filter(column(c).isNotNull())
    first = present.select(*(width(c).cast("long").alias(f"w{i}") for i, c in enumerate(columns))).take(1)
    if not first:
        raise with_fields(ValueError(f"inputCols {columns} have no row without a null; drop the null rows"),
                          column=columns[0], expected="rows", found=0)
    widths = [int(w) for w in first[0]]
    if given is None:
        return [[w] for w in widths]
    if len(given) != len(columns):
        raise with_fields(ValueError(f"inputShapes has {len(given)} shapes for the {len(columns)} inputCols "
                                     f"{columns}; give one shape per column"), column=columns[0],
                          expected=len(columns), found=len(given))
    for c, shape, w in zip(columns, given, widths):
        if int(np.prod(shape)) != w:
            raise with_fields(ValueError(f"inputShapes gives column {c!r} the shape {shape} "
                                         f"({int(np.prod(shape))} values) but its rows hold {w}"),
                              column=c, expected=shape, found=w)
    return [list(s) for s in given]


def joined_features(df: DataFrame, columns: list[str], dtype: str = "float32") -> Any:
    """Several input columns as one row of their values side by side: one ``array<float>`` of numbers, or,
    where any column holds tensor bytes, one binary value (numbers written as float32 tensor bytes by
    :func:`~irbis.spark.tensors.tensor_bytes_of`); see :func:`input_kinds`."""
    from pyspark.sql import functions as F

    if input_kinds(df, columns, dtype) == "vector":
        return F.concat(*(_features(df, c, "tensor", numbers=True) for c in columns))
    from irbis.spark.tensors import tensor_bytes_of

    kinds = column_kinds(df, columns)
    return F.concat(*(column(c) if kinds[c] == "tensor" else tensor_bytes_of(df, c) for c in columns))


def _features(df: DataFrame, features_col: str, binary_as: str, numbers: bool = False) -> Any:
    """One features column as the workers read it; ``numbers``: integers as floats too (not token ids)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    kind = input_kind(df, features_col, binary_as)
    ftype = df.schema[features_col].dataType
    if isinstance(ftype, VectorUDT):
        return vector_to_array(column(features_col), "float32")
    if kind == "vector" or (kind == "sequence" and numbers):
        return column(features_col).cast("array<float>")
    if kind == "sequence":
        return column(features_col).cast("array<array<float>>" if steps_of_features(ftype) else "array<bigint>")
    return column(features_col)


def label_column(df: DataFrame, label_col: str) -> Any:
    """The label as the workers read it: a number as double, a vector (Spark ML vector or array of numbers:
    multi-label, soft or vector targets) as ``array<float>``. Raises ``TypeError`` naming the column for
    anything else."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    ltype = df.schema[label_col].dataType
    if isinstance(ltype, NumericType):
        return column(label_col).cast("double")
    if isinstance(ltype, VectorUDT):
        return vector_to_array(column(label_col), "float32")
    if isinstance(ltype, ArrayType) and isinstance(ltype.elementType, NumericType):
        return column(label_col).cast("array<float>")
    raise with_fields(TypeError(f"labelCol {label_col!r} must be numeric, or a vector or an array of numbers "
                                f"(multi-label, soft or vector targets), found {ltype.simpleString()}; index "
                                "string labels first (e.g. pyspark.ml.feature.StringIndexer)"),
                      column=label_col, expected="numeric or a vector", found=str(ltype))


#: Rows per Arrow batch that Spark sends a training task when the rows are images. Spark bounds these
#: batches by rows only (``spark.sql.execution.arrow.maxRecordsPerBatch``), and a batch of decoded image
#: structs (230 KiB for 320x240) at the session's 4096 rows would hold a whole partition's pixels at once.
IMAGE_BATCH_ROWS = 64


@contextlib.contextmanager
def arrow_batch_rows(session: Any, rows: int) -> Iterator[None]:
    """Run the jobs started inside with at most ``rows`` rows per Arrow batch sent to Python (the session's
    ``maxRecordsPerBatch`` lowered for the while, then put back)."""
    from irbis.spark.resources import conf

    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = conf(session, key)
    if old is not None and 0 < int(old) <= rows:
        yield
        return
    session.conf.set(key, str(rows))
    try:
        yield
    finally:
        if old is None:
            session.conf.unset(key)
        else:
            session.conf.set(key, old)


def arrow_to_shard(batches: Iterator[pa.RecordBatch]) -> tuple[Shard | SpilledShard | None, np.ndarray]:
    """A partition of numbers as dense numpy arrays, and its profile for the checks (see
    :func:`irbis.train.stream.read_partition`, which this is with no bound on the rows held)."""
    from irbis.train.stream import InputFormat, read_partition

    return read_partition(batches, InputFormat("vector"), buffer_rows=2 ** 62)


def train_partition(spec: TrainSpec, columns: tuple[str, str], progress: tuple[str, int, str] | None,
                    rank: Rank, num_workers: int | None = None) -> WorkerResult | Exception:
    """One rank's training over its partition; bad data is returned (alike on every rank), not raised.

    ``columns`` are the user's feature and label column names, for the error messages; ``progress``
    is the driver's progress endpoint (rank 0 reports to it), or None. Ranks from ``num_workers`` on
    (default: none) are dedicated parameter servers, with empty partitions.
    """
    from irbis.train.stream import InputFormat, read_partition

    spec = spec.updated(device=rank.device)
    t0 = time.perf_counter()

    shard, profile = read_partition(rank.data, spec.data.input_format or InputFormat("vector"), spec.data.shuffleBuffer,
                                    spec.data.spill_dir)
    read_s = time.perf_counter() - t0
    try:
        return _train_shard(spec, columns, progress, rank, num_workers, shard, profile, read_s)
    finally:
        if isinstance(shard, SpilledShard):
            shard.close()


def _train_shard(spec: TrainSpec, columns: tuple[str, str], progress: tuple[str, int, str] | None, rank: Rank,
                 num_workers: int | None, shard: Any, profile: np.ndarray, read_s: float) -> WorkerResult | Exception:
    import torch

    from irbis.train.checks import merge_profiles, validation_error
    from irbis.train.networks import build_network
    from irbis.train.progress import ProgressClient
    from irbis.train.roles import run_rank

    t0 = time.perf_counter()
    workers = rank.world_size if num_workers is None else num_workers
    profiles = rank.comm.all_gather(torch.from_numpy(profile))[:workers]  # the servers' partitions are empty
    merged = merge_profiles([t.numpy() for t in profiles])
    module = build_network(spec.network)
    error = validation_error(merged, module, spec, *columns, workers)
    if error is not None:
        return error
    report = ProgressClient(progress) if rank.rank == 0 else None
    prepare_s = time.perf_counter() - t0
    try:
        result = run_rank(spec, workers, shard, rank.comm, rank.rank, spec.hardware.device, rank.host, report, module)
    except NonFiniteLossError as err:
        return err  # every rank stops at the same epoch with the same error
    finally:
        if report is not None:
            report.close()
    result.info.update(readSeconds=read_s, prepareSeconds=prepare_s, features=merged["max_len"])
    return result


__all__ = ["FEATURES", "IMAGE_BATCH_ROWS", "LABEL", "arrow_batch_rows", "arrow_to_shard", "column_kinds", "input_kind",
           "input_kinds", "input_shapes", "joined_features", "label_column", "train_partition", "training_frame"]
