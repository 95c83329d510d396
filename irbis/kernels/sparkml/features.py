"""Kernels of SparkML's fitted feature stages, with SparkML's numerics (float64, as the JVM computes).

Each builder takes a :class:`~irbis.kernels.sparkml.state.StageState` and returns a
:class:`~irbis.kernels.chain.StageKernel`. Vectors come out dense. Numeric columns arrive as
float64 blocks where a null is NaN (the block convention), so ``NaN`` and null are one value here:
OneHotEncoder gives null for it (as SparkML does for null) and Imputer replaces it. Pure: no pyspark.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from irbis.kernels.blocks import Tensor
from irbis.kernels.chain import StageKernel
from irbis.kernels.sparkml.state import StageState, number_column, vector_block

__all__ = ["imputer", "min_max_scaler", "one_hot_encoder", "standard_scaler", "string_indexer"]


def _vector_stage(state: StageState, transform: Any, size: int) -> StageKernel:
    """A stage from one vector column to one vector column, rows computed by ``transform``."""
    source, target = state.param("inputCol"), state.param("outputCol")

    def run(blocks: dict[str, Any]) -> dict[str, Any]:
        block = vector_block(state.cls, source, blocks[source], size)
        return {target: Tensor(transform(block.values), block.valid)}

    return StageKernel([source], [target], run)


def standard_scaler(state: StageState) -> StageKernel:
    """``StandardScalerModel``: ``(x - mean) * (1 / std)``, each part when withMean / withStd."""
    mean, std = state.data["mean"], state.data["std"]
    shift = mean if state.param("withMean", False) else np.zeros_like(mean)
    scale = np.where(std == 0, 0.0, 1.0 / np.where(std == 0, 1.0, std)) if state.param("withStd", True) \
        else np.ones_like(std)

    def transform(x: np.ndarray) -> np.ndarray:
        return (x - shift) * scale

    return _vector_stage(state, transform, len(std))


def min_max_scaler(state: StageState) -> StageKernel:
    """``MinMaxScalerModel``: each feature mapped from [originalMin, originalMax] to [min, max].

    A constant feature becomes the middle of [min, max]; NaN stays NaN.
    """
    low, high = float(state.param("min", 0.0)), float(state.param("max", 1.0))
    original_min = state.data["originalMin"]
    span = state.data["originalMax"] - original_min
    factor = np.where(span != 0, (high - low) / np.where(span != 0, span, 1.0), 0.0)

    def transform(x: np.ndarray) -> np.ndarray:
        out = np.where(factor != 0, (x - original_min) * factor + low, (low + high) / 2)
        return np.where(np.isnan(x), x, out)

    return _vector_stage(state, transform, len(original_min))


def _index_column(state: StageState, column: str, labels: list[str], values: Any) -> np.ndarray:
    lookup = {label: float(i) for i, label in enumerate(labels)}
    policy = state.param("handleInvalid", "error")
    out = np.empty(len(values))
    for i, value in enumerate(values):
        label = None if value is None or (isinstance(value, float) and value != value) else \
            value if isinstance(value, str) else str(value)
        index = lookup.get(label) if label is not None else None
        if index is None:
            if policy == "error":
                found = "a null value" if label is None else f"the unseen label {label!r}"
                raise ValueError(f"{state.cls}: column {column!r} has {found}; the fitted labels are "
                                 f"{labels[:10]}{' ...' if len(labels) > 10 else ''}. Set handleInvalid "
                                 "to 'keep' or 'skip' to accept it.")
            index = float(len(labels)) if policy == "keep" else np.nan
        out[i] = index
    return out


def string_indexer(state: StageState) -> StageKernel:
    """``StringIndexerModel``: labels to their fitted indices (float64), one or many columns.

    handleInvalid ``"keep"`` gives unseen labels and nulls the index ``len(labels)``; ``"skip"``
    gives them NaN and marks the kernel as dropping rows; ``"error"`` raises, naming the column.
    """
    inputs, outputs = state.columns(), state.columns("outputCol", "outputCols")
    labels = [list(ls) for ls in state.data["labelsArray"]]

    def run(blocks: dict[str, Any]) -> dict[str, Any]:
        out = {o: _index_column(state, c, ls, blocks[c]) for c, o, ls in zip(inputs, outputs, labels)}
        if state.param("handleInvalid") == "skip":
            dropped = np.any([np.isnan(v) for v in out.values()], axis=0)
            out = {k: np.where(dropped, np.nan, v) for k, v in out.items()}
        return out

    return StageKernel(inputs, outputs, run, drops_rows=state.param("handleInvalid") == "skip")


def _one_hot(state: StageState, column: str, values: np.ndarray, categories: int) -> Tensor:
    keep = state.param("handleInvalid", "error") == "keep"
    size = categories + (1 if keep else 0) - (1 if state.param("dropLast", True) else 0)
    valid = ~np.isnan(values)
    x = values[valid]
    bad = (x < 0) | (x >= categories)
    if bad.any() and not keep:
        first = float(x[bad][0])
        kind = "a negative value" if first < 0 else "an unseen value"
        raise ValueError(f"{state.cls}: column {column!r} has {kind} {first!r}; it expects indices "
                         f"in [0, {categories}). Set handleInvalid to 'keep' to accept it.")
    index = np.where(bad, categories, x).astype(np.int64)
    matrix = np.zeros((len(x), size))
    hit = index < size
    matrix[np.flatnonzero(hit), index[hit]] = 1.0
    return Tensor(matrix, valid)


def one_hot_encoder(state: StageState) -> StageKernel:
    """``OneHotEncoderModel``: category indices to one-hot vectors (dropLast, handleInvalid "keep")."""
    inputs, outputs = state.columns(), state.columns("outputCol", "outputCols")
    sizes = [int(s) for s in state.data["categorySizes"]]

    def run(blocks: dict[str, Any]) -> dict[str, Any]:
        return {o: _one_hot(state, c, number_column(state.cls, c, blocks[c]), n)
                for c, o, n in zip(inputs, outputs, sizes)}

    return StageKernel(inputs, outputs, run)


def imputer(state: StageState) -> StageKernel:
    """``ImputerModel``: nulls (and NaN) and values equal to missingValue become the fitted surrogate.

    An integer column stays integer (SparkML casts the result back to the input type).
    """
    inputs, outputs = state.columns(), state.columns("outputCol", "outputCols")
    missing = float(state.param("missingValue", float("nan")))

    def column(name: str, block: Any) -> np.ndarray:
        x = number_column(state.cls, name, block)
        out = np.where(np.isnan(x) | (x == missing), float(state.data[name]), x)
        dtype = getattr(block, "dtype", None)
        return out.astype(dtype) if dtype is not None and dtype.kind in "iu" else out

    def run(blocks: dict[str, Any]) -> dict[str, Any]:
        return {o: column(c, blocks[c]) for c, o in zip(inputs, outputs)}

    return StageKernel(inputs, outputs, run)
