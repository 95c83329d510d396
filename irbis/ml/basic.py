"""Small reshaping stages: Repartition, Cache, SelectColumns, DropColumns, RenameColumn, Lambda.

Each works on a Spark DataFrame and on a pandas DataFrame (where partitioning and caching are
no-ops), persists inside a ``Pipeline``, and names the column when one is missing.
"""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd
from pyspark import StorageLevel
from pyspark.ml.param import TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasOutputCol
from pyspark.sql import DataFrame
from pyspark.sql.types import DataType, StructType

from irbis.errors import require_columns
from irbis.ml.base import IrbisTransformer
from irbis.ml.params import at_least, one_of, param_mixin, table_mixin
from irbis.refs import is_reference, reference, resolve
from irbis.spark.columns import column
from irbis.spark.session import is_connect

#: The names of pyspark's storage levels (the values of Cache's storageLevel).
STORAGE_LEVELS = tuple(sorted(k for k, v in vars(StorageLevel).items() if isinstance(v, StorageLevel)))


def _columns_of(dataset: Any) -> list[str]:
    return list(dataset.columns)


class _ReshapeStage(IrbisTransformer):
    """A stage that rewrites the whole DataFrame instead of appending computed columns."""

    def _input_columns(self) -> list[str]:
        return []

    def _output_columns(self) -> list[tuple[str, DataType]]:
        return []

    def _transform(self, dataset: Any) -> Any:
        require_columns(type(self).__name__, _columns_of(dataset), self._input_columns())
        if isinstance(dataset, pd.DataFrame):
            return self._reshape_pandas(dataset)
        return self._reshape_spark(dataset)

    def _reshape_pandas(self, pdf: pd.DataFrame) -> pd.DataFrame:
        return pdf.copy()

    def _reshape_spark(self, df: DataFrame) -> DataFrame:
        raise NotImplementedError


_RepartitionParams: Any = table_mixin("_RepartitionParams", [
    ("numPartitions", "number of partitions (>= 0)", TypeConverters.toInt, 2, at_least(0)),
    ("partitionCols", "columns to hash rows by; empty: round robin", TypeConverters.toListString, []),
])


class Repartition(_ReshapeStage, _RepartitionParams):
    """Repartition a DataFrame into ``numPartitions`` (optionally hashing ``partitionCols``).

    Useful before a heavy stage (a network) so every core gets work. ``numPartitions=0`` with
    ``partitionCols`` keeps Spark's default number of shuffle partitions.
    """

    def _check_params(self) -> None:
        n = self.getOrDefault("numPartitions")
        if n < 0 or (n == 0 and not self.getOrDefault("partitionCols")):
            raise ValueError(f"Repartition: numPartitions must be >= 1 (or 0 with partitionCols), found {n}")

    def _input_columns(self) -> list[str]:
        return list(self.getOrDefault("partitionCols"))

    def _reshape_spark(self, df: DataFrame) -> DataFrame:
        n, cols = self.getOrDefault("numPartitions"), self.getOrDefault("partitionCols")
        if cols:
            keys = [column(c) for c in cols]
            return df.repartition(n, *keys) if n else df.repartition(*keys)
        return df.repartition(n)


_CacheParams: Any = table_mixin("_CacheParams", [
    ("storageLevel", "a pyspark.StorageLevel name, e.g. MEMORY_AND_DISK", TypeConverters.toString, "MEMORY_AND_DISK",
     one_of(*STORAGE_LEVELS)),
])


class Cache(_ReshapeStage, _CacheParams):
    """Persist the DataFrame at ``storageLevel`` (for stages that read their input twice).

    As with ``DataFrame.persist``, Spark's cache is keyed by the query plan: the input
    DataFrame reports the same storage level afterwards. Its rows and schema are unchanged.
    """

    def _level(self) -> StorageLevel:
        return getattr(StorageLevel, self.getOrDefault("storageLevel"))

    def _reshape_spark(self, df: DataFrame) -> DataFrame:
        return df.persist(self._level())


class _ColumnListStage(_ReshapeStage):
    """A stage over a list of existing columns, ``cols`` (each subclass documents its own use of it)."""

    def _input_columns(self) -> list[str]:
        return list(self.getOrDefault("cols"))


_SelectColumnsParams: Any = param_mixin("cols", "columns to keep, in order", TypeConverters.toListString,
                                   [])


class SelectColumns(_ColumnListStage, _SelectColumnsParams):
    """Keep only ``cols``, in that order."""

    def transform_schema(self, schema: StructType) -> StructType:
        """Schema of the output for an input of ``schema``."""
        require_columns("SelectColumns", schema.fieldNames(), self._input_columns())
        return StructType([schema[c] for c in self._input_columns()])

    def _reshape_pandas(self, pdf: pd.DataFrame) -> pd.DataFrame:
        return pdf[self._input_columns()].copy()

    def _reshape_spark(self, df: DataFrame) -> DataFrame:
        return df.select(*map(column, self._input_columns()))


_DropColumnsParams: Any = param_mixin("cols", "columns to drop", TypeConverters.toListString, [])


