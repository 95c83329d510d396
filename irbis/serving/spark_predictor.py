"""The slower path: a pipeline with stages that have no kernel, served through an embedded Spark session.

Every batch of requests becomes one small Spark job (``createDataFrame`` → ``transform`` →
``collect``) on the driver's local session: it serves any pipeline Spark can load, at tens of
milliseconds per batch instead of the kernels' fraction of a millisecond.
"""
from __future__ import annotations

from typing import Any, Sequence

from irbis.serving.predictor import _SPARKML_INPUT_KINDS, _check_outputs, _json_value, _probe_kinds
from irbis.serving.saved import read_metadata

__all__ = ["SparkPredictor"]

_ROW = "__irbis_row"


def _stages(model: Any) -> list[Any]:
    from pyspark.ml import PipelineModel

    if isinstance(model, PipelineModel):
        return [s for stage in model.stages for s in _stages(stage)]
    return [model]


def _reads(stage: Any) -> tuple[list[str], set[str]]:
    """The columns a loaded stage reads, and the kinds it accepts for them."""
    if hasattr(stage, "_input_columns"):
        columns = stage._input_columns()
        return columns, set()
    for name, kinds in (("inputCols", None), ("inputCol", None), ("featuresCol", {"vector"})):
        if stage.hasParam(name) and stage.isDefined(stage.getParam(name)):
            value = stage.getOrDefault(stage.getParam(name))
            default = _SPARKML_INPUT_KINDS.get(type(stage).__name__, {"number", "vector", "string"})
            return ([value] if isinstance(value, str) else list(value)), set(kinds or default)
    return [], set()


def _writes(stage: Any) -> set[str]:
    if hasattr(stage, "_output_columns"):
        return {n for n, _ in stage._output_columns()}
    names = ("outputCol", "outputCols", "predictionCol", "probabilityCol", "rawPredictionCol")
    values = [stage.getOrDefault(stage.getParam(n)) for n in names
              if stage.hasParam(n) and stage.isDefined(stage.getParam(n))]
    return {c for v in values for c in ([v] if isinstance(v, str) else v)}


class SparkPredictor:
    """A :class:`~irbis.serving.predictor.Predictor` whose batches run as Spark jobs (see the module)."""

    slow = True

    def __init__(self, path: str, master: str, outputs: Sequence[str] | None = None) -> None:
        from pyspark.ml.util import DefaultParamsReader

        from irbis.spark.session import get_spark

        self.spark = get_spark(master, app_name="irbis-serve")
        if read_metadata(path)["class"].endswith(".PipelineModel"):
            from pyspark.ml import PipelineModel

            self.model = PipelineModel.load(path)
        else:
            self.model = DefaultParamsReader.loadParamsInstance(path, self.spark)
        self.inputs, produced = {}, set()
        for stage in _stages(self.model):
            columns, kinds = _reads(stage)
            for column in columns:
                if column not in produced and column not in self.inputs:
                    self.inputs[column] = kinds or _probe_kinds(stage, column)
            produced |= _writes(stage)
        if not self.inputs:
            raise ValueError("cannot tell which columns the pipeline reads; no stage names its input columns")
        self.nullable = {c: True for c in self.inputs}
        written = [c for c in self.model.transform(self.spark.createDataFrame([], self.schema())).columns
                   if c not in self.inputs and c != _ROW]
        self.outputs = _check_outputs(written, outputs)

    def schema(self) -> Any:
        """The Spark schema of the request rows: one field per input column, and the row number."""
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

        from irbis.spark.images import IMAGE_STRUCT

        def dtype(kinds: set[str]) -> Any:
            if "image" in kinds:
                return IMAGE_STRUCT
            if "number" in kinds:
                return DoubleType()
            return VectorUDT() if "vector" in kinds else StringType()

        return StructType([StructField(c, dtype(k), True) for c, k in self.inputs.items()]
                          + [StructField(_ROW, LongType(), False)])

    def predict(self, columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Run one Spark job on the batch; JSON-ready output columns."""
        from pyspark.ml.linalg import Vectors

        from irbis.kernels.image import array_to_struct

        def cell(value: Any, kinds: set[str]) -> Any:
            if value is None:
                return None
            if "image" in kinds and getattr(value, "dtype", None) is not None and value.dtype.kind == "u":
                return array_to_struct(value, "")
            return Vectors.dense(value) if hasattr(value, "shape") else value

        names = list(self.inputs)
        rows = [tuple(cell(columns[c][i], self.inputs[c]) for c in names) + (i,)
                for i in range(len(columns[names[0]]))]
        frame = self.spark.createDataFrame(rows, self.schema())
        out = self.model.transform(frame).orderBy(_ROW).select(*self.outputs).collect()
        return {c: [_json_value(r[c].asDict() if hasattr(r[c], "asDict") else r[c]) for r in out]
                for c in self.outputs}
