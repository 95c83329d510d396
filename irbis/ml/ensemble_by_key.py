"""EnsembleByKey: combine numbers and vectors over rows that share keys."""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.ml.stat import Summarizer
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DoubleType, NumericType, StructField, StructType
from pyspark.sql.window import WindowSpec

from irbis.kernels.ensemble import ENSEMBLE_STRATEGIES, check_strategy, default_output_names, ensemble_frame
from irbis.ml.base import IrbisTransformer
from irbis.ml.column_types import vector_size
from irbis.ml.params import Row, one_of, table_mixin
from irbis.ml.synapseml import EnsembleByKeyNames, int_map
from irbis.spark.columns import column

# A null vector enters the JVM summarizer as a filler with a vanishing weight: it keeps the
# summarizer non-empty for all-null groups without changing any mean, sum, max or min.
_TINY_WEIGHT = 1e-300
_FILLERS = {"mean": 0.0, "sum": 0.0, "max": float("-inf"), "min": float("inf")}


_ENSEMBLE_ROWS: list[Row] = [
    ("keys", "columns whose values define the groups", TypeConverters.toListString, []),
    ("cols", "numeric or vector columns to combine", TypeConverters.toListString, []),
    ("colNames", "output names, one per column of cols; unset or empty: '<strategy>(<col>)'",
     TypeConverters.toListString, None),
    ("strategy", f"how to combine: one of {sorted(ENSEMBLE_STRATEGIES)}", TypeConverters.toString, "mean",
     one_of(*ENSEMBLE_STRATEGIES)),
    ("collapseGroup", "one row per group (true) or keep every row (false)", TypeConverters.toBoolean, True),
    ("vectorDims", "length of the vectors of each vector column, as SynapseML's vectorDims: given, it saves "
     "the job that reads a first row to learn it", int_map("vectorDims"), {}),
]


_EnsembleParams: Any = table_mixin("_EnsembleParams", _ENSEMBLE_ROWS)


class EnsembleByKey(EnsembleByKeyNames, _EnsembleParams, IrbisTransformer):
    """Combine columns over the rows that share ``keys`` (camera bursts, augmented copies).

    Numbers are combined with ``strategy`` (``mean``, ``sum``, ``max``, ``min``) ignoring
    missing values (null and NaN); vectors are combined element-wise in the JVM, ignoring
    null vectors. A group with no value gives null. Null keys form a group of their own.
    With ``collapseGroup=True`` (default) the output holds one row per group: the keys and the
    results; with ``False`` every input row is kept and its group's results are appended.

    Bad input: unknown keys or columns raise ``ValueError`` naming them; a column that is not
    numeric or a vector raises ``TypeError``; vectors of different lengths within a group fail
    the job with Spark's "Dimensions mismatch" error (on pandas, a ``ValueError`` naming the
    column).

    Examples
    --------
    >>> EnsembleByKey(keys=["burst"], cols=["probability"]).transform(df)  # doctest: +SKIP
    """

    def getColNames(self) -> list[str]:  # noqa: N802
        """The output names: colNames when set, else the derived ``'<strategy>(<col>)'`` of each column of
        cols (``["mean(score)"]``), as SynapseML's getColNames answers; colNames has no default, as in
        SynapseML, so an unset colNames stays unset (and unsaved) however often it is read."""
        return self._output_names()

    def _output_names(self) -> list[str]:
        cols = self.getOrDefault("cols")
        names = self.getOrDefault("colNames") if self.isDefined("colNames") else []
        if names and len(names) != len(cols):
            raise ValueError(f"EnsembleByKey: colNames has {len(names)} names for {len(cols)} cols; "
                             "give one per column")
        return list(names) or default_output_names(cols, self.getOrDefault("strategy"))

    def _input_columns(self) -> list[str]:
        return [*self.getOrDefault("keys"), *self.getOrDefault("cols")]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        return [(n, DoubleType()) for n in self._output_names()]

    def _validate_schema(self, schema: StructType) -> None:
        if not self.getOrDefault("keys"):
            raise ValueError("EnsembleByKey: keys is empty; give the columns that define the groups")
        check_strategy(self.getOrDefault("strategy"))
        for col in self.getOrDefault("vectorDims"):
            if col not in self.getOrDefault("cols") or not isinstance(schema[col].dataType, VectorUDT):
                raise ValueError(f"EnsembleByKey: vectorDims names {col!r}, which is not a vector column of cols "
                                 f"{self.getOrDefault('cols')}")
        for col in self.getOrDefault("cols"):
            dtype = schema[col].dataType
            if not isinstance(dtype, NumericType | VectorUDT):
                raise TypeError(
                    f"EnsembleByKey: column {col!r} must be numeric or a vector, found {dtype.simpleString()}"
                )

    def transform_schema(self, schema: StructType) -> StructType:
        """Schema of the output for an input of ``schema``."""
        self._check_schema(schema)
        outs = [
            StructField(n, schema[c].dataType if isinstance(schema[c].dataType, VectorUDT) else DoubleType(), True)
            for c, n in zip(self.getOrDefault("cols"), self._output_names())
        ]
        if self.getOrDefault("collapseGroup"):
            return StructType([schema[k] for k in self.getOrDefault("keys")] + outs)
        return StructType(schema.fields + outs)

    def _transform(self, dataset: Any) -> Any:
        if isinstance(dataset, pd.DataFrame):
            return ensemble_frame(
                dataset, self.getOrDefault("keys"), self.getOrDefault("cols"), self._output_names(),
                self.getOrDefault("strategy"), self.getOrDefault("collapseGroup"),
            )
        return self._transform_spark(dataset)

    def _transform_spark(self, df: DataFrame) -> DataFrame:
        self._check_schema(df.schema)
        keys, strategy = self.getOrDefault("keys"), self.getOrDefault("strategy")
        prefix = f"__{self.uid}_"
        dims = self.getOrDefault("vectorDims")
        specs = [_aggregate(df, c, strategy, f"{prefix}{i}", dims.get(c))
                 for i, c in enumerate(self.getOrDefault("cols"))]
        prepared = [column for columns, _ in specs for column in columns]
        names = self._output_names()
        if self.getOrDefault("collapseGroup"):
            grouped = df.select(*map(column, keys), *prepared).groupBy(*map(column, keys))
            return grouped.agg(*[make(None).alias(n) for (_, make), n in zip(specs, names)])
        window = Window.partitionBy(*map(column, keys))
        out = df.select("*", *prepared)
        temps = [name for name in out.columns if name.startswith(prefix)]
        return out.select("*", *[make(window).alias(n) for (_, make), n in zip(specs, names)]).drop(*temps)