class DropColumns(_ColumnListStage, _DropColumnsParams):
    """Drop ``cols`` (every one of them must exist)."""

    def transform_schema(self, schema: StructType) -> StructType:
        """Schema of the output for an input of ``schema``."""
        require_columns("DropColumns", schema.fieldNames(), self._input_columns())
        return StructType([f for f in schema.fields if f.name not in self._input_columns()])

    def _reshape_pandas(self, pdf: pd.DataFrame) -> pd.DataFrame:
        return pdf.drop(columns=self._input_columns())

    def _reshape_spark(self, df: DataFrame) -> DataFrame:
        return df.drop(*self._input_columns())


class RenameColumn(_ReshapeStage, HasInputCol, HasOutputCol):
    """Rename ``inputCol`` to ``outputCol`` (which must not exist yet)."""

    def _input_columns(self) -> list[str]:
        return [self.getInputCol()] if self.isDefined("inputCol") else []

    def _check_output(self, dataset: Any) -> None:
        if not self.isDefined("inputCol") or not self.isSet("outputCol"):
            raise ValueError("RenameColumn: set both inputCol and outputCol")
        if self.getOutputCol() in _columns_of(dataset):
            raise ValueError(f"RenameColumn: output column {self.getOutputCol()!r} already exists; choose another name")

    def transform_schema(self, schema: StructType) -> StructType:
        """Schema of the output for an input of ``schema``."""
        require_columns("RenameColumn", schema.fieldNames(), self._input_columns())
        self._check_output(_Names(schema))
        src, dst = self.getInputCol(), self.getOutputCol()
        return StructType([f if f.name != src else type(f)(dst, f.dataType, f.nullable, f.metadata)
                           for f in schema.fields])

    def _reshape_pandas(self, pdf: pd.DataFrame) -> pd.DataFrame:
        self._check_output(pdf)
        return pdf.rename(columns={self.getInputCol(): self.getOutputCol()})

    def _reshape_spark(self, df: DataFrame) -> DataFrame:
        self._check_output(df)
        return df.withColumnRenamed(self.getInputCol(), self.getOutputCol())


class _Names:
    """Adapter giving a schema the ``columns`` attribute of a DataFrame."""

    def __init__(self, schema: StructType) -> None:
        self.columns = schema.fieldNames()


_LambdaParams: Any = param_mixin("function", "the function as 'package.module:qualname'",
                             TypeConverters.toString, None)


class Lambda(_ReshapeStage, _LambdaParams):
    """Apply a user function ``f(DataFrame) -> DataFrame`` as a pipeline stage.

    The function is persisted *by reference* (``"module:qualname"``), so saving needs a function
    defined at the top level of an importable module. Lambdas, closures and functions of
    ``__main__`` work for ``transform`` but saving raises a ``ValueError`` saying why.

    Examples
    --------
    >>> Lambda(function=mypackage.cleaning.drop_blurry).transform(df)  # doctest: +SKIP
    >>> Lambda(function="mypackage.cleaning:drop_blurry")              # doctest: +SKIP
    """

    def _init_state(self) -> None:
        self._fn: Callable[..., Any] | None = None
        self._not_saveable = "no function was set"

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        function = kwargs.pop("function", None)  # a callable or a reference: setFunction resolves it
        if function is not None:
            self.setFunction(function)
        return kwargs

    def setFunction(self, value: Callable[..., Any] | str) -> "Lambda":
        """Set the function: a callable or a ``"module:qualname"`` reference."""
        if isinstance(value, str):
            if not is_reference(value):
                raise ValueError(f"Lambda: function reference must look like 'package.module:function', "
                                 f"found {value!r}")
            self._fn = resolve(value)
            return self._set(function=value)
        if not callable(value):
            raise TypeError(f"Lambda: function must be callable or a 'module:qualname' string, "
                            f"found {type(value).__name__}")
        self._fn = value
        try:
            ref, self._not_saveable = reference(value), ""
        except ValueError as err:
            self._not_saveable = str(err)
            self.clear(self.function)
            return self
        return self._set(function=ref)

    def write(self) -> Any:
        """Return a writer; raises ``ValueError`` when the function cannot be saved by reference."""
        if not self.isSet("function"):
            raise ValueError(
                f"Lambda: cannot save the function: {self._not_saveable}. Define it at the top level of "
                "an importable module (not in __main__) and pass it again, or its 'module:qualname'."
            )
        return super().write()

    def copy(self, extra: dict | None = None) -> "Lambda":
        """Copy the stage, keeping the function."""
        that = super().copy(extra)
        that._fn, that._not_saveable = self._fn, self._not_saveable
        return that

    def _call(self, dataset: Any) -> Any:
        if self._fn is None and self.isSet("function"):
            self._fn = resolve(self.getOrDefault("function"))
        if self._fn is None:
            raise ValueError("Lambda: no function set; pass function=... first")
        return self._fn(dataset)

    def _reshape_pandas(self, pdf: pd.DataFrame) -> pd.DataFrame:
        return self._call(pdf.copy())

    def _reshape_spark(self, df: DataFrame) -> DataFrame:
        out = self._call(df)
        if is_connect(df) and isinstance(out, DataFrame):
            # The function names its columns itself. Classic Spark analyses each step as it is built,
            # so a missing column fails here; a Connect client builds the plan unanalysed: ask the
            # server for the schema now, for the same error (naming the column) before any action.
            out.schema  # noqa: B018 - the analysis is the point
        return out
