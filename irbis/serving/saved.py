"""Reading a saved ``PipelineModel`` (or one saved stage) without a SparkSession.

A saved stage is a folder holding ``metadata/part-*`` (one JSON line: class, uid, Params) and, for
fitted SparkML models, ``data/*.parquet`` (the fitted state). Irbis stages are rebuilt from their
class, Params and sidecar files (as :class:`irbis.ml.persistence.IrbisReader` does); a SparkML
stage becomes a :class:`SavedSparkStage`, which offers the fitted stage's public interface
(``getFeaturesCol()``, ``coefficientMatrix``, ``getOrDefault`` ...) to the kernel builders of
:data:`irbis.kernels.sparkml.SPARKML_KERNELS`. Parquet files are read with pyarrow: no JVM starts.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SavedSparkStage", "SavedStage", "build_irbis_stage", "read_metadata", "read_saved"]


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


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON metadata of the stage saved in ``path`` (``metadata/part-*``)."""
    folder = Path(path) / "metadata"
    parts = sorted(p for p in folder.glob("part-*") if not p.name.endswith(".crc")) if folder.is_dir() else []
    if not parts:
        raise FileNotFoundError(f"{str(path)!r} is not a saved Spark ML stage or pipeline: "
                                f"it has no metadata/part-* file")
    return json.loads(parts[0].read_text().splitlines()[0])


def read_saved(path: str | os.PathLike) -> list[SavedStage]:
    """The stages of the pipeline (nested pipelines flattened), or the one stage, saved in ``path``."""
    path = Path(path)
    metadata = read_metadata(path)
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


def _linalg(value: Any) -> Any:
    """A saved vector or matrix struct as its ``pyspark.ml.linalg`` object (pure Python, no JVM)."""
    from pyspark.ml.linalg import DenseMatrix, DenseVector, SparseMatrix, SparseVector

    if not isinstance(value, dict) or "type" not in value or "values" not in value:
        return value
    if "numRows" in value:
        if value["type"] == 1:
            return DenseMatrix(value["numRows"], value["numCols"], value["values"], value["isTransposed"])
        return SparseMatrix(value["numRows"], value["numCols"], value["colPtrs"], value["rowIndices"],
                            value["values"], value["isTransposed"])
    if value["type"] == 1:
        return DenseVector(value["values"])
    return SparseVector(value["size"], value["indices"], value["values"])


class SavedSparkStage:
    """A fitted SparkML stage read from its saved folder, with the public interface kernels read.

    Params come from the metadata (``getOrDefault``, ``getXxx()``); the columns of a one-row
    ``data`` table become attributes (vectors and matrices as ``pyspark.ml.linalg`` objects), and
    every row of it is in :attr:`data_rows`.
    """

    def __init__(self, saved: SavedStage) -> None:
        self.uid = saved.metadata["uid"]
        self.class_name = saved.class_name
        self._params = {**saved.metadata.get("defaultParamMap", {}), **saved.metadata.get("paramMap", {})}
        self.data_rows = _read_data(saved.path / "data")
        self._data = ({k: _linalg(v) for k, v in self.data_rows[0].items()}
                      if len(self.data_rows) == 1 else {})

    def hasParam(self, name: str) -> bool:  # noqa: N802 (PySpark's names)
        return name in self._params

    def getParam(self, name: str) -> str:  # noqa: N802
        return name

    def isDefined(self, param: Any) -> bool:  # noqa: N802
        return getattr(param, "name", param) in self._params

    isSet = isDefined

    def getOrDefault(self, param: Any) -> Any:  # noqa: N802
        name = getattr(param, "name", param)
        if name not in self._params:
            raise KeyError(f"{self.class_name}: Param {name!r} is not in the saved metadata")
        return self._params[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._data:
            return self._data[name]
        if name.startswith("get") and len(name) > 3:
            param = name[3].lower() + name[4:]
            if param in self._params:
                return lambda: self._params[param]
        raise AttributeError(f"{self.class_name} (read from its saved folder) has no {name!r}; "
                             f"serve this pipeline with --spark")


def _read_data(folder: Path) -> list[dict[str, Any]]:
    if not folder.is_dir():
        return []
    import pyarrow.parquet as pq

    files = sorted(p for p in folder.glob("*.parquet"))
    rows: list[dict[str, Any]] = []
    for file in files:
        rows += pq.read_table(file).to_pylist()
    return rows


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
