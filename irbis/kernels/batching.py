"""Turning a column of rows (vectors, arrays, nested arrays, image structs) into one tensor batch, and back.

Pure numpy: the same code serves Spark (rows of an Arrow batch), pandas and the HTTP server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def row_to_array(value: Any) -> np.ndarray:
    """One row as a float32 array: a flat vector, a (nested) array, or an image struct (as CHW)."""
    if isinstance(value, dict):
        return image_struct_to_chw(value)
    arr = np.asarray(value)
    if arr.dtype == object:
        arr = np.stack([row_to_array(v) for v in arr])
    return arr.astype(np.float32, copy=False)


def image_struct_to_chw(image: dict[str, Any]) -> np.ndarray:
    """Spark image struct (``height``, ``width``, ``nChannels``, ``data``) to float32 CHW, channel order kept."""
    h, w, c = int(image["height"]), int(image["width"]), int(image["nChannels"])
    pixels = np.frombuffer(image["data"], dtype=np.uint8)
    if pixels.size != h * w * c:
        raise ValueError(f"image struct holds {pixels.size} bytes, expected {h}x{w}x{c} = {h * w * c}")
    return pixels.reshape(h, w, c).transpose(2, 0, 1).astype(np.float32)


def rows_to_batch(
    values: Sequence[Any], column: str, input_shape: Sequence[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Stack the non-null rows of ``column`` into one float32 batch.

    Parameters
    ----------
    values : sequence
        The column's rows; ``None`` rows are skipped.
    column : str
        The column's name, for error messages.
    input_shape : sequence of int, optional
        Shape of one row without the batch axis. Rows with that many values are reshaped to it; rows
        with another count are an error naming the column and both shapes.

    Returns
    -------
    batch : ndarray of shape (M, *input_shape), float32
        The M non-null rows.
    valid : ndarray of shape (len(values),), bool
        Which rows were non-null.
    """
    valid = np.array([v is not None and not _is_nan_scalar(v) for v in values], dtype=bool)
    arrays = [row_to_array(v) for v, ok in zip(values, valid) if ok]
    if not arrays:
        shape = tuple(input_shape) if input_shape else (0,)
        return np.zeros((0, *shape), np.float32), valid
    if input_shape:
        shape = tuple(int(d) for d in input_shape)
        expected = int(np.prod(shape))
        for a in arrays:
            if a.size != expected:
                raise ValueError(
                    f"column {column!r}: a row has shape {list(a.shape)} ({a.size} values), but the "
                    f"network expects shape {list(shape)} ({expected} values); fix the data or inputShape"
                )
        return np.stack([a.reshape(shape) for a in arrays]), valid
    first = arrays[0].shape
    for a in arrays:
        if a.shape != first:
            raise ValueError(
                f"column {column!r}: rows have different shapes ({list(first)} and {list(a.shape)}); "
                f"set inputShape to reshape flat rows, or fix the data"
            )
    return np.stack(arrays), valid


def scatter_rows(outputs: np.ndarray, valid: np.ndarray) -> list[np.ndarray | None]:
    """Give each input row its output row, ``None`` where the input was null."""
    rows: list[np.ndarray | None] = [None] * len(valid)
    for i, out in zip(np.flatnonzero(valid), outputs):
        rows[i] = out
    return rows


def _is_nan_scalar(value: Any) -> bool:
    return isinstance(value, float) and value != value
