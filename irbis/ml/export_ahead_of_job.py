"""The network stages' export ahead of a job: on a local master the driver starts the network's ONNX export
(:func:`irbis.kernels.export_ahead.export_ahead`, in a child process) while Spark starts the job."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from irbis.kernels.export_ahead import ExportAhead, export_ahead
from irbis.spark.session import shares_machine


def export_ahead_of_job(df: DataFrame, source: dict[str, Any], shape: list[int] | None,
                        **options: Any) -> ExportAhead | None:
    """On a local master, start writing the export that the workers of the job on ``df`` will load, so the
    first job on a machine no longer waits for a worker to export; elsewhere the executors' caches are not
    the driver's, and nothing happens. ``options`` are the stage's network options (engine, precision, ...)."""
    if shape and shares_machine(df):
        return export_ahead(source, shape, **options)
    return None
