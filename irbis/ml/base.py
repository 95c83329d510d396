"""Base classes of every Irbis Spark stage.

A stage is three hooks over a pure function (the kernel/adapter split of the design guide):

* ``_input_columns()``: the columns the function reads;
* ``_output_columns()``: ``(name, DataType)`` of the columns it appends;
* ``_make_batch_fn()``: a picklable :data:`irbis.kernels.blocks.BatchFn` from a dict of column
  blocks (numpy arrays: :class:`~irbis.kernels.blocks.Tensor`, :class:`~irbis.kernels.blocks.Images`,
  ...) to a dict of output blocks, row for row. Stages whose work is per-row Python (text, tables)
  implement ``_make_transform_fn()`` instead: a function over a pandas DataFrame.

A stage whose whole work is its batch function answers :meth:`~_StageMixin.kernel`: the public seam
through which serving, LIME and ``fuse`` run it without Spark. It declares the kinds of value its
inputs accept in ``_accepts``. Any other stage raises :class:`irbis.errors.NoKernelError`; every stage
answers :meth:`~_StageMixin.columns` (what it reads and writes) and :meth:`~_StageMixin.has_kernel`. Other
modules ask a stage through these three, never through its hooks.

The base runs the function on a pandas DataFrame directly, or on a Spark DataFrame through an
iterator Arrow UDF (a pandas UDF for ``_make_transform_fn`` stages), so that only the input columns
cross to Python and every other column stays in the JVM. Arrow buffers become numpy blocks without a
Python object per value, and output blocks become Arrow buffers; each output batch is kept under
``spark.sql.execution.arrow.maxBytesPerBatch`` by running the function on slices of the input batch.
Spark ML vectors are turned into arrays on the JVM side before the UDF and back into vectors after it
(``vector_to_array`` / ``array_to_vector``), so the function never sees a ``DenseVector``.
"""

from __future__ import annotations

import warnings
from functools import reduce
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pandas as pd
from pyspark.ml import Estimator, Model, Transformer
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, StructField, StructType
from pyspark.util import PythonEvalType

from irbis.errors import NoKernelError, require_columns
from irbis.kernels.blocks import (
    BatchFn,
    block_to_rows,
    bounded_slices,
    from_arrow,
    rows_in,
    to_arrow,
)
from irbis.kernels.chain import LengthRule, StageColumns, StageKernel
from irbis.ml.aliases import resolve_aliases
from irbis.ml.params import add_accessors, make_set_params, make_stage_init
from irbis.ml.persistence import IrbisPersistable
from irbis.spark.columns import column
from irbis.spark.files import shipped_kernel
from irbis.spark.guard import on_executors
from irbis.spark.resources import check_device, executor_slots, set_task_threads, task_cores

TransformFn = Callable[[pd.DataFrame], pd.DataFrame]

#: Output bytes per Arrow batch when the session does not set ``maxBytesPerBatch``.
DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024


if TYPE_CHECKING:  # a mixin of Params: its stages are Params
    from pyspark.ml.param import Params as _ParamsMixin
else:
    _ParamsMixin = object


