"""``TabularLIME``: background statistics (Spark or pandas), then table rows explained (see :mod:`irbis.ml.lime`)."""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np
from pyspark.ml.param import TypeConverters
from pyspark.sql.types import DataType, StructType

from irbis.errors import require_columns
from irbis.explain.lime import FeatureStats, check_num_samples, explain_rows
from irbis.kernels.blocks import BatchFn, Tensor, rows_in
from irbis.ml.base import IrbisEstimator, IrbisModel
from irbis.ml.lime_base import LIMEParams
from irbis.ml.params import table_mixin
from irbis.spark.columns import column as quoted

__all__ = ["TabularLIME", "TabularLIMEModel", "explain_tensor", "feature_stats"]


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
        values = F.when(quoted(column).isNotNull(), vector_to_array(quoted(column)))
        cells = dataset.select(F.posexplode(values).alias("i", "v"))
        finite = F.when(~F.isnan("v"), F.col("v"))
        rows = cells.groupBy("i").agg(F.avg(finite).alias("m"), F.stddev_pop(finite).alias("s")).collect()
        size = max((r.i for r in rows), default=-1) + 1
        mean, std = np.zeros(size), np.ones(size)
        for r in rows:  # a feature with no finite value keeps mean 0 and std 1
            mean[r.i] = r.m if r.m is not None else 0.0
            std[r.i] = r.s if r.s else 1.0
        return FeatureStats(mean, std)
    require_columns("TabularLIME", dataset.columns, [column])
    block = rows_in(dataset[column].tolist(), column)
    if not isinstance(block, Tensor):
        raise TypeError(f"TabularLIME: input column {column!r} must hold vectors")
    if not len(block.values):
        return FeatureStats(np.zeros(0), np.ones(0))
    return FeatureStats.from_data(block.values.reshape(len(block.values), -1))


def explain_tensor(block: Any, score: Callable[[np.ndarray], np.ndarray], settings: dict[str, Any],
                   stats: FeatureStats) -> dict[str, Any]:
    """Explain the rows of a vector block; rows that are null or hold NaN get a reason instead.

    ``settings`` holds the stage's Param values (see ``LIMEParams._settings`` in :mod:`irbis.ml.lime`).
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


def _rows_block(batch: np.ndarray) -> Tensor:
    return Tensor(batch, np.ones(len(batch), bool))

class TabularLIME(LIMEParams, IrbisEstimator):
    """Fit per-feature statistics on background data, to explain a model's predictions on table rows.

    ``inputCol`` is a vector column, the one the model reads. ``fit`` records each feature's mean and
    standard deviation (ignoring nulls and NaN); the fitted :class:`TabularLIMEModel` explains each row
    from ``numSamples`` samples drawn from those normals (the ``lime`` package's continuous sampling),
    weighting one standardised feature each.

    Examples
    --------
    >>> lime = TabularLIME(model=lr_model, inputCol="features", targetClasses=[1]).fit(train)  # doctest: +SKIP
    >>> lime.transform(test).select("weights", "r2")                                            # doctest: +SKIP
    """

    _defaults = {"inputCol": "features", "outputCol": "weights", "numSamples": 1000, "miniBatchSize": 8192}

    def _fit(self, dataset: Any) -> "TabularLIMEModel":
        stats = feature_stats(dataset, self.getInputCol())
        model = TabularLIMEModel(featureMeans=stats.mean.tolist(), featureStds=stats.std.tolist())
        model._set(**{p.name: v for p, v in self.extractParamMap().items() if model.hasParam(p.name)})
        model._model = self._model
        return model


_STATS_PARAMS: Any = table_mixin("HasFeatureStats", [
    ("featureMeans", "per-feature means of the background data", TypeConverters.toListFloat, []),
    ("featureStds", "per-feature standard deviations of the background data", TypeConverters.toListFloat, []),
])


class TabularLIMEModel(LIMEParams, _STATS_PARAMS, IrbisModel):
    """Explain table rows: a weight per feature (of the standardised values) and target class."""

    _accepts = frozenset({"vector"})

    _defaults = TabularLIME._defaults

    def stats(self) -> FeatureStats:
        """The background statistics as arrays."""
        return FeatureStats(np.asarray(self.getOrDefault(self.featureMeans), np.float64),
                            np.asarray(self.getOrDefault(self.featureStds), np.float64))

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        return self._result_columns()

    def _validate_schema(self, schema: StructType) -> None:
        from pyspark.ml.linalg import VectorUDT

        found = schema[self.getInputCol()].dataType
        if not isinstance(found, VectorUDT):
            raise TypeError(f"TabularLIMEModel: input column {self.getInputCol()!r} must be a vector, "
                            f"found {found.simpleString()}")
        check_num_samples(self.getNumSamples(), len(self.getOrDefault(self.featureMeans)))

    _to_block = staticmethod(_rows_block)

    def _make_batch_fn(self) -> BatchFn:
        check_num_samples(self.getNumSamples(), len(self.getOrDefault(self.featureMeans)))
        return super()._make_batch_fn()

    def _explainer(self) -> Callable[[Any, Callable[[np.ndarray], np.ndarray]], dict[str, Any]]:
        return partial(explain_tensor, settings=self._settings(), stats=self.stats())


TabularLIME._model_class = TabularLIMEModel  # the Model class that TabularLIME.fit returns
