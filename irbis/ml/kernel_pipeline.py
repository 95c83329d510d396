"""Fitted stages and pipelines as chains of kernels: what serving, LIME and ``fuse`` run.

Every runtime that runs a fitted pipeline without a Spark job asks its stages for their kernels here:

* :func:`stage_kernel` gives a live stage's :class:`~irbis.kernels.chain.StageKernel`: an Irbis
  stage's own :meth:`~irbis.ml.base._StageMixin.kernel`, or the kernel of a fitted SparkML stage of
  :data:`~irbis.kernels.sparkml.stage_kernels.SPARKML_KERNELS` (from its public attributes), with its outputs' Spark
  types;
* :func:`load_local` reads a saved stage or ``PipelineModel`` from a local folder with no JVM at all,
  through the stages' own readers (:meth:`irbis.ml.persistence.IrbisReader.local`) and SparkML's saved
  state (:func:`~irbis.kernels.sparkml.state.read_stage`);
* :func:`model_chain` and :func:`local_chain` give the :class:`~irbis.kernels.chain.KernelChain` of a live or
  a saved pipeline: each stage's kernel or, for a stage without one, the columns it reads and writes (its
  :meth:`~irbis.ml.base._StageMixin.columns`, or a SparkML stage's column Params: :func:`param_columns`);
* :func:`flatten` and :func:`saved_stages` list the stages of a live or a saved pipeline, nested pipelines
  flattened;
* :class:`SparkBatches` is the fallback for a pipeline with a stage that has no kernel: each batch of
  rows is one small Spark job.

A stage without a kernel raises :class:`irbis.errors.NoKernelError`, naming its class.

Examples
--------
>>> chain = local_chain("model/")                                           # doctest: +SKIP
>>> list(chain.inputs), chain.run(blocks)["prediction"]                     # doctest: +SKIP
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql.types import DataType, DoubleType, LongType, StringType, StructField, StructType

from irbis.errors import NoKernelError
from irbis.kernels.chain import ANY_VALUE, KernelChain, StageColumns, StageKernel
from irbis.kernels.sparkml.stage_kernels import INPUT_KINDS, SPARKML_KERNELS, kernel_from_state, sparkml_kernel
from irbis.kernels.sparkml.state import StageState, read_metadata, read_stage
from irbis.ml.persistence import load_local_stage

__all__ = ["SparkBatches", "flatten", "load_local", "local_chain", "model_chain", "param_columns", "saved_stages",
           "spark_field", "stage_kernel"]

#: Spark type of a SparkML stage's output columns, by the Param that names them; other outputs are
#: vectors unless :data:`_NUMBER_OUTPUTS` lists the class.
_PARAM_TYPES: dict[str, DataType] = {"predictionCol": DoubleType(), "probabilityCol": VectorUDT(),
                                     "rawPredictionCol": VectorUDT()}
_NUMBER_OUTPUTS = {"StringIndexerModel", "ImputerModel"}


def _with_types(kernel: StageKernel, state: StageState) -> StageKernel:
    """The kernel of a SparkML stage, its outputs' Spark types filled in."""
    named = {state.params.get(p): t for p, t in _PARAM_TYPES.items() if state.params.get(p)}
    other = DoubleType() if state.cls in _NUMBER_OUTPUTS else VectorUDT()
    kernel.types = {c: named.get(c, other) for c in kernel.outputs}
    return kernel


def stage_kernel(stage: Any) -> StageKernel:
    """The kernel of a live fitted stage (see the module docstring); :class:`NoKernelError` otherwise."""
    if hasattr(stage, "kernel"):
        return stage.kernel()
    name = type(stage).__name__
    kernel = sparkml_kernel(stage)
    if kernel is None:
        why = ("PySpark does not expose its fitted state; save the pipeline and serve it from the folder"
               if name in SPARKML_KERNELS else "run it in Spark, or replace the stage")
        raise NoKernelError(name, f"{name} has no kernel here: {why}")
    params = {param.name: value for param, value in stage.extractParamMap().items()}
    return _with_types(kernel, StageState(name, params))


def flatten(model: Any) -> list[Any]:
    """The stages of a live ``PipelineModel`` in order, nested pipelines flattened; ``[model]`` otherwise."""
    from pyspark.ml import PipelineModel

    if isinstance(model, PipelineModel):
        return [s for stage in model.stages for s in flatten(stage)]
    return [model]


def saved_stages(path: str | os.PathLike) -> list[tuple[str, dict[str, Any]]]:
    """``(folder, metadata)`` of each stage of the pipeline saved in ``path`` (nested pipelines flattened),
    or of the one stage saved there."""
    metadata = read_metadata(str(path))
    if not metadata["class"].endswith(".PipelineModel"):
        return [(str(path), metadata)]
    stages = []
    for uid in metadata["paramMap"]["stageUids"]:
        found = sorted((Path(path) / "stages").glob(f"*_{uid}"))
        if not found:
            raise FileNotFoundError(f"{str(path)!r}: stage {uid} is listed in the metadata but has no folder "
                                    "under stages/")
        stages += saved_stages(found[0])
    return stages


def param_columns(cls: str, params: dict[str, Any], uid: str = "") -> StageColumns:
    """The columns a SparkML stage of class ``cls`` reads (with the kinds it declares in
    :data:`~irbis.kernels.sparkml.stage_kernels.INPUT_KINDS`) and writes, from its column Params (set or default)."""
    reads: dict[str, frozenset[str]] = {}
    for name in ("inputCols", "inputCol", "featuresCol"):
        if params.get(name) is not None:
            value = params[name]
            default = frozenset({"vector"}) if name == "featuresCol" else ANY_VALUE
            reads = dict.fromkeys([value] if isinstance(value, str) else value, INPUT_KINDS.get(cls, default))
            break
    names = ("outputCol", "outputCols", "predictionCol", "probabilityCol", "rawPredictionCol")
    values = [params[n] for n in names if params.get(n) is not None]
    writes = [c for v in values for c in ([v] if isinstance(v, str) else v)]
    return StageColumns(cls, list(reads), writes, kinds=reads, uid=uid)


