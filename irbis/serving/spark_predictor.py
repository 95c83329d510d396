"""The slower path: a pipeline with stages that have no kernel, served through an embedded Spark session.

Every batch of requests becomes one small Spark job
(:class:`irbis.ml.kernel_pipeline.SparkBatches`) on the driver's local session: it serves any pipeline
Spark can load, at tens of milliseconds per batch instead of the kernels' fraction of a millisecond.
"""
from __future__ import annotations

from typing import Any, Sequence

from irbis.kernels.chain import KernelChain
from irbis.ml.kernel_pipeline import SparkBatches, flatten, local_chain, spark_field
from irbis.serving.codecs import check_outputs, json_value

__all__ = ["SparkPredictor"]


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
    answers with ``outputs``, by default the columns the last stage adds, ``["all"]`` for every column.
    A request gives the columns ``chain`` (the saved stages' :func:`~irbis.ml.kernel_pipeline.local_chain`,
    read again when not given) reads from outside."""

    slow = True

    def __init__(self, path: str, master: str, outputs: Sequence[str] | None = None,
                 chain: KernelChain | None = None) -> None:
        from pyspark.ml.util import DefaultParamsReader

        from irbis.spark.session import get_spark

        chain = local_chain(path) if chain is None else chain
        self.spark = get_spark(master, app_name="irbis-serve")
        self.model: Any = DefaultParamsReader.loadParamsInstance(path, self.spark)  # a PipelineModel too
        self.inputs = {c: set(k) for c, k in chain.inputs.items()}
        if not self.inputs:
            raise ValueError("cannot tell which columns the pipeline reads; no stage names its input columns")
        self.nullable = {c: True for c in self.inputs}
        fields = [spark_field(c, sorted(k)) for c, k in self.inputs.items()]
        self.batches = SparkBatches(self.model, self.spark, fields)
        produced = [c for c in self.batches.columns() if c not in self.inputs]
        self.outputs = check_outputs(produced, outputs, _last_stage_outputs(self.model, self.spark, fields, produced))

    def predict(self, columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Run one Spark job on the batch; JSON-ready output columns."""
        out = self.batches.run(columns, self.outputs)
        return {c: [json_value(v.asDict() if hasattr(v, "asDict") else v) for v in values]
                for c, values in out.items()}