#: Vectors up to this size are combined element by element with SQL aggregates (faster than Summarizer
#: there); longer ones with Summarizer (per-element aggregates grow slower than it with the size).
_ELEMENTWISE_MAX_SIZE = 64


def _aggregate_elementwise(col: str, strategy: str, tmp: str, size: int) -> tuple[list[Column], Callable]:
    """Combine short vectors with one SQL aggregate per element; null vectors are skipped."""
    func = {"mean": F.avg, "sum": F.sum, "max": F.max, "min": F.min}[strategy]
    c = column(col)
    arr = vector_to_array(c)
    message = (f"EnsembleByKey: column {col!r} holds vectors of different lengths "
               f"(expected {size}); vectors combined in one group must have the same length")
    prepared = [F.when(c.isNull(), F.lit(None)).when(F.size(arr) != size, F.raise_error(F.lit(message)))
                .otherwise(arr).alias(tmp)]

    def make(w: WindowSpec | None) -> Column:
        over = (lambda col: col) if w is None else (lambda col: col.over(w))
        elements = [over(func(column(tmp)[i])) for i in range(size)]
        return F.when(over(F.count(tmp)) > 0, array_to_vector(F.array(*elements)))

    return prepared, make


def _aggregate(df: DataFrame, col: str, strategy: str, tmp: str,
               size: int | None = None) -> tuple[list[Column], Callable]:
    """Prepare ``col`` for combining with ``strategy``.

    Returns the columns to add under the ``tmp`` prefix before aggregating (computed by generated
    code, so the aggregate itself only reads columns) and ``make(window_or_None) -> Column``. ``size``
    is the vectors' length when known (``vectorDims``); None reads it from the data.
    """
    c = column(col)
    if not isinstance(df.schema[col].dataType, VectorUDT):
        prepared = [F.nanvl(c.cast("double"), F.lit(None).cast("double")).alias(tmp)]
        func = {"mean": F.avg, "sum": F.sum, "max": F.max, "min": F.min}[strategy]
        return prepared, lambda w: func(tmp) if w is None else func(tmp).over(w)
    size = vector_size(df, col) if size is None else size
    if size == 0:  # no vector at all: every group is empty
        return [], lambda w: F.lit(None).cast(VectorUDT())
    if size <= _ELEMENTWISE_MAX_SIZE:
        return _aggregate_elementwise(col, strategy, tmp, size)
    filler = array_to_vector(F.array_repeat(F.lit(_FILLERS[strategy]), size))
    prepared = [
        F.coalesce(c, filler).alias(tmp),
        F.when(c.isNull(), F.lit(_TINY_WEIGHT)).otherwise(F.lit(1.0)).alias(tmp + "_w"),
        c.isNotNull().cast("int").alias(tmp + "_n"),
    ]
    summary = Summarizer.metrics(strategy).summary(column(tmp), column(tmp + "_w"))

    def make(w: WindowSpec | None) -> Column:
        present = F.sum(tmp + "_n") if w is None else F.sum(tmp + "_n").over(w)
        value = summary if w is None else summary.over(w)
        return F.when(present > 0, value[strategy])

    return prepared, make
