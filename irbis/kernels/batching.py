"""A column block (vectors, arrays, nested arrays, image structs, tensor bytes) as one network batch.

Pure numpy: the same code serves Spark (Arrow batches), pandas and the HTTP server.

A *binary tensor column* holds in each row the raw little-endian bytes of one tensor of the network's
input shape, of one of :data:`TENSOR_DTYPES`: it crosses from the JVM to Python as one buffer per
batch (Spark converts an ``array<float>`` element by element), and is read here as one zero-copy
``(rows, *shape)`` view, cast to the network's input type in :func:`network_batch` only.

Examples
--------
>>> import numpy as np
>>> from irbis.kernels.blocks import Tensor
>>> block = Tensor(np.ones((2, 12)), np.array([True, False, True]))
>>> network_batch(block, "x", [3, 2, 2]).values.shape
(2, 3, 2, 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from irbis.kernels.blocks import Binary, Images, Ragged, Tensor, from_rows

__all__ = ["TENSOR_DTYPES", "binary_tensor", "network_batch", "refused_shape", "sequence_rows"]

#: Element types of a binary tensor column (its rows are raw little-endian bytes of one of these).
TENSOR_DTYPES = ("float32", "float16", "uint8")


def network_batch(block: Any, column: str, input_shape: Sequence[int] | None = None, *,
                  input_dtype: str = "float32", dtype: Any = np.float32, stage: str = "") -> Tensor:
    """The non-null rows of ``column`` as one batch of the network's input shape and type.

    Parameters
    ----------
    block : Tensor, Images or Binary
        The column's block; images become CHW arrays in their own channel order, and binary rows
        are read as tensor bytes (:func:`binary_tensor`).
    column : str
        The column's name, for error messages.
    input_shape : sequence of int, optional
        Shape of one row without the batch axis. Rows with that many values are reshaped to it; rows
        with another count are an error naming the column and both shapes. Required for binary rows.
    input_dtype : str
        The element type of binary rows, one of :data:`TENSOR_DTYPES` (other blocks ignore it).
    dtype : numpy dtype
        The network's input type: every block is cast to it here, and only here.
    stage : str
        The stage's name, for error messages.

    Returns
    -------
    Tensor
        ``values`` of shape (M, *input_shape) and type ``dtype``, and the validity mask of the N rows.
    """
    if isinstance(block, Images):
        block = _images_chw(block, column)
    elif isinstance(block, Binary):
        block = binary_tensor(block, column, input_shape, input_dtype, stage)
    elif not isinstance(block, Tensor):
        raise TypeError(f"column {column!r} does not hold numbers or images (found "
                        f"{type(block).__name__}); a network needs vectors, arrays, image structs or "
                        f"tensor bytes")
    values = block.values.astype(dtype, copy=False)
    if input_shape:
        shape = tuple(int(d) for d in input_shape)
        expected = int(np.prod(shape))
        found = int(np.prod(values.shape[1:])) if values.ndim > 1 else 1
        if len(values) and found != expected:
            raise ValueError(
                f"column {column!r}: a row has shape {list(values.shape[1:])} ({found} values), but "
                f"the network expects shape {list(shape)} ({expected} values); fix the data or "
                f"inputShape")
        values = values.reshape(len(values), *shape)
    return Tensor(values, block.valid)


def sequence_rows(block: Any, column: str) -> tuple[list[np.ndarray | None], list[str | None]]:
    """The rows of a variable-length column (a :class:`Ragged` block, or a :class:`Tensor` whose rows share
    one length) and, per row, why it has no input: ``"null row"``, ``"null step"``, ``"null value"`` or
    ``"empty sequence"`` (a row of no steps, which no network can pool); None for a usable row."""
    if isinstance(block, Tensor):
        rows: list[np.ndarray | None] = list(from_rows(block.values, block.valid))
        errors: list[str | None] = [None if r is not None else "null row" for r in rows]
    elif isinstance(block, Ragged):
        rows, errors = list(block.rows), list(block.errors)
    else:
        raise TypeError(f"column {column!r} does not hold sequences of numbers (found {type(block).__name__}); "
                        f"variableLength=True needs array<int> or array<array<float>> rows")
    for i, row in enumerate(rows):
        if row is not None and len(row) == 0:
            rows[i], errors[i] = None, "empty sequence"
    return rows, errors


def refused_shape(stage: str, column: str, found: Sequence[float], expected: Sequence[int] | None,
                  err: BaseException) -> ValueError:
    """The error for rows that the network (any engine) refuses: the column, both shapes and the reason.

    ``err`` is the engine's own error; its last line is kept (TorchScript puts the message last, after
    its interpreter's traceback).
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return ValueError(f"{stage}: rows of column {column!r} have shape {list(found)}, which the network does "
                      f"not accept (expected: {list(expected) if expected else 'the shape of its first layer'}; "
                      f"set inputShape to reshape flat rows): {lines[-1] if lines else type(err).__name__}")


