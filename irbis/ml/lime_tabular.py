"""The table side of the LIME stages: background statistics (Spark or pandas) and rows explained."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from irbis.explain.lime import FeatureStats, explain_rows
from irbis.kernels.blocks import Tensor, rows_in

__all__ = ["explain_tensor", "feature_stats"]


def feature_stats(dataset: Any, column: str) -> FeatureStats:
    """Per-feature mean and standard deviation of a vector column, ignoring nulls and NaN.

    On Spark the statistics are one aggregation in SQL (no rows are collected); a frame without a
    non-null row gives no features.
    """
    if hasattr(dataset, "sparkSession"):
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import functions as F

        found = dataset.schema[column].dataType if column in dataset.columns else None
        if not isinstance(found, VectorUDT):
            raise TypeError(f"TabularLIME: input column {column!r} must be a vector, found "
                            f"{'no such column' if found is None else found.simpleString()}; "
                            f"the DataFrame has columns {dataset.columns}")
        values = F.when(F.col(column).isNotNull(), vector_to_array(F.col(column)))
        cells = dataset.select(F.posexplode(values).alias("i", "v")).where(~F.isnan("v"))
        rows = cells.groupBy("i").agg(F.avg("v").alias("m"), F.stddev_pop("v").alias("s")).collect()
        size = max((r.i for r in rows), default=-1) + 1
        mean, std = np.zeros(size), np.ones(size)
        for r in rows:
            mean[r.i] = r.m
            std[r.i] = r.s if r.s else 1.0
        return FeatureStats(mean, std)
    if column not in dataset.columns:
        raise ValueError(f"TabularLIME: input column {column!r} not found; the DataFrame has columns "
                         f"{list(dataset.columns)}")
    block = rows_in(dataset[column].tolist(), column)
    if not isinstance(block, Tensor):
        raise TypeError(f"TabularLIME: input column {column!r} must hold vectors")
    if not len(block.values):
        return FeatureStats(np.zeros(0), np.ones(0))
    return FeatureStats.from_data(block.values.reshape(len(block.values), -1))


def explain_tensor(block: Any, score: Callable[[np.ndarray], np.ndarray], settings: dict[str, Any],
                   stats: FeatureStats) -> dict[str, Any]:
    """Explain the rows of a vector block; rows that are null or hold NaN get a reason instead.

    ``settings`` holds the stage's Param values (see ``_LIMEParams._settings`` in :mod:`irbis.ml.lime`).
    """
    col, err_col = settings["column"], settings["error"]
    if not isinstance(block, Tensor) and all(v is None for v in block):  # a column of nulls only
        block = Tensor(np.zeros((0, len(stats.mean))), np.zeros(len(block), bool))
    if not isinstance(block, Tensor):
        raise TypeError(f"TabularLIMEModel: column {col!r} must hold vectors, found {type(block).__name__}")
    values = (block.values.reshape(len(block.values), -1).astype(np.float64) if len(block.values)
              else np.zeros((0, len(stats.mean))))
    if len(values) and values.shape[1] != len(stats.mean):
        raise ValueError(f"TabularLIMEModel: column {col!r} holds vectors of {values.shape[1]} values, but "
                         f"the background data had {len(stats.mean)}; fit on data like the rows to explain")
    finite = np.isfinite(values).all(axis=1)
    if not finite.all() and not err_col:
        raise ValueError(f"TabularLIMEModel: column {col!r} has a row with NaN or infinite values")
    weights, r2 = explain_rows(values[finite], score, stats, settings["targets"],
                               num_samples=settings["num_samples"], alpha=settings["alpha"],
                               seed=settings["seed"], batch_size=settings["batch_size"],
                               target_name=settings["target_col"])
    rows: list[Any] = [None] * len(block)
    fits: list[Any] = [None] * len(block)
    reasons: list[Any] = ["the row is null"] * len(block)
    valid_at = np.flatnonzero(block.valid)
    for k, i in enumerate(valid_at[finite]):
        rows[i], fits[i], reasons[i] = weights[k].tolist(), r2[k].tolist(), None
    for i in valid_at[~finite]:
        reasons[i] = "the row has NaN or infinite values"
    out = {settings["output"]: rows, settings["metrics"]: fits}
    return {**out, err_col: reasons} if err_col else out
