"""The slower path: a pipeline with stages that have no kernel, served through an embedded Spark session.

Every batch of requests becomes one small Spark job
(:class:`irbis.ml.kernel_pipeline.SparkBatches`) on the driver's local session: it serves any pipeline
Spark can load, at tens of milliseconds per batch instead of the kernels' fraction of a millisecond.
"""
from __future__ import annotations

from typing import Any, Sequence

from irbis.errors import NoKernelError
from irbis.kernels.sparkml import INPUT_KINDS
from irbis.kernels.sparkml_state import ANY_VALUE, read_metadata
from irbis.ml.kernel_pipeline import SparkBatches, flatten, spark_field, stage_kernel
from irbis.serving.codecs import check_outputs, json_value

__all__ = ["SparkPredictor"]

def _params_io(stage: Any) -> tuple[dict[str, frozenset[str]], set[str]]:
    """The columns a stage without a kernel reads (with the kinds it declares) and writes, from its
    column hooks (Irbis) or its column Params (SparkML)."""
    if hasattr(stage, "_input_columns"):
        return ({c: stage._accepts or ANY_VALUE for c in stage._input_columns()},
                {n for n, _ in stage._output_columns()})
    reads: dict[str, frozenset[str]] = {}
    for name in ("inputCols", "inputCol", "featuresCol"):
        if stage.hasParam(name) and stage.isDefined(stage.getParam(name)):
            value = stage.getOrDefault(stage.getParam(name))
            default = frozenset({"vector"}) if name == "featuresCol" else ANY_VALUE
            reads = dict.fromkeys([value] if isinstance(value, str) else value,
                                  INPUT_KINDS.get(type(stage).__name__, default))
            break
    names = ("outputCol", "outputCols", "predictionCol", "probabilityCol", "rawPredictionCol")
    values = [stage.getOrDefault(stage.getParam(n)) for n in names
              if stage.hasParam(n) and stage.isDefined(stage.getParam(n))]
    return reads, {c for v in values for c in ([v] if isinstance(v, str) else v)}


def _inputs(stages: list[Any]) -> dict[str, frozenset[str]]:
    """The columns the pipeline reads from a request, with the kinds each accepts."""
    inputs: dict[str, frozenset[str]] = {}
    produced: set[str] = set()
    for stage in stages:
        try:
            kernel = stage_kernel(stage)
            reads, writes = {c: kernel.kinds.get(c) or ANY_VALUE for c in kernel.inputs}, set(kernel.outputs)
        except NoKernelError:
            reads, writes = _params_io(stage)
        for column, kinds in reads.items():
            if column not in produced and column not in inputs:
                inputs[column] = kinds
        produced |= writes
    return inputs


def _last_stage_outputs(model: Any, spark: Any, fields: list[Any], produced: list[str]) -> list[str]:
    """The columns the pipeline's last stage adds (in ``produced``' order), from the schemas the pipeline
    gives an empty batch with and without that stage."""
    from pyspark.ml import PipelineModel

    stages = flatten(model)
    if len(stages) == 1:
        return produced
    before = set(SparkBatches(PipelineModel(stages[:-1]), spark, fields).columns())
    return [c for c in produced if c not in before]


class SparkPredictor:
    """A :class:`~irbis.serving.predictor.Predictor` whose batches run as Spark jobs (see the module); it
    answers with ``outputs``, by default the columns the last stage adds, ``["all"]`` for every column."""

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
        self.inputs = {c: set(k) for c, k in _inputs(flatten(self.model)).items()}
        if not self.inputs:
            raise ValueError("cannot tell which columns the pipeline reads; no stage names its input columns")
        self.nullable = {c: True for c in self.inputs}
        fields = [spark_field(c, k) for c, k in self.inputs.items()]
        self.batches = SparkBatches(self.model, self.spark, fields)
        produced = [c for c in self.batches.columns() if c not in self.inputs]
        self.outputs = check_outputs(produced, outputs, _last_stage_outputs(self.model, self.spark, fields, produced))

    def predict(self, columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Run one Spark job on the batch; JSON-ready output columns."""
        out = self.batches.run(columns, self.outputs)
        return {c: [json_value(v.asDict() if hasattr(v, "asDict") else v) for v in values]
                for c, values in out.items()}
