"""A column block (vectors, arrays, nested arrays, image structs) as one float32 network batch.

Pure numpy: the same code serves Spark (Arrow batches), pandas and the HTTP server.

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

from irbis.kernels.blocks import Images, Tensor

__all__ = ["network_batch", "refused_shape"]


def network_batch(block: Any, column: str, input_shape: Sequence[int] | None = None) -> Tensor:
    """The non-null rows of ``column`` as one float32 batch of the network's input shape.

    Parameters
    ----------
    block : Tensor or Images
        The column's block; images become CHW arrays in their own channel order.
    column : str
        The column's name, for error messages.
    input_shape : sequence of int, optional
        Shape of one row without the batch axis. Rows with that many values are reshaped to it; rows
        with another count are an error naming the column and both shapes.

    Returns
    -------
    Tensor
        ``values`` of shape (M, *input_shape), float32, and the validity mask of the N rows.
    """
    if isinstance(block, Images):
        block = _images_chw(block, column)
    elif not isinstance(block, Tensor):
        raise TypeError(f"column {column!r} does not hold numbers or images (found "
                        f"{type(block).__name__}); a network needs vectors, arrays or image structs")
    values = block.values.astype(np.float32, copy=False)
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


def refused_shape(stage: str, column: str, found: Sequence[int], expected: Sequence[int] | None,
                  err: BaseException) -> ValueError:
    """The error for rows that the network (any engine) refuses: the column, both shapes and the reason.

    ``err`` is the engine's own error; its last line is kept (TorchScript puts the message last, after
    its interpreter's traceback).
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return ValueError(f"{stage}: rows of column {column!r} have shape {list(found)}, which the network does "
                      f"not accept (expected: {list(expected) if expected else 'the shape of its first layer'}; "
                      f"set inputShape to reshape flat rows): {lines[-1] if lines else type(err).__name__}")


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
