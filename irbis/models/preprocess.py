"""Turn an RGB uint8 photo into a model's input tensor, as the model's spec prescribes.

The reference preprocessing for ImageNet models: resize the shorter side to ``resize_to`` (keeping the
aspect ratio, the longer side truncated as torchvision does), crop the centre ``input_size``, convert to
the model's colour order, subtract ``mean`` and divide by ``std`` (0..255 units), and lay out as CHW.

The geometry and arithmetic are those of :mod:`irbis.kernels.image_ops`, the one image module that
``ImageTransformer`` uses too, so a chain ``resize(resize_to, resize_to, keepAspectRatio=True)``,
``centerCrop``, ``colorFormat``, ``normalize`` gives exactly the same tensor as a model card.
"""

from __future__ import annotations

from typing import Protocol

import cv2
import numpy as np

from irbis.kernels.image_ops import center_crop, normalize, resize, to_chw

class HasPreprocessing(Protocol):
    """Anything with the fields of ``irbis.models.registry.Preprocessing`` (a ``ModelSpec`` too)."""

    input_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize_to: int | None
    interpolation: str
    color_order: str


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
        image = resize(image, height, width, interpolation=spec.interpolation)
    else:
        image = resize(image, spec.resize_to, spec.resize_to, keep_aspect_ratio=True,
                       interpolation=spec.interpolation)
        if image.shape[0] < height or image.shape[1] < width:
            raise ValueError(f"cannot crop {height}x{width} from an image of {image.shape[0]}x"
                             f"{image.shape[1]}; the spec's resize_to must be at least its input size")
        image = center_crop(image, height, width)
    return to_chw(normalize(_to_color_order(image, spec.color_order), spec.mean, spec.std))


def _check_image(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise TypeError(f"image must be uint8, found dtype {image.dtype}; convert 0..255 pixels to uint8")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3):
        raise ValueError(f"image must have shape (H, W, 3), (H, W, 1) or (H, W), found {image.shape}")
    return image


def _to_color_order(image: np.ndarray, color_order: str) -> np.ndarray:
    channels = image.shape[2]
    if color_order == "L":
        return image if channels == 1 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)[:, :, None]
    if channels == 1:
        image = np.repeat(image, 3, axis=2)
    return image[:, :, ::-1] if color_order == "BGR" else image