def binary_tensor(block: Binary, column: str, shape: Sequence[int] | None, input_dtype: str = "float32",
                  stage: str = "") -> Tensor:
    """Rows of raw little-endian tensor bytes as one ``(M, *shape)`` array of ``input_dtype``.

    The array is a zero-copy view of the batch's buffer when the null rows hold no bytes (as Arrow
    writes them); every non-null row must hold exactly ``prod(shape) * itemsize`` bytes.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from irbis.kernels.blocks import from_arrow, tensor_bytes
    >>> rows = tensor_bytes(np.arange(8, dtype=np.float32).reshape(2, 2, 2))
    >>> binary_tensor(from_arrow(rows), "x", [2, 2]).values[1].tolist()
    [[4.0, 5.0], [6.0, 7.0]]
    """
    if input_dtype not in TENSOR_DTYPES:
        raise ValueError(f"column {column!r}: tensor bytes of type {input_dtype!r} cannot be read; "
                         f"expected one of {list(TENSOR_DTYPES)}")
    if not shape:
        raise ValueError(f"{stage or 'the stage'}: column {column!r} holds tensor bytes, which carry no "
                         f"shape; set inputShape (e.g. [3, 224, 224])")
    item = np.dtype(input_dtype).newbyteorder("<")
    shape = tuple(int(d) for d in shape)
    row_bytes = int(np.prod(shape)) * item.itemsize
    starts, sizes = block.offsets[:-1][block.valid], np.diff(block.offsets)[block.valid]
    if len(sizes) and (sizes != row_bytes).any():
        found = int(sizes[sizes != row_bytes][0])
        err = ValueError(f"a row holds {found} bytes, but {list(shape)} values of {input_dtype} take "
                         f"{row_bytes} bytes; fix the data, inputShape or inputDtype")
        raise refused_shape(stage or "the stage", column, [found / item.itemsize if found % item.itemsize
                                                           else found // item.itemsize], shape, err)
    buffer = np.frombuffer(block.data, np.uint8) if block.data is not None else np.zeros(0, np.uint8)
    if not len(starts):
        return Tensor(np.zeros((0, *shape), item), block.valid)
    first = int(starts[0])
    if (starts == first + row_bytes * np.arange(len(starts))).all():
        flat = buffer[first:first + row_bytes * len(starts)]
    else:  # null rows that hold bytes: gather the valid ones (one copy)
        flat = np.concatenate([buffer[s:s + row_bytes] for s in starts.tolist()])
    return Tensor(flat.view(item).reshape(len(starts), *shape), block.valid)


def _images_chw(images: Images, column: str) -> Tensor:
    views = [img for img in images if img is not None]
    shapes = {v.shape for v in views}
    if len(shapes) > 1:
        a, b = sorted(shapes)[:2]
        raise ValueError(f"column {column!r}: images have different sizes ({'x'.join(map(str, a))} "
                         f"and {'x'.join(map(str, b))}); resize them first (ImageTransformer)")
    if not views:
        return Tensor(np.zeros((0, 0, 0, 0), np.float32), images.valid)
    batch = np.empty((len(views), views[0].shape[2], *views[0].shape[:2]), np.float32)
    for i, view in enumerate(views):
        batch[i] = view.transpose(2, 0, 1)
    return Tensor(batch, images.valid)
