"""Base classes of every Irbis Spark stage.

A stage is three hooks over a pure function (the kernel/adapter split of the design guide):

* ``_input_columns()``: the columns the function reads;
* ``_output_columns()``: ``(name, DataType)`` of the columns it appends;
* ``_make_transform_fn()``: a picklable function from a pandas DataFrame holding exactly the input
  columns to a pandas DataFrame holding exactly the output columns, row for row.

The base runs that function on a pandas DataFrame directly, or on a Spark DataFrame through an
iterator pandas UDF over Arrow batches, so that only the input columns cross to Python and every
other column stays in the JVM. Spark ML vectors are turned into arrays on the JVM side before the
UDF and back into vectors after it (``vector_to_array`` / ``array_to_vector``), so the function
sees numpy arrays and never builds a ``DenseVector`` per row.
"""

from __future__ import annotations

import warnings
from functools import reduce
from typing import Any, Callable, Iterator

import pandas as pd
from pyspark.ml import Estimator, Model, Transformer
from pyspark.util import PythonEvalType
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, StructField, StructType

from irbis.ml.persistence import IrbisPersistable

TransformFn = Callable[[pd.DataFrame], pd.DataFrame]


class _StageMixin(IrbisPersistable):
    """Shared machinery of transformers and fitted models."""

    #: dtype used for Spark ML vectors crossing to Python ("float32" halves the bytes for networks).
    _vector_dtype: str = "float64"

    def _input_columns(self) -> list[str]:
        raise NotImplementedError

    def _output_columns(self) -> list[tuple[str, DataType]]:
        raise NotImplementedError

    def _make_transform_fn(self) -> TransformFn:
        raise NotImplementedError

    def _validate_schema(self, schema: StructType) -> None:
        """Stage-specific checks of input types; raise ``ValueError``/``TypeError`` naming the column."""

    # -- schema ---------------------------------------------------------------------------------
    def _check_schema(self, schema: StructType) -> None:
        stage = type(self).__name__
        names = schema.fieldNames()
        for col in self._input_columns():
            if col not in names:
                raise ValueError(
                    f"{stage}: input column {col!r} not found; the DataFrame has columns {names}."
                )
        for col, _ in self._output_columns():
            if col in names:
                raise ValueError(
                    f"{stage}: output column {col!r} already exists; choose another output column name."
                )
        self._validate_schema(schema)

    def transform_schema(self, schema: StructType) -> StructType:
        """Return the schema that ``transform`` produces for an input of ``schema``."""
        self._check_schema(schema)
        return StructType(schema.fields + [StructField(n, t, True) for n, t in self._output_columns()])

    # -- execution ------------------------------------------------------------------------------
    def _transform(self, dataset: Any) -> Any:
        if isinstance(dataset, pd.DataFrame):
            return self._transform_pandas(dataset)
        return self._transform_spark(dataset)

    def _transform_pandas(self, pdf: pd.DataFrame) -> pd.DataFrame:
        missing = [c for c in self._input_columns() if c not in pdf.columns]
        if missing:
            raise ValueError(
                f"{type(self).__name__}: input column {missing[0]!r} not found; "
                f"the DataFrame has columns {list(pdf.columns)}."
            )
        out = self._make_transform_fn()(pdf[self._input_columns()].reset_index(drop=True))
        result = pdf.copy()
        for name, _ in self._output_columns():
            result[name] = list(out[name]) if len(out) else pd.Series(dtype=object)
        return result

    def _transform_spark(self, df: DataFrame) -> DataFrame:
        self._check_schema(df.schema)
        outputs = self._output_columns()
        args = [self._udf_input(df.schema[c]) for c in self._input_columns()]
        wire = [(n, self._wire_type(t)) for n, t in outputs]
        if len(wire) == 1:
            udf = _make_udf(self._make_transform_fn(), self._input_columns(), wire, single=True)
            result = df.withColumn(outputs[0][0], udf(*args))
        else:
            tmp = f"__irbis_{self.uid}"
            udf = _make_udf(self._make_transform_fn(), self._input_columns(), wire, single=False)
            result = df.withColumn(tmp, udf(*args))
            result = result.select("*", *[F.col(f"{tmp}.{n}").alias(n) for n, _ in outputs]).drop(tmp)
        for name, dtype in outputs:
            if isinstance(dtype, VectorUDT):
                col = F.col(name)
                result = result.withColumn(name, F.when(col.isNotNull(), array_to_vector(col)))
            elif isinstance(dtype, StructType):
                # pandas UDFs cannot emit a null struct: a row whose fields are all null becomes null.
                all_null = reduce(lambda a, b: a & b, [F.col(name)[f].isNull() for f in dtype.names])
                result = result.withColumn(name, F.when(~all_null, F.col(name)))
        return result

    def _udf_input(self, field: StructField) -> Any:
        if isinstance(field.dataType, VectorUDT):
            col = F.col(field.name)
            # vector_to_array refuses nulls; a null row stays null and the kernel gives it a null output.
            return F.when(col.isNotNull(), vector_to_array(col, self._vector_dtype)).alias(field.name)
        return F.col(field.name)

    def _wire_type(self, dtype: DataType) -> DataType:
        if isinstance(dtype, VectorUDT):
            return ArrayType(FloatType() if self._vector_dtype == "float32" else DoubleType())
        if isinstance(dtype, StructType):
            # A null row crosses Arrow as a struct of nulls, so every field must accept null.
            return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in dtype.fields])
        return dtype


def _struct_to_records(frame: pd.DataFrame) -> pd.Series:
    """Turn a struct column (a DataFrame in a pandas UDF) into a Series of dicts, None for nulls."""
    records = frame.to_dict("records")
    return pd.Series([None if all(v is None for v in r.values()) else r for r in records], dtype=object)


def _make_udf(fn: TransformFn, in_cols: list[str], wire: list[tuple[str, DataType]], single: bool):
    return_type = wire[0][1] if single else StructType([StructField(n, t, True) for n, t in wire])
    out_name = wire[0][0]

    def run(batches: Iterator[tuple[Any, ...]]) -> Iterator[Any]:
        for batch in batches:
            cols = batch if isinstance(batch, tuple) else (batch,)
            frame = pd.DataFrame(
                {
                    name: _struct_to_records(c) if isinstance(c, pd.DataFrame) else c
                    for name, c in zip(in_cols, cols)
                }
            )
            out = fn(frame)
            if single:
                col = out[out_name]
                if isinstance(return_type, StructType):
                    rows = [r if r is not None else {} for r in col]
                    yield pd.DataFrame(rows, columns=return_type.names)
                else:
                    yield col
            else:
                yield pd.DataFrame({n: out[n].to_numpy() for n, _ in wire})

    with warnings.catch_warnings():
        # The eval type is given explicitly because the number of input columns varies per stage.
        warnings.simplefilter("ignore", UserWarning)
        return pandas_udf(run, return_type, PythonEvalType.SQL_SCALAR_PANDAS_ITER_UDF)


class IrbisTransformer(_StageMixin, Transformer):
    """Base of Irbis transformers: implement the three hooks, get Spark, pandas and persistence."""


class IrbisModel(_StageMixin, Model):
    """Base of fitted Irbis models (the output of an :class:`IrbisEstimator`)."""


class IrbisEstimator(IrbisPersistable, Estimator):
    """Base of Irbis estimators: implement ``_fit(dataset)`` returning an :class:`IrbisModel`."""
