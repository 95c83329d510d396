"""Featurize: mixed columns to one numeric vector, fitted on training data."""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import pandas as pd
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import TypeConverters
from pyspark.ml.param.shared import HasInputCols, HasOutputCol
from pyspark.ml.stat import Summarizer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    NumericType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from irbis.errors import require_columns
from irbis.kernels.mixed_columns import (
    build_column_plan,
    column_stats,
    imputes,
    infer_kind,
    invalid_rows,
    slot_names,
    transform_frame,
)
from irbis.ml.aliases import alias_mixin
from irbis.ml.base import IrbisEstimator, IrbisModel
from irbis.ml.column_types import vector_size
from irbis.ml.params import Row, at_least, one_of, table_mixin
from irbis.ml.synapseml import FEATURIZE_ALIASES
from irbis.spark.columns import column


def spark_kind(dtype: DataType) -> str | None:
    """Kind of a Spark column for featurisation, or ``None`` when it cannot be featurised."""
    if isinstance(dtype, BooleanType):
        return "boolean"
    if isinstance(dtype, NumericType):
        return "numeric"
    if isinstance(dtype, StringType):
        return "string"
    if isinstance(dtype, VectorUDT):
        return "vector"
    if isinstance(dtype, DateType):
        return "date"
    if isinstance(dtype, TimestampType | TimestampNTZType):
        return "timestamp"
    return None


_FEATURIZE_ROWS: list[Row] = [
    ("maxCategories", "strings with at most this many distinct values are one-hot encoded", TypeConverters.toInt,
     50, at_least(1)),
    ("numHashBuckets", "one-hot slots for hashed high-cardinality strings", TypeConverters.toInt, 256, at_least(1)),
    ("imputeMissing", "SynapseML's imputeMissing: True imputes a missing number with the training mean (and "
     "flags it in a <col>_missing slot); False leaves it missing (null or NaN), an invalid value that "
     "vectorAssemblerHandleInvalid handles. Booleans, vectors, dates and timestamps are imputed either way",
     TypeConverters.toBoolean, True),
    ("vectorAssemblerHandleInvalid", "SynapseML's handling of the invalid values that reach its assembler, the "
     "missing numbers of imputeMissing=False: error fails the transform naming the column, skip drops the row, "
     "keep writes NaN in its slot; with imputeMissing no invalid value reaches the assembler, so each gives the "
     "same vectors", TypeConverters.toString, "error", one_of("error", "skip", "keep")),
]

_FeaturizeNames: Any = alias_mixin("_FeaturizeNames", FEATURIZE_ALIASES)
_FeaturizeRows: Any = table_mixin("_FeaturizeRows", _FEATURIZE_ROWS)


class _FeaturizeParams(_FeaturizeNames, _FeaturizeRows, HasInputCols, HasOutputCol):

    def _cols(self) -> list[str]:
        return list(self.getInputCols()) if self.isDefined("inputCols") else []

    def _check_schema_kinds(self, schema: StructType) -> dict[str, str]:
        stage, names = type(self).__name__, schema.fieldNames()
        if not self._cols():
            raise ValueError(f"{stage}: inputCols is empty; give the columns to featurize")
        kinds = {}
        for col in self._cols():
            require_columns(stage, names, [col])
            kind = spark_kind(schema[col].dataType)
            if kind is None:
                raise TypeError(
                    f"{stage}: column {col!r} has type {schema[col].dataType.simpleString()}; featurize numbers, "
                    "booleans, strings, vectors, dates or timestamps (drop or convert it first)"
                )
            kinds[col] = kind
        return kinds


class Featurize(IrbisEstimator, _FeaturizeParams):
    """Turn mixed columns into one feature vector, ready for a classifier.

    Numbers and booleans pass through, strings are one-hot encoded (at most ``maxCategories``
    distinct values, plus an "other" slot for values unseen in training) or hashed into
    ``numHashBuckets`` slots, vectors are appended, dates and timestamps become their parts
    (year, month, day, weekday, and hour, minute, second). Missing values are imputed with the
    training mean (a missing string gets no one-hot slot) and flagged in a ``<col>_missing``
    slot for columns that had missing values in training. With ``imputeMissing=False`` a missing
    number is left missing, as in SynapseML: ``vectorAssemblerHandleInvalid`` keeps its row with
    NaN in the slot (``keep``), drops the row (``skip``) or fails (``error``). The output vector carries
    ``ml_attr`` metadata naming each slot. See :mod:`irbis.kernels.mixed_columns`.

    Bad input: a missing column raises ``ValueError``; a column of another type (arrays,
    maps, structs, binary) raises ``TypeError`` naming it; vectors of another size than in
    training fail the transform with a ``ValueError`` naming the column.

    Examples
    --------
    >>> model = Featurize(inputCols=["age", "city", "signup"], outputCol="features").fit(train)  # doctest: +SKIP
    """

    def _fit(self, dataset: Any) -> "FeaturizeModel":
        if isinstance(dataset, pd.DataFrame):
            require_columns("Featurize", dataset.columns, self._cols())
            kinds = {c: infer_kind(dataset[c]) for c in self._cols()}
            stats = {c: column_stats(dataset[c], k) for c, k in kinds.items()}
        else:
            kinds = self._check_schema_kinds(dataset.schema)
            stats = spark_stats(dataset, kinds, self.getOrDefault("maxCategories"))
        plans = [
            build_column_plan(c, kinds[c], stats[c], self.getOrDefault("maxCategories"),
                              self.getOrDefault("numHashBuckets"), impute=self.getOrDefault("imputeMissing"))
            for c in self._cols()
        ]
        model = FeaturizeModel()
        self._copyValues(model)
        model._plans = plans
        return model


