"""Images (Spark image structs or encoded bytes) to a network's input batch, as a model spec says.

The body of :class:`irbis.ml.ImageFeaturizer` before the network: decode (for bytes), convert the
BGR(A)/grey pixels of any depth to RGB uint8, then :func:`irbis.models.preprocess_rgb` (resize the
shorter side, centre crop, colour order, mean/std, CHW), writing straight into one float32 batch.

Examples
--------
>>> import numpy as np
>>> from irbis.models import get_spec
>>> from irbis.kernels.image import array_to_struct
>>> batch, valid, errors = preprocess_images(
...     [array_to_struct(np.zeros((300, 400, 3), np.uint8)), None], get_spec("efficientnet_lite0"))
>>> batch.shape, valid.tolist(), errors
((1, 3, 224, 224), [True, False], [None, None])
"""
from __future__ import annotations

from typing import Any, Sequence

import cv2
import numpy as np

from irbis.kernels.image import DEFAULT_MAX_PIXELS, ImageDecodeError, decode_image, struct_to_array
from irbis.models.preprocess import HasPreprocessing, preprocess_rgb

__all__ = ["preprocess_images", "to_rgb8"]


def to_rgb8(img: np.ndarray) -> np.ndarray:
    """Turn a BGR, BGRA or grey image of any depth into RGB (or grey) uint8.

    16-bit images keep their top 8 bits; float images are taken as 0..255 and clipped.
    """
    if img.dtype == np.uint16:
        img = (img >> 8).astype(np.uint8)
    elif img.dtype != np.uint8:
        img = np.clip(img, 0, 255).astype(np.uint8)
    channels = img.shape[2] if img.ndim == 3 else 1
    if channels == 1:
        return img
    if channels == 2:
        raise ValueError("images with 2 channels are neither grey nor colour; convert them first")
    code = cv2.COLOR_BGR2RGB if channels == 3 else cv2.COLOR_BGRA2RGB
    return cv2.cvtColor(img, code)


def _load(value: Any, encoded: bool, grey: bool, max_pixels: int | None) -> np.ndarray:
    if encoded:
        flags = cv2.IMREAD_GRAYSCALE if grey else cv2.IMREAD_COLOR
        return to_rgb8(decode_image(value, max_pixels, flags))
    return to_rgb8(struct_to_array(value))


def preprocess_images(values: Sequence[Any], spec: HasPreprocessing, *, encoded: bool = False,
                      max_pixels: int | None = DEFAULT_MAX_PIXELS, raise_errors: bool = False
                      ) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Preprocess a column of images into one float32 batch of the model's input shape.

    Parameters
    ----------
    values : sequence of dict, bytes or None
        Spark image structs (``encoded=False``) or encoded files (``encoded=True``).
    spec : ModelSpec or Preprocessing
        Input size, resize, interpolation, colour order, mean and std.
    encoded : bool
        Whether ``values`` hold encoded bytes to decode first (in the same pass).
    max_pixels : int or None
        Pixel limit for decoding.
    raise_errors : bool
        Raise on the first bad image instead of reporting it.

    Returns
    -------
    batch : ndarray, float32, shape (M, C, H, W)
        The M good rows, in order.
    valid : ndarray of bool, shape (len(values),)
        Which rows are in ``batch``.
    errors : list of str or None
        Why a non-null row could not be used (``None`` for good and for null rows).
    """
    channels = 1 if spec.color_order == "L" else 3
    batch = np.empty((len(values), channels, *spec.input_size), np.float32)
    valid = np.zeros(len(values), bool)
    errors: list[str | None] = [None] * len(values)
    count = 0
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            batch[count] = preprocess_rgb(_load(value, encoded, channels == 1, max_pixels), spec)
        except (ImageDecodeError, ValueError, TypeError, cv2.error) as exc:
            if raise_errors:
                raise
            errors[i] = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            continue
        valid[i] = True
        count += 1
    return batch[:count], valid, errors