class _KeywordParams(_ParamsMixin):
    """What every stage is made of from its Params (:mod:`irbis.ml.params`): a ``set<Name>``/``get<Name>``
    for every Param (:func:`~irbis.ml.params.add_accessors`), and an ``__init__`` and a ``setParams`` whose
    keyword-only signatures list every Param with its default (:func:`~irbis.ml.params.make_stage_init`).

    A stage states its own defaults in ``_defaults`` (Param name -> default, where it differs from the row's)
    and its other work in three hooks: ``_init_state`` (attributes that are not Params), ``_keywords``
    (keywords to Param values: SynapseML's names, values that are not a Param's) and ``_check_params``
    (checks across Params, run when Params are set by keyword).

    A stage that needs an optional extra of Irbis names it once, in ``_extras`` (e.g. ``("images",)``: the
    extras of :mod:`irbis.extras`); its ``__init__`` raises :class:`irbis.errors.MissingExtraError`, naming
    the stage, the missing modules and the ``pip install`` command, when one is not installed.
    """

    #: The optional extras the stage needs (:data:`irbis.extras.EXTRAS`), checked when it is made.
    _extras: tuple[str, ...] = ()

    if TYPE_CHECKING:  # what the generated methods take, for a type checker (their signatures are made at import)
        def __init__(self, **kwargs: Any) -> None: ...

        def setParams(self, **kwargs: Any) -> Any: ...  # noqa: N802

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        add_accessors(cls)
        if "__init__" not in cls.__dict__:  # a class of a user's own may write its __init__
            cls.__init__ = make_stage_init(cls)  # type: ignore[method-assign]
        if "setParams" not in cls.__dict__:
            cls.setParams = make_set_params(cls)  # type: ignore[method-assign]

    def _init_state(self) -> None:
        """Set the stage's attributes that are not Params (before the keywords are set)."""

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The Param values of the keywords given to ``__init__`` or ``setParams`` (SynapseML's names resolved)."""
        aliases = [a for a in getattr(self, "SYNAPSEML_ALIASES", ()) if not self.hasParam(a.name)]
        return resolve_aliases(aliases, kwargs)

    def _check_params(self) -> None:
        """Checks across Params, run after ``__init__`` or ``setParams`` set them (each Param's own check runs
        when it is set)."""


class _StageMixin(_KeywordParams, IrbisPersistable):
    """Shared machinery of transformers and fitted models."""

    #: dtype used for Spark ML vectors crossing to Python ("float32" halves the bytes for networks).
    _vector_dtype: str = "float64"

    def _input_columns(self) -> list[str]:
        raise NotImplementedError

    def _output_columns(self) -> list[tuple[str, DataType]]:
        raise NotImplementedError

    def _make_transform_fn(self) -> TransformFn:
        raise NotImplementedError

    def _make_batch_fn(self) -> BatchFn:
        raise NotImplementedError

    def _has_batch_fn(self) -> bool:
        return type(self)._make_batch_fn is not _StageMixin._make_batch_fn

    #: Kinds of value (:data:`irbis.kernels.chain.KINDS`) the input columns accept; declared by
    #: every stage that has a kernel.
    _accepts: frozenset[str] = frozenset()

    def _input_kinds(self) -> dict[str, frozenset[str]]:
        """The kinds of value each input column accepts (``_accepts`` for each, unless overridden)."""
        return {c: self._accepts for c in self._input_columns()}

    def _ragged_columns(self) -> frozenset[str]:
        """The input columns read as sequences of varying length (:class:`irbis.kernels.blocks.Ragged`)."""
        return frozenset()

    def has_kernel(self) -> bool:
        """Whether the stage answers :meth:`kernel`: its whole work is its batch function (a stage with its
        own ``_transform`` works on whole DataFrames)."""
        return self._has_batch_fn() and type(self)._transform is _StageMixin._transform

    def columns(self) -> StageColumns:
        """The columns the stage reads, with the kinds of value each accepts, and the columns it writes,
        with their Spark types; every stage answers, with a kernel or without one."""
        outputs = self._output_columns()
        return StageColumns(type(self).__name__, self._input_columns(), [n for n, _ in outputs],
                            kinds=self._input_kinds(), types=dict(outputs), ragged=self._ragged_columns(),
                            uid=self.uid)

    def kernel(self) -> StageKernel:
        """The stage as a kernel: its input columns with the kinds each accepts, its output columns
        with their Spark types, and its batch function, to run without Spark.

        Raises
        ------
        irbis.errors.NoKernelError
            For a stage that works on whole DataFrames or per row in pandas (e.g. ``Repartition``,
            ``EnsembleByKey``, ``TextFeaturizerModel``).

        Examples
        --------
        >>> k = ImageTransformer(inputCol="image", outputCol="small").resize(8, 8).kernel()  # doctest: +SKIP
        >>> k.inputs, k.kinds, k.outputs                                                    # doctest: +SKIP
        (['image'], {'image': frozenset({'image'})}, ['small'])
        """
        name = type(self).__name__
        if not self.has_kernel():
            raise NoKernelError(name, f"{name} has no kernel: it works on whole DataFrames or per row in "
                                      "pandas; run it in Spark, or leave it out of what runs without Spark")
        io = self.columns()
        return StageKernel(io.inputs, io.outputs, self._make_batch_fn(), kinds=io.kinds, types=io.types,
                           ragged=io.ragged, lengths=self._length_rule())

    def _length_rule(self) -> LengthRule | None:
        """How the stage measures its rows where it batches them by length (:class:`LengthRule`); ``None``."""
        return None

    def _validate_schema(self, schema: StructType) -> None:
        """Stage-specific checks of input types; raise ``ValueError``/``TypeError`` naming the column."""

    # -- schema ---------------------------------------------------------------------------------
    def _check_schema(self, schema: StructType) -> None:
        stage = type(self).__name__
        names = schema.fieldNames()
        require_columns(stage, names, self._input_columns())
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
        require_columns(type(self).__name__, pdf.columns, self._input_columns())
        result = pdf.copy()
        if self._has_batch_fn():
            ragged = self._ragged_columns()
            blocks = {c: rows_in(pdf[c].tolist(), c, c in ragged) for c in self._input_columns()}
            out = self._make_batch_fn()(blocks)
            for name, _ in self._output_columns():
                result[name] = pd.Series(block_to_rows(out[name]), index=pdf.index, dtype=object)
            return result
        out = self._make_transform_fn()(pdf[self._input_columns()].reset_index(drop=True))
        for name, _ in self._output_columns():
            result[name] = list(out[name]) if len(out) else pd.Series(dtype=object)
        return result

    def _transform_spark(self, df: DataFrame) -> DataFrame:
        self._check_schema(df.schema)
        if self.hasParam("device"):
            check_device(df.sparkSession, self.getOrDefault("device"))
        outputs = self._output_columns()
        args = [self._udf_input(df.schema[c]) for c in self._input_columns()]
        wire = [(n, self._wire_type(t)) for n, t in outputs]
        slots = executor_slots(df.sparkSession)
        if self._has_batch_fn():
            cap = _max_batch_bytes(df)
            udf = _make_arrow_udf(shipped_kernel(self._make_batch_fn()), self._input_columns(), wire, cap,
                                  self._ragged_columns(), slots)
            if len(wire) == 1:
                result = df.withColumn(outputs[0][0], udf(*args))
            else:
                tmp = f"__irbis_{self.uid}"
                result = df.withColumn(tmp, udf(*args))
                result = result.select("*", *[column(tmp)[n].alias(n) for n, _ in outputs]).drop(tmp)
            return _vectors_out(result, outputs)
        if len(wire) == 1:
            udf = _make_udf(self._make_transform_fn(), self._input_columns(), wire, True, slots)
            result = df.withColumn(outputs[0][0], udf(*args))
        else:
            tmp = f"__irbis_{self.uid}"
            udf = _make_udf(self._make_transform_fn(), self._input_columns(), wire, False, slots)
            result = df.withColumn(tmp, udf(*args))
            result = result.select("*", *[column(tmp)[n].alias(n) for n, _ in outputs]).drop(tmp)
        result = _vectors_out(result, outputs, from_pandas=True)
        for name, dtype in outputs:
            if isinstance(dtype, StructType):
                # pandas UDFs cannot emit a null struct: a row whose fields are all null becomes null.
                all_null = reduce(lambda a, b: a & b, [column(name)[f].isNull() for f in dtype.names])
                result = result.withColumn(name, F.when(~all_null, column(name)))
        return result

    def _udf_input(self, field: StructField) -> Any:
        if isinstance(field.dataType, VectorUDT):
            col = column(field.name)
            # vector_to_array refuses nulls; a null row stays null and the kernel gives it a null output.
            return F.when(col.isNotNull(), vector_to_array(col, self._vector_dtype)).alias(field.name)
        return column(field.name)

    def _wire_type(self, dtype: DataType) -> DataType:
        if isinstance(dtype, VectorUDT):
            return ArrayType(FloatType() if self._vector_dtype == "float32" else DoubleType())
        if isinstance(dtype, StructType):
            # A null row crosses Arrow as a struct of nulls, so every field must accept null.
            return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in dtype.fields])
        return dtype


