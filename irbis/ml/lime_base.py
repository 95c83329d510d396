"""What the LIME stages share: their Params, the explained model (a saved sub-stage), the Spark fallback.

See :mod:`irbis.ml.lime` for the stages themselves.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
from pyspark.ml.param import TypeConverters
from pyspark.ml.param.shared import HasSeed
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, DoubleType, LongType, StringType, StructField, StructType

from irbis.errors import NoKernelError
from irbis.kernels.blocks import BatchFn, rows_in
from irbis.ml.lime_scoring import local_score_fn, scoring_chain, spark_score_fn
from irbis.ml.params import ColumnSetters, HasErrorCol, HasMiniBatchSize, Row, at_least, table_mixin

__all__ = ["LIMEParams"]

_WEIGHTS = ArrayType(ArrayType(DoubleType()))


#: LIME's own Params (SynapseML's names), declared through the one Param table of ``irbis.ml.params``.
LIME_PARAMS: list[Row] = [
    ("targetCol", "the model's output column to explain (a vector or a number), e.g. probability",
     TypeConverters.toString, "probability"),
    ("targetClasses", "indices into targetCol to explain; one weight list each", TypeConverters.toListInt, [0]),
    ("numSamples", "perturbed samples per explained row", TypeConverters.toInt, None, at_least(2)),
    ("regularization", "L2 penalty of the weighted ridge fit (0: least squares)", TypeConverters.toFloat, 0.0,
     at_least(0)),
    ("metricsCol", "output column of the local fit's R², one per target class", TypeConverters.toString, "r2"),
]


HasLIMEParams: Any = table_mixin("HasLIMEParams", LIME_PARAMS)


class LIMEParams(ColumnSetters, HasErrorCol, HasMiniBatchSize, HasSeed, HasLIMEParams):
    """Params and the explained model shared by the LIME stages."""

    _defaults = {"errorCol": "explainError", "seed": 0}
    _extra_keywords = ("model",)

    def _init_state(self) -> None:
        self._model: Any = None

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        model = kwargs.pop("model", None)  # the explained model, not a Param
        if model is not None:
            self.setModel(model)
        return kwargs

    def _check_params(self) -> None:
        classes = self.getOrDefault(self.targetClasses)
        if not classes or min(classes) < 0:
            raise ValueError(f"targetClasses must be a non-empty list of class indices >= 0, found {classes}")

    def setModel(self, value: Any) -> Any:  # noqa: N802
        """Set the fitted Transformer or PipelineModel to explain."""
        if not hasattr(value, "transform"):
            raise TypeError(f"model must be a fitted Transformer or PipelineModel, found {type(value).__name__}")
        self._model = value
        return self

    def getModel(self) -> Any:  # noqa: N802
        """The explained model."""
        if self._model is None:
            raise ValueError(f"{type(self).__name__}: set the model to explain (setModel)")
        return self._model

    def _result_columns(self) -> list[tuple[str, DataType]]:
        cols = [(self.getOutputCol(), _WEIGHTS), (self.getOrDefault(self.metricsCol), ArrayType(DoubleType()))]
        return cols + ([(self.getErrorCol(), StringType())] if self.getErrorCol() else [])

    # -- the model as a scoring function ---------------------------------------------------------
    #: perturbed inputs (an array) -> the block that the model's first stage reads
    _to_block: Callable[[np.ndarray], Any]

    def _settings(self) -> dict[str, Any]:
        """Plain values of the Params that the per-row work needs (what travels to the workers)."""
        return dict(column=self.getInputCol(), output=self.getOutputCol(),
                    metrics=self.getOrDefault(self.metricsCol), error=self.getErrorCol(),
                    targets=self.getTargetClasses(), target_col=self.getTargetCol(),
                    num_samples=self.getNumSamples(), alpha=self.getOrDefault(self.regularization),
                    seed=self.getOrDefault(self.seed), batch_size=self.getMiniBatchSize())

    def _explainer(self) -> Callable[[Any, Callable[[np.ndarray], np.ndarray]], dict[str, Any]]:
        """A picklable ``(block, score) -> output blocks`` with the Params' values bound."""
        raise NotImplementedError

    def _local_score(self) -> Callable[[np.ndarray], np.ndarray]:
        chain = scoring_chain(self.getModel())
        missing = [s.name for s in chain.missing]
        if missing:
            raise NoKernelError(missing, f"{type(self).__name__}: the model's stages {missing} have no kernel; "
                                         "explain a Spark DataFrame instead (a Spark job per batch of perturbations)")
        score, to_block = local_score_fn(chain, self.getInputCol(), self.getTargetCol()), type(self)._to_block
        return lambda batch: score(to_block(batch))

    def _make_batch_fn(self) -> BatchFn:
        score, explain, col = self._local_score(), self._explainer(), self.getInputCol()
        return lambda blocks: explain(blocks[col], score)

    # -- Spark ------------------------------------------------------------------------------------
    def _transform_spark(self, df: DataFrame) -> DataFrame:
        if not scoring_chain(self.getModel()).missing:
            return super()._transform_spark(df)
        self._check_schema(df.schema)
        return _explain_on_driver(self, df)

    # -- persistence ------------------------------------------------------------------------------
    def _has_extra(self) -> bool:
        return True

    def _save_extra(self, path: str) -> None:
        if self._model is not None:
            self._model.write().save(os.path.join(path, "model"))

    def _load_extra(self, path: str) -> None:
        from pyspark.ml.util import DefaultParamsReader

        from irbis.spark.session import active_session

        folder = os.path.join(path, "model")
        if os.path.isdir(folder):  # the model may hold JVM stages: read in the session in use (Connect too)
            spark = active_session(f"loading a saved {type(self).__name__}")
            self._model = DefaultParamsReader.loadParamsInstance(folder, spark)


def _explain_on_driver(stage: Any, df: DataFrame) -> DataFrame:
    """The fallback for models without pandas kernels: collect the inputs, score with Spark jobs.

    The rows are keyed and cached, so that the explanations join back to the rows they were made for.
    """
    col, key = stage.getInputCol(), f"__irbis_row_{stage.uid}"
    score = spark_score_fn(stage.getModel(), df.sparkSession, col, df.schema[col], stage.getTargetCol())
    keyed = df.withColumn(key, F.monotonically_increasing_id()).cache()
    rows = keyed.select(key, stage._udf_input(df.schema[col])).collect()
    out = stage._explainer()(rows_in([r[1] for r in rows], col), score) if rows else {}
    names = [n for n, _ in stage._output_columns()]
    results = [(r[0], *[_plain(out[n][i]) for n in names]) for i, r in enumerate(rows)]
    schema = StructType([StructField(key, LongType())] + [StructField(n, t) for n, t in stage._output_columns()])
    return keyed.join(df.sparkSession.createDataFrame(results, schema), key, "left").drop(key)


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value
