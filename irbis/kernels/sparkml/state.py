"""A fitted SparkML stage's state as plain values: its Params, its fitted data, its tree tables.

SparkML saves a stage as a folder: ``metadata/part-00000`` (one JSON line: the class, the Params set
and their defaults) and, for fitted models, ``data/`` (Parquet: vectors and matrices as Spark's UDT
structs) and for tree ensembles ``treesMetadata/``. :func:`read_stage` reads such a folder with
pyarrow alone, so a kernel can be built with no Spark at all (the HTTP server); the Spark side reads
the same values from a live stage's public attributes. Pure: no pyspark.

Examples
--------
>>> state = read_stage("model/stages/1_StandardScaler_4f2a")   # doctest: +SKIP
>>> state.cls, state.param("withMean"), state.data["std"].shape  # doctest: +SKIP
('StandardScalerModel', False, (64,))
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from irbis.errors import NoKernelError
from irbis.kernels.blocks import Tensor

__all__ = ["NoKernelError", "StageState", "number_column", "read_metadata", "read_stage", "vector_block"]


@dataclass
class StageState:
    """A stage's class name (``"StandardScalerModel"``), Params (defaults under set values) and data.

    ``data`` holds the first row of the stage's ``data/`` table with vectors and matrices as numpy
    arrays; ``tables`` holds whole tables (``"data"``, ``"treesMetadata"``) as lists of rows, for
    the stages whose data has many rows (trees); ``extra`` the other keys of the metadata JSON.
    """

    cls: str
    params: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def param(self, name: str, default: Any = None) -> Any:
        """The value of Param ``name`` (set, else its default), or ``default`` where it has none."""
        value = self.params.get(name, default)
        return float("nan") if value == "NaN" else value

    def columns(self, single: str = "inputCol", multi: str = "inputCols") -> list[str]:
        """The stage's columns from ``inputCols`` when set, else ``[inputCol]``."""
        many = self.params.get(multi)
        return list(many) if many else [self.params[single]]


# -- reading a saved folder -------------------------------------------------------------------------
def _udt(value: Any) -> Any:
    """A Parquet row of Spark's VectorUDT or MatrixUDT as a numpy array; any other value unchanged."""
    if not isinstance(value, dict) or "values" not in value or "type" not in value:
        return value
    values = np.asarray(value["values"], np.float64)
    if "numRows" in value:
        return _matrix(value, values)
    if value["type"] == 1:
        return values
    dense = np.zeros(int(value["size"]))
    dense[np.asarray(value["indices"], np.int64)] = values
    return dense


def _matrix(value: dict[str, Any], values: np.ndarray) -> np.ndarray:
    rows, cols, transposed = int(value["numRows"]), int(value["numCols"]), bool(value["isTransposed"])
    if value["type"] == 1:
        return values.reshape(rows, cols) if transposed else values.reshape(cols, rows).T
    major, minor = (rows, cols) if transposed else (cols, rows)
    dense = np.zeros((major, minor))
    pointers, indices = np.asarray(value["colPtrs"]), np.asarray(value["rowIndices"])
    for i in range(major):
        dense[i, indices[pointers[i]:pointers[i + 1]]] = values[pointers[i]:pointers[i + 1]]
    return dense if transposed else dense.T


def _rows(folder: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(folder).to_pylist()


def read_metadata(path: str) -> dict[str, Any]:
    """The JSON metadata of the Spark ML stage or pipeline saved in the local folder ``path``."""
    meta_dir = os.path.join(path, "metadata")
    parts = sorted(f for f in os.listdir(meta_dir) if f.startswith("part-")) if os.path.isdir(meta_dir) else []
    if not parts:
        raise FileNotFoundError(f"{str(path)!r} is not a saved Spark ML stage or pipeline: "
                                f"it has no metadata/part-* file")
    with open(os.path.join(meta_dir, parts[0]), encoding="utf-8") as handle:
        return json.loads(handle.readline())


def read_stage(path: str) -> StageState:
    """Read a stage saved by SparkML (``stage.save(path)``) from a local folder, without Spark."""
    meta = read_metadata(path)
    params = {**meta.get("defaultParamMap", {}), **meta.get("paramMap", {})}
    extra = {k: v for k, v in meta.items() if k not in ("paramMap", "defaultParamMap")}
    state = StageState(meta["class"].rsplit(".", 1)[-1], params, extra=extra)
    for name in ("data", "treesMetadata"):
        if os.path.isdir(os.path.join(path, name)):
            state.tables[name] = _rows(os.path.join(path, name))
    if state.tables.get("data"):
        state.data = {k: _udt(v) for k, v in state.tables["data"][0].items()}
    return state


# -- input blocks -----------------------------------------------------------------------------------
def vector_block(stage: str, column: str, block: Any, size: int | None = None) -> Tensor:
    """A vector column's block as float64 rows, checked against the stage's vector size."""
    if not isinstance(block, Tensor):
        raise TypeError(f"{stage}: column {column!r} must hold vectors, found {type(block).__name__}")
    values = np.asarray(block.values, np.float64).reshape(len(block.values), -1)
    if size is not None and values.shape[1] != size and len(values):
        raise ValueError(f"{stage}: column {column!r} holds vectors of size {values.shape[1]}, "
                         f"the fitted stage expects size {size}")
    return Tensor(values, block.valid)


def number_column(stage: str, column: str, block: Any) -> np.ndarray:
    """A numeric column's block as float64, NaN for nulls."""
    if isinstance(block, Tensor):
        values = np.asarray(block.values, np.float64).reshape(len(block.values), -1)
        if values.shape[1] != 1:
            raise TypeError(f"{stage}: column {column!r} must hold numbers, found vectors of size "
                            f"{values.shape[1]}")
        full = np.full(len(block), np.nan)
        full[block.valid] = values[:, 0]
        return full
    try:
        return np.array([np.nan if v is None else v for v in block], np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{stage}: column {column!r} must hold numbers, found "
                        f"{type(next(v for v in block if v is not None)).__name__}") from None