def _vectors_out(result: DataFrame, outputs: list[tuple[str, DataType]], from_pandas: bool = False) -> DataFrame:
    """Turn the array columns that stand for Spark ML vectors back into vectors, on the JVM side.

    ``from_pandas``: the arrays came from a pandas UDF, whose conversion to Arrow turns a NaN element into a
    null; a vector's element is never null, so each null element is the NaN it was."""
    for name, dtype in outputs:
        if isinstance(dtype, VectorUDT):
            col = column(name)
            values = F.transform(col, lambda x: F.coalesce(x, F.lit(float("nan")))) if from_pandas else col
            result = result.withColumn(name, F.when(col.isNotNull(), array_to_vector(values)))
    return result


def _max_batch_bytes(df: DataFrame) -> int:
    value = df.sparkSession.conf.get("spark.sql.execution.arrow.maxBytesPerBatch", None)
    try:
        return int(value) if value else DEFAULT_MAX_BATCH_BYTES
    except ValueError:  # a size with a unit ("64m")
        return DEFAULT_MAX_BATCH_BYTES


def _make_arrow_udf(fn: BatchFn, in_cols: list[str], wire: list[tuple[str, DataType]],
                    max_bytes: int, ragged: frozenset[str] = frozenset(), slots: int | None = None) -> Any:
    """An iterator Arrow UDF running ``fn`` on blocks, its output batches kept under ``max_bytes``; each
    task takes its share of its executor's ``slots`` (:class:`irbis.spark.resources.SharedCores`), read
    again at every Arrow batch."""
    from pyspark.sql.pandas.types import to_arrow_type

    types = [(n, to_arrow_type(t)) for n, t in wire]
    return_type = wire[0][1] if len(wire) == 1 else StructType([StructField(n, t, True) for n, t in wire])

    def pack(out: dict[str, Any]) -> Any:
        import pyarrow as pa

        arrays = [to_arrow(out[n], t) for n, t in types]
        return arrays[0] if len(arrays) == 1 else pa.StructArray.from_arrays(arrays, [n for n, _ in types])

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        with task_cores(slots) as share:
            for batch in batches:
                set_task_threads(share)
                arrays = batch if isinstance(batch, tuple) else (batch,)

                def run_slice(start: int, stop: int, arrays: tuple = arrays) -> Any:
                    return pack(fn({c: from_arrow(a.slice(start, stop - start), c, c in ragged)
                                    for c, a in zip(in_cols, arrays)}))

                yield from bounded_slices(len(arrays[0]), run_slice, max_bytes)

    from pyspark.sql.functions import arrow_udf

    with warnings.catch_warnings():
        # The eval type is given explicitly because the number of input columns varies per stage.
        warnings.simplefilter("ignore", UserWarning)
        return arrow_udf(on_executors(run), return_type,  # type: ignore[call-overload]  # a struct is returned
                         PythonEvalType.SQL_SCALAR_ARROW_ITER_UDF)


