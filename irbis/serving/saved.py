"""Reading a saved ``PipelineModel`` (or one saved stage) without a SparkSession.

A saved stage is a folder holding ``metadata/part-*`` (one JSON line: class, uid, Params) and, for
fitted SparkML models, ``data/*.parquet`` (the fitted state). Irbis stages are rebuilt from their
class, Params and sidecar files (as :class:`irbis.ml.persistence.IrbisReader` does); a SparkML
stage is read by :func:`irbis.kernels.sparkml_state.read_stage` into the state that the kernel
builders of :data:`irbis.kernels.sparkml.SPARKML_KERNELS` take. Parquet files are read with
pyarrow: no JVM starts.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from irbis.kernels.sparkml_state import read_metadata

__all__ = ["SavedStage", "build_irbis_stage", "read_metadata", "read_saved"]


@dataclass
class SavedStage:
    """One stage of a saved pipeline: its metadata, its folder, and the stage object when built."""

    class_name: str
    metadata: dict[str, Any]
    path: Path

    @property
    def short_name(self) -> str:
        """The class name without its package (``LogisticRegressionModel``)."""
        return self.class_name.rsplit(".", 1)[-1]

    @property
    def is_irbis(self) -> bool:
        return self.class_name.startswith("irbis.")


def read_saved(path: str | os.PathLike) -> list[SavedStage]:
    """The stages of the pipeline (nested pipelines flattened), or the one stage, saved in ``path``."""
    path = Path(path)
    metadata = read_metadata(str(path))
    if not metadata["class"].endswith(".PipelineModel"):
        return [SavedStage(metadata["class"], metadata, path)]
    stages = []
    for uid in metadata["paramMap"]["stageUids"]:
        found = sorted((path / "stages").glob(f"*_{uid}"))
        if not found:
            raise FileNotFoundError(f"{str(path)!r}: stage {uid} is listed in the metadata but has "
                                    f"no folder under stages/")
        stages += read_saved(found[0])
    return stages


def build_irbis_stage(saved: SavedStage) -> Any:
    """Rebuild an Irbis stage from its class, Params and sidecar files (no SparkSession)."""
    from pyspark.ml.util import DefaultParamsReader

    from irbis.ml.persistence import _THROUGH_SPARK

    module_name, _, class_name = saved.class_name.rpartition(".")
    module = __import__(module_name, fromlist=[class_name])
    stage = getattr(module, class_name)()
    stage._resetUid(saved.metadata["uid"])
    DefaultParamsReader.getAndSetParams(stage, saved.metadata)
    if saved.metadata.get(_THROUGH_SPARK):
        raise ValueError(f"{saved.class_name} {saved.metadata['uid']}: its files were saved through "
                         f"Spark (a URI path); serve it with --spark or save the pipeline to a local folder")
    data = saved.path / "data"
    if data.is_dir():
        stage._load_extra(str(data))
    return stage
