"""How an RGB uint8 photo becomes a model's input tensor: the catalogue's ``Preprocessing`` record,
and the pixel vocabulary (colour formats, interpolations) that the image operations speak too.

The reference preprocessing for ImageNet models: resize the shorter side to ``resize_to`` (keeping the
aspect ratio, the longer side truncated as torchvision does), crop the centre ``input_size``, convert to
the model's colour order, subtract ``mean`` and divide by ``std`` (0..255 units), and lay out as CHW.
This module only describes it (plain data, no OpenCV); :func:`irbis.kernels.image.network_input.preprocess_rgb`
does it with the image operations of :mod:`irbis.kernels.image.ops`, the ones ``ImageTransformer`` uses,
so a chain ``resize(resize_to, resize_to, keepAspectRatio=True)``, ``centerCrop``, ``colorFormat``,
``normalize`` gives exactly the same tensor as a catalogue entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

#: Channel orders of an image, and each one's channel count (OpenCV's names; OpenCV decodes to BGR).
COLOR_FORMATS = {"BGR": 3, "RGB": 3, "GRAY": 1, "BGRA": 4, "RGBA": 4}
#: The colour formats a network input may have (a catalogue entry's ``color_order``).
COLOR_ORDERS = ("RGB", "BGR", "GRAY")
#: Resampling filters by name (each one an OpenCV interpolation flag in the image operations).
INTERPOLATIONS = ("nearest", "linear", "bilinear", "cubic", "bicubic", "area", "lanczos")


@dataclass(frozen=True)
class Preprocessing:
    """How an RGB uint8 image becomes the network input: one part of a catalogue entry.

    The shorter side is resized to ``resize_to`` and the centre ``input_size`` (H, W) cropped; with
    ``resize_to=None`` the image is resized straight to ``input_size``. Then ``(x - mean) / std`` per
    channel, with mean and std in 0..255 pixel units, in ``color_order`` ("RGB", "BGR" or "GRAY").
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
        """Number of input channels (1 for "GRAY", else 3)."""
        return COLOR_FORMATS[self.color_order]

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
