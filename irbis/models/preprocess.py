"""Turn an RGB uint8 photo into a model's input tensor, as the model's catalogue entry prescribes.

The reference preprocessing for ImageNet models: resize the shorter side to ``resize_to`` (keeping the
aspect ratio, the longer side truncated as torchvision does), crop the centre ``input_size``, convert to
the model's colour order, subtract ``mean`` and divide by ``std`` (0..255 units), and lay out as CHW.

The geometry and arithmetic are those of :mod:`irbis.kernels.image_ops`, the one image module that
``ImageTransformer`` uses too, so a chain ``resize(resize_to, resize_to, keepAspectRatio=True)``,
``centerCrop``, ``colorFormat``, ``normalize`` gives exactly the same tensor as a catalogue entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import cv2
import numpy as np

from irbis.kernels.image_ops import INTERPOLATIONS as _OPENCV_INTERPOLATIONS
from irbis.kernels.image_ops import center_crop, normalize, resize, to_chw

COLOR_ORDERS = ("RGB", "BGR", "L")
INTERPOLATIONS = tuple(_OPENCV_INTERPOLATIONS)  # the names image_ops knows, one table for both


@dataclass(frozen=True)
class Preprocessing:
    """How an RGB uint8 image becomes the network input: one part of a catalogue entry.

    The shorter side is resized to ``resize_to`` and the centre ``input_size`` (H, W) cropped; with
    ``resize_to=None`` the image is resized straight to ``input_size``. Then ``(x - mean) / std`` per
    channel, with mean and std in 0..255 pixel units, in ``color_order`` ("RGB", "BGR" or "L").
    """

    input_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize_to: int | None = None
    interpolation: str = "bilinear"
    color_order: str = "RGB"

    def __post_init__(self) -> None:
        if self.color_order not in COLOR_ORDERS:
            raise ValueError(f"color_order must be one of {COLOR_ORDERS}, found {self.color_order!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, found {self.interpolation!r}")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(f"mean and std need {self.channels} values for color_order {self.color_order!r}, "
                             f"found mean={self.mean}, std={self.std}")
        if min(self.std) <= 0 or len(self.input_size) != 2 or min(self.input_size) < 1:
            raise ValueError(f"std must be > 0 and input_size (H, W) positive, found std={self.std}, "
                             f"input_size={self.input_size}")
        if self.resize_to is not None and self.resize_to < max(self.input_size):
            raise ValueError(f"resize_to must be at least the input size {self.input_size} (the centre is "
                             f"cropped from the resized image), found {self.resize_to}")

    @property
    def channels(self) -> int:
        """Number of input channels (1 for "L", else 3)."""
        return 1 if self.color_order == "L" else 3

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Per-sample network input (C, H, W)."""
        return (self.channels, *self.input_size)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Preprocessing:
        """Parse the JSON dict of :meth:`to_dict`."""
        d = dict(d)
        for k in ("input_size", "mean", "std"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


def preprocess_rgb(image: np.ndarray, spec: Preprocessing) -> np.ndarray:
    """Preprocess one RGB (or grey) uint8 image as ``spec`` (a model's preprocessing) prescribes.

    Parameters
    ----------
    image : numpy.ndarray
        uint8 array of shape (H, W, 3) in RGB order, or (H, W) / (H, W, 1) greyscale.
    spec : Preprocessing
        A catalogue entry's ``preprocessing``; supplies ``input_size``, ``resize_to``, ``interpolation``, ``color_order``, ``mean``, ``std``.

    Returns
    -------
    numpy.ndarray
        float32 array of shape (C, H, W), C-contiguous.

    Examples
    --------
    >>> from irbis.models import get_entry
    >>> preprocess_rgb(np.zeros((300, 400, 3), np.uint8), get_entry("efficientnet_lite0").preprocessing).shape
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
                             f"{image.shape[1]}; resize_to must be at least the input size")
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