def _struct_to_records(frame: pd.DataFrame) -> pd.Series:
    """Turn a struct column (a DataFrame in a pandas UDF) into a Series of dicts, None for nulls."""
    records = frame.to_dict("records")
    return pd.Series([None if all(v is None for v in r.values()) else r for r in records], dtype=object)


def _make_udf(fn: TransformFn, in_cols: list[str], wire: list[tuple[str, DataType]], single: bool,
              slots: int | None = None) -> Any:
    return_type = wire[0][1] if single else StructType([StructField(n, t, True) for n, t in wire])
    out_name = wire[0][0]

    def run(batches: Iterator[tuple[Any, ...]]) -> Iterator[Any]:
        with task_cores(slots) as share:
            for batch in batches:
                set_task_threads(share)
                cols = batch if isinstance(batch, tuple) else (batch,)
                frame = pd.DataFrame({name: _struct_to_records(c) if isinstance(c, pd.DataFrame) else c
                                      for name, c in zip(in_cols, cols)})
                out = fn(frame)
                if not single:
                    yield pd.DataFrame({n: out[n].to_numpy() for n, _ in wire})
                elif isinstance(return_type, StructType):
                    yield pd.DataFrame([r if r is not None else {} for r in out[out_name]],
                                       columns=return_type.names)
                else:
                    yield out[out_name]

    with warnings.catch_warnings():
        # The eval type is given explicitly because the number of input columns varies per stage.
        warnings.simplefilter("ignore", UserWarning)
        return pandas_udf(on_executors(run), return_type,  # type: ignore[call-overload]  # a struct is returned
                          PythonEvalType.SQL_SCALAR_PANDAS_ITER_UDF)


class IrbisTransformer(_StageMixin, Transformer):
    """Base of Irbis transformers: implement the three hooks, get Spark, pandas and persistence."""


class IrbisModel(_StageMixin, Model):
    """Base of fitted Irbis models (the output of an :class:`IrbisEstimator`)."""


class IrbisEstimator(_KeywordParams, IrbisPersistable, Estimator):
    """Base of Irbis estimators: implement ``_fit(dataset)`` returning an :class:`IrbisModel`, and declare
    its class as ``_model_class`` (each estimator fits one Model class)."""

    #: The one Model class that ``fit`` returns (declared by each estimator).
    _model_class: type[Model]