def _stage_step(stage: Any) -> StageKernel | StageColumns:
    """A live stage's kernel, else its columns (see :func:`model_chain`), named by the class the
    :class:`NoKernelError` names."""
    try:
        return stage_kernel(stage)
    except NoKernelError as err:
        name = err.cls or type(stage).__name__
        if hasattr(stage, "columns"):
            return replace(stage.columns(), name=name)
        params = {param.name: value for param, value in stage.extractParamMap().items()}
        return param_columns(name, params, stage.uid)


def model_chain(model: Any, skip: Callable[[Any], bool] = lambda stage: False) -> KernelChain:
    """The chain of a live fitted stage or ``PipelineModel`` (nested pipelines flattened, the stages ``skip``
    picks left out): each stage's kernel (:func:`stage_kernel`), or where it has none, what it reads and
    writes (an Irbis stage's :meth:`~irbis.ml.base._StageMixin.columns`, a SparkML stage's
    :func:`param_columns`)."""
    return KernelChain([_stage_step(s) for s in flatten(model) if not skip(s)])


def _saved_step(folder: str, metadata: dict[str, Any]) -> StageKernel | StageColumns:
    """A saved stage's kernel (an Irbis stage's, read by its class's reader; a SparkML stage's, from its saved
    state), else its columns."""
    if metadata["class"].startswith("irbis."):
        return _stage_step(load_local_stage(folder))
    state = read_stage(folder)
    try:
        return _with_types(kernel_from_state(state), state)
    except NoKernelError:
        return param_columns(state.cls, state.params, metadata["uid"])


def local_chain(path: str | os.PathLike) -> KernelChain:
    """The chain of the stages saved in the local folder ``path`` (a stage or a ``PipelineModel``), read
    without a JVM through the same persistence code as ``load``: each stage's kernel, or where it has none,
    what it reads and writes (:attr:`~irbis.kernels.chain.KernelChain.missing`)."""
    return KernelChain([_saved_step(folder, metadata) for folder, metadata in saved_stages(path)])


def load_local(path: str | os.PathLike) -> list[StageKernel]:
    """The kernels of the stages saved in the local folder ``path`` (a stage or a ``PipelineModel``), in
    order, read without a JVM through the same persistence code as ``load``.

    Raises
    ------
    irbis.errors.NoKernelError
        Naming every stage that has no kernel (its class and uid); ``classes`` lists their classes.
    """
    return local_chain(path).kernels()


# -- the fallback: one Spark job per batch ------------------------------------------------------------
_ROW = "__irbis_row"


def spark_field(column: str, kinds: Sequence[str]) -> StructField:
    """The Spark field of an input column that accepts ``kinds`` (of
    :data:`~irbis.kernels.chain.KINDS`): an image struct, a number, a vector or a string, in that
    order of preference."""
    from irbis.spark.images import IMAGE_STRUCT

    accepted = set(kinds) or ANY_VALUE
    dtype = (IMAGE_STRUCT if "image" in accepted else DoubleType() if "number" in accepted
             else VectorUDT() if "vector" in accepted else StringType())
    return StructField(column, dtype, True)


def _spark_value(value: Any) -> Any:
    """A decoded value as Spark takes it: an (H, W, C) integer array as an image struct, an array as a
    dense vector, anything else as it is."""
    if isinstance(value, np.ndarray):
        from irbis.kernels.image.decode import array_to_struct

        if value.ndim == 3 and value.dtype.kind == "u":
            return array_to_struct(value, "")
        return Vectors.dense(np.asarray(value, np.float64).ravel())
    return value


class SparkBatches:
    """A fitted model run as one small Spark job per batch of rows, for pipelines with stages that have
    no kernel: ``createDataFrame`` → ``transform`` → ``collect``, tens of milliseconds per batch.

    Parameters
    ----------
    model : fitted Transformer or PipelineModel
    spark : SparkSession
    fields : list of StructField
        The input columns of a batch (see :func:`spark_field`).
    ordered : bool
        Keep the rows in their order with a row number (a sort); without it, Spark's order of a local
        DataFrame's rows is trusted.
    """

    def __init__(self, model: Any, spark: Any, fields: Sequence[StructField], ordered: bool = True) -> None:
        self.model, self.spark, self.ordered = model, spark, ordered
        self.fields = list(fields) + ([StructField(_ROW, LongType(), False)] if ordered else [])

    def columns(self) -> list[str]:
        """The columns the model's output has (on an empty batch), the row number left out."""
        empty = self.spark.createDataFrame([], StructType(self.fields))
        return [c for c in self.model.transform(empty).columns if c != _ROW]

    def run(self, columns: dict[str, list[Any]], outputs: Sequence[str]) -> dict[str, list[Any]]:
        """The ``outputs`` of the model on the batch ``columns`` (decoded values), as Spark rows' values."""
        names = [f.name for f in self.fields if f.name != _ROW]
        count = len(columns[names[0]])
        rows = [tuple(_spark_value(columns[c][i]) for c in names) + ((i,) if self.ordered else ())
                for i in range(count)]
        out = self.model.transform(self.spark.createDataFrame(rows, StructType(self.fields)))
        if self.ordered:
            out = out.orderBy(_ROW)
        collected = out.select(*outputs).collect()
        return {c: [r[c] for r in collected] for c in outputs}