def spark_stats(df: DataFrame, kinds: dict[str, str], max_categories: int) -> dict[str, dict[str, Any]]:
    """The statistics of ``column_stats`` computed by Spark: one job, plus one per string or vector column."""
    aggs = []
    for col, kind in kinds.items():
        c = column(col)
        missing = c.isNull() | F.isnan(c.cast("double")) if kind == "numeric" else c.isNull()
        aggs.append(F.sum(F.when(missing, 1).otherwise(0)).alias(f"{col}\u0000missing"))
        if kind in ("numeric", "boolean"):
            aggs.append(F.avg(F.nanvl(c.cast("double"), F.lit(None).cast("double"))).alias(f"{col}\u0000mean"))
        elif kind == "date":
            aggs.append((F.avg(F.unix_date(c).cast("double")) * 86400.0).alias(f"{col}\u0000mean"))
        elif kind == "timestamp":
            # epoch seconds of the wall-clock time, as the pandas side sees a timestamp
            wall = (F.unix_date(F.to_date(c)).cast("double") * 86400.0
                    + F.hour(c) * 3600 + F.minute(c) * 60 + F.second(c))
            aggs.append(F.avg(wall).alias(f"{col}\u0000mean"))
    first = df.agg(*aggs).first()
    assert first is not None  # an aggregate has one row
    row = first.asDict()
    stats = {}
    for col, kind in kinds.items():
        s: dict[str, Any] = {"n_missing": int(row[f"{col}\u0000missing"] or 0)}
        if kind == "string":
            top = (df.where(column(col).isNotNull()).groupBy(column(col)).count()
                   .orderBy(F.desc("count"), column(col).asc()))
            levels = [r[0] for r in top.limit(max_categories + 1).collect()]
            s.update(distinct=len(levels), top=levels)
        elif kind == "vector":
            s["size"] = vector_size(df, col)
            present = df.where(column(col).isNotNull())
            mean = present.agg(Summarizer.mean(column(col))).first() if s["size"] else None
            s["mean"] = mean[0].toArray().tolist() if mean is not None and mean[0] is not None else [0.0] * s["size"]
        else:
            value = row[f"{col}\u0000mean"]
            s["mean"] = float(value) if value is not None else 0.0
        stats[col] = s
    return stats


class FeaturizeModel(IrbisModel, _FeaturizeParams):
    """A fitted :class:`Featurize`: its Params plus the per-column plan (saved as JSON beside them)."""

    def _init_state(self) -> None:
        self._plans: list[dict[str, Any]] = []

    @property
    def feature_names(self) -> list[str]:
        """Name of every slot of the output vector."""
        return [n for p in self._plans for n in slot_names(p)]

    def _input_columns(self) -> list[str]:
        return self._cols()

    def _output_columns(self) -> list[tuple[str, DataType]]:
        return [(self.getOutputCol(), VectorUDT())]

    def _validate_schema(self, schema: StructType) -> None:
        kinds = self._check_schema_kinds(schema)
        for plan in self._plans:
            found = kinds[plan["name"]]
            expected = "string" if plan["kind"] in ("categorical", "hashed") else plan["kind"]
            if found != expected:
                raise TypeError(
                    f"FeaturizeModel: column {plan['name']!r} was {expected} in training, found {found} "
                    f"({schema[plan['name']].dataType.simpleString()})"
                )

    def _make_transform_fn(self) -> Callable[[pd.DataFrame], pd.DataFrame]:
        plans, out = list(self._plans), self.getOutputCol()
        invalid = self.getOrDefault("vectorAssemblerHandleInvalid")

        def featurize(frame: pd.DataFrame) -> pd.DataFrame:
            values = transform_frame(frame, plans, invalid)
            return pd.DataFrame({out: list(values)})

        return featurize

    def _skips(self) -> list[str]:
        """The columns whose missing values drop their row: those not imputed, under ``skip``."""
        if self.getOrDefault("vectorAssemblerHandleInvalid") != "skip":
            return []
        return [p["name"] for p in self._plans if not imputes(p)]

    def _transform_pandas(self, pdf: pd.DataFrame) -> pd.DataFrame:
        if self._skips():
            require_columns(type(self).__name__, pdf.columns, self._cols())
            pdf = pdf[~invalid_rows(pdf, self._plans)]
        return super()._transform_pandas(pdf)

    def _transform_spark(self, df: DataFrame) -> DataFrame:
        out = self.getOutputCol()
        names = self.feature_names
        meta = {"ml_attr": {"attrs": {"numeric": [{"idx": i, "name": n} for i, n in enumerate(names)]},
                            "num_attrs": len(names)}}
        for name in self._skips():  # a missing number, as spark_stats counts it
            df = df.where(column(name).isNotNull() & ~F.isnan(column(name).cast("double")))
        result = super()._transform_spark(df)
        # A top-level alias carries its metadata on classic and Connect sessions alike; on Connect the
        # metadata of an alias given to withColumn is lost.
        return result.select(*[column(c).alias(c, metadata=meta) if c == out else column(c)
                               for c in result.columns])

    def _save_extra(self, path: str) -> None:
        with open(os.path.join(path, "plan.json"), "w", encoding="utf-8") as f:
            json.dump(self._plans, f)

    def _load_extra(self, path: str) -> None:
        with open(os.path.join(path, "plan.json"), encoding="utf-8") as f:
            self._plans = json.load(f)


Featurize._model_class = FeaturizeModel  # the Model class that Featurize.fit returns
