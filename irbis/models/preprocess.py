"""Turn an RGB uint8 photo into a model's input tensor, as the model's spec prescribes.

The reference preprocessing for ImageNet models: resize the shorter side to ``resize_to`` (keeping the
aspect ratio, the longer side truncated as torchvision does), crop the centre ``input_size``, convert to
the model's colour order, subtract ``mean`` and divide by ``std`` (0..255 units), and lay out as CHW.
"""

from __future__ import annotations

from typing import Protocol

import cv2
import numpy as np

_CV2_INTERPOLATION = {
    "nearest": cv2.INTER_NEAREST,
    "bilinear": cv2.INTER_LINEAR,
    "bicubic": cv2.INTER_CUBIC,
    "area": cv2.INTER_AREA,
}


class HasPreprocessing(Protocol):
    """Anything with the fields of ``irbis.models.registry.Preprocessing`` (a ``ModelSpec`` too)."""

    input_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize_to: int | None
    interpolation: str
    color_order: str


def resize_shorter_side(image: np.ndarray, size: int, interpolation: str = "bilinear") -> np.ndarray:
    """Resize so that the shorter side is ``size`` pixels, keeping the aspect ratio."""
    h, w = image.shape[:2]
    if h <= w:
        new_h, new_w = size, int(size * w / h)
    else:
        new_h, new_w = int(size * h / w), size
    if (new_h, new_w) == (h, w):
        return image
    return _resize(image, new_h, new_w, interpolation)


def center_crop(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre ``height`` x ``width`` window of an HWC or HW image."""
    h, w = image.shape[:2]
    if h < height or w < width:
        raise ValueError(f"cannot crop {height}x{width} from an image of {h}x{w}; resize it first")
    top, left = int(round((h - height) / 2.0)), int(round((w - width) / 2.0))
    return image[top:top + height, left:left + width]


def preprocess_rgb(image: np.ndarray, spec: HasPreprocessing) -> np.ndarray:
    """Preprocess one RGB (or grey) uint8 image for the model described by ``spec``.

    Parameters
    ----------
    image : numpy.ndarray
        uint8 array of shape (H, W, 3) in RGB order, or (H, W) / (H, W, 1) greyscale.
    spec : ModelSpec or Preprocessing
        Supplies ``input_size``, ``resize_to``, ``interpolation``, ``color_order``, ``mean``, ``std``.

    Returns
    -------
    numpy.ndarray
        float32 array of shape (C, H, W), C-contiguous.

    Examples
    --------
    >>> from irbis.models import get_spec
    >>> preprocess_rgb(np.zeros((300, 400, 3), np.uint8), get_spec("efficientnet_lite0")).shape
    (3, 224, 224)
    """
    image = _check_image(image)
    height, width = spec.input_size
    if spec.resize_to is None:
        image = _resize(image, height, width, spec.interpolation)
    else:
        image = center_crop(resize_shorter_side(image, spec.resize_to, spec.interpolation), height, width)
    image = _to_color_order(image, spec.color_order)
    mean = np.asarray(spec.mean, np.float32)
    inv_std = 1.0 / np.asarray(spec.std, np.float32)
    chw = image.astype(np.float32).transpose(2, 0, 1)
    return np.ascontiguousarray((chw - mean[:, None, None]) * inv_std[:, None, None])


def _check_image(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise TypeError(f"image must be uint8, found dtype {image.dtype}; convert 0..255 pixels to uint8")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3):
        raise ValueError(f"image must have shape (H, W, 3), (H, W, 1) or (H, W), found {image.shape}")
    return image


def _resize(image: np.ndarray, height: int, width: int, interpolation: str) -> np.ndarray:
    if interpolation not in _CV2_INTERPOLATION:
        raise ValueError(f"interpolation must be one of {sorted(_CV2_INTERPOLATION)}, found {interpolation!r}")
    out = cv2.resize(image, (width, height), interpolation=_CV2_INTERPOLATION[interpolation])
    return out[:, :, None] if out.ndim == 2 else out


def _to_color_order(image: np.ndarray, color_order: str) -> np.ndarray:
    channels = image.shape[2]
    if color_order == "L":
        return image if channels == 1 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)[:, :, None]
    if channels == 1:
        image = np.repeat(image, 3, axis=2)
    return image[:, :, ::-1] if color_order == "BGR" else image
