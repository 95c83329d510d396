"""Image operations as pure functions over ``(H, W, C)`` ndarrays (OpenCV underneath).

Every function takes an image with a channel axis and returns a new one with
a channel axis (OpenCV drops the axis of single-channel images; we put it
back).  Arguments are checked before OpenCV sees them; an operation that
cannot apply raises :class:`ImageOpError` naming the operation, the image
size and the arguments.  :class:`irbis.kernels.image.op_chain.ImageChain` applies
a JSON list of these operations in one pass.

Examples
--------
>>> import numpy as np
>>> img = np.zeros((100, 80, 3), np.uint8)
>>> resize(img, 256, 256, keep_aspect_ratio=True).shape    # shorter side to 256
(320, 256, 3)
>>> center_crop(resize(img, 50, 40), 32, 32).shape
(32, 32, 3)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from irbis.extras import optional
from irbis.models import preprocess as _vocabulary

cv2 = optional("cv2", "images")  # OpenCV, imported on first use

__all__ = [
    "COLOR_FORMATS", "INTERPOLATIONS", "THRESHOLD_TYPES", "ImageOpError", "as_hwc", "blur", "center_crop",
    "color_format", "crop", "describe", "flip", "normalize", "resize", "threshold", "to_chw",
]

#: OpenCV's flags by value (cv2.INTER_*, cv2.THRESH_*: stable across its releases; a test compares them with
#: cv2's own), so that the vocabularies are known without importing OpenCV
_OPENCV_FLAGS = {"nearest": 0, "linear": 1, "bilinear": 1, "cubic": 2, "bicubic": 2, "area": 3, "lanczos": 4}
#: The interpolations the catalogue names (:data:`irbis.models.preprocess.INTERPOLATIONS`), as OpenCV flags.
INTERPOLATIONS = {name: _OPENCV_FLAGS[name] for name in _vocabulary.INTERPOLATIONS}
THRESHOLD_TYPES = {"binary": 0, "binary_inv": 1, "trunc": 2, "tozero": 3, "tozero_inv": 4}
#: Colour formats and their channel counts: the one vocabulary, :data:`irbis.models.preprocess.COLOR_FORMATS`.
COLOR_FORMATS = tuple(_vocabulary.COLOR_FORMATS)
_CHANNELS = _vocabulary.COLOR_FORMATS


class ImageOpError(ValueError):
    """An image operation that cannot apply to the given image or arguments."""


def describe(img: np.ndarray) -> str:
    """Short size description used in error messages, e.g. ``'480x640x3 uint8'``."""
    shape = "x".join(str(s) for s in img.shape)
    return f"{shape} {img.dtype}"


def _fail(op: str, img: np.ndarray | None, args: dict, reason: str) -> ImageOpError:
    call = f"{op}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    where = f" on a {describe(img)} image" if img is not None else ""
    return ImageOpError(f"{call}{where}: {reason}")


def as_hwc(img: np.ndarray) -> np.ndarray:
    """The image with its channel axis: ``(H, W)`` becomes ``(H, W, 1)`` (a view); others as they are."""
    return img[:, :, None] if img.ndim == 2 else img


def _positive(op: str, img: np.ndarray | None, args: dict, *names: str) -> None:
    for name in names:
        value = args[name]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise _fail(op, img, args, f"{name} must be a positive integer, found {value!r}")


def _choice(op: str, img: np.ndarray | None, args: dict, name: str, table) -> None:
    if args[name] not in table:
        raise _fail(op, img, args, f"unknown {name} {args[name]!r}; expected one of {sorted(table)}")


def resize(img: np.ndarray, height: int, width: int, keep_aspect_ratio: bool = False,
           interpolation: str = "linear") -> np.ndarray:
    """Resize to ``height`` x ``width``.

    With ``keep_aspect_ratio=True`` the image is scaled by one factor so that
    it covers the ``height`` x ``width`` box: ``resize(img, 256, 256, True)``
    makes the shorter side 256 (follow it with :func:`center_crop`). The side
    that sets the factor gets its size exactly; the other is truncated, as
    torchvision's ``Resize`` does and as the model cards' preprocessing uses.
    """
    args = {"height": height, "width": width, "keep_aspect_ratio": keep_aspect_ratio,
            "interpolation": interpolation}
    _positive("resize", img, args, "height", "width")
    _choice("resize", img, args, "interpolation", INTERPOLATIONS)
    height, width = resized_size(img.shape[0], img.shape[1], height, width, keep_aspect_ratio)
    if (height, width) == img.shape[:2]:
        return img
    return as_hwc(cv2.resize(img, (width, height), interpolation=INTERPOLATIONS[interpolation]))


def resized_size(h: int, w: int, height: int, width: int, keep_aspect_ratio: bool = False) -> tuple[int, int]:
    """The size :func:`resize` gives an ``h`` x ``w`` image asked for ``height`` x ``width``."""
    if keep_aspect_ratio:
        if height / h >= width / w:
            width = max(width, int(height * w / h))
        else:
            height = max(height, int(width * h / w))
    return height, width


def center_offsets(h: int, w: int, height: int, width: int) -> tuple[int, int]:
    """The top row and left column of :func:`center_crop`'s ``height`` x ``width`` window in ``h`` x ``w``."""
    return int(round((h - height) / 2.0)), int(round((w - width) / 2.0))


def crop(img: np.ndarray, x: int, y: int, height: int, width: int) -> np.ndarray:
    """Cut the ``height`` x ``width`` window whose top-left corner is column ``x``, row ``y``."""
    args = {"x": x, "y": y, "height": height, "width": width}
    _positive("crop", img, args, "height", "width")
    if x < 0 or y < 0 or x + width > img.shape[1] or y + height > img.shape[0]:
        raise _fail("crop", img, args, f"the window x {x}..{x + width}, y {y}..{y + height} "
                    f"falls outside the image (width {img.shape[1]}, height {img.shape[0]})")
    return img[y:y + height, x:x + width]


def center_crop(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Cut the central ``height`` x ``width`` window."""
    args = {"height": height, "width": width}
    _positive("center_crop", img, args, "height", "width")
    if height > img.shape[0] or width > img.shape[1]:
        raise _fail("center_crop", img, args, "the window is larger than the image; "
                    "resize first (resize with keep_aspect_ratio=True covers the window)")
    top, left = center_offsets(img.shape[0], img.shape[1], height, width)
    return img[top:top + height, left:left + width]


def flip(img: np.ndarray, flip_code: int = 1) -> np.ndarray:
    """Mirror the image: 1 left-right, 0 up-down, -1 both (OpenCV's codes)."""
    if flip_code not in (-1, 0, 1) or isinstance(flip_code, bool):
        raise _fail("flip", img, {"flip_code": flip_code},
                    "flip_code must be 1 (left-right), 0 (up-down) or -1 (both)")
    return as_hwc(cv2.flip(img, int(flip_code)))


def blur(img: np.ndarray, height: int, width: int, sigma: float = 0.0) -> np.ndarray:
    """Gaussian blur with a ``height`` x ``width`` kernel (odd sizes; sigma 0 = from the size)."""
    args = {"height": height, "width": width, "sigma": sigma}
    _positive("blur", img, args, "height", "width")
    if height % 2 == 0 or width % 2 == 0:
        raise _fail("blur", img, args, "the kernel height and width must be odd")
    return as_hwc(cv2.GaussianBlur(img, (int(width), int(height)), float(sigma)))


def threshold(img: np.ndarray, threshold: float, max_val: float, type: str = "binary") -> np.ndarray:
    """Apply an OpenCV fixed-level threshold per channel (``type`` one of THRESHOLD_TYPES)."""
    args = {"threshold": threshold, "max_val": max_val, "type": type}
    _choice("threshold", img, args, "type", THRESHOLD_TYPES)
    _, out = cv2.threshold(img, float(threshold), float(max_val), THRESHOLD_TYPES[type])
    return as_hwc(out)


def color_format(img: np.ndarray, format: str, source: str | None = None) -> np.ndarray:
    """Convert between BGR, RGB, GRAY, BGRA and RGBA.

    ``source`` is the current channel order; by default it is inferred from
    the channel count (1 GRAY, 3 BGR, 4 BGRA), as images come from OpenCV.
    """
    source = source or {1: "GRAY", 3: "BGR", 4: "BGRA"}.get(img.shape[2], "?")
    args = {"format": format, "source": source}
    _choice("color_format", img, args, "format", COLOR_FORMATS)
    _choice("color_format", img, args, "source", COLOR_FORMATS)
    if img.shape[2] != _CHANNELS[source]:
        raise _fail("color_format", img, args,
                    f"source {source} needs {_CHANNELS[source]} channels, found {img.shape[2]}")
    if source == format:
        return img
    code = getattr(cv2, f"COLOR_{source}2{format}", None)
    if code is None:  # e.g. RGB2RGBA is spelled via the BGR codes on swapped data
        code = getattr(cv2, f"COLOR_{source.replace('RGB', 'BGR')}2{format.replace('RGB', 'BGR')}")
    return as_hwc(cv2.cvtColor(img, code))


def normalize(img: np.ndarray, mean: float | Sequence[float], std: float | Sequence[float],
              color_scale_factor: float = 1.0) -> np.ndarray:
    """Return float32 ``(img * color_scale_factor - mean) / std`` per channel.

    ``mean`` and ``std`` are scalars or one value per channel, in the units
    after scaling (e.g. ``color_scale_factor=1/255`` with ImageNet's 0..1
    mean, or 1.0 with mean 127, std 128 in 0..255 units).
    """
    channels = img.shape[2]
    args = {"mean": mean, "std": std, "color_scale_factor": color_scale_factor}
    stats = []
    for name in ("mean", "std"):
        value = np.asarray(args[name], dtype=np.float32).reshape(-1)
        if value.size not in (1, channels):
            raise _fail("normalize", img, args,
                        f"{name} needs 1 or {channels} values, found {value.size}")
        stats.append(value)
    if np.any(stats[1] == 0):
        raise _fail("normalize", img, args, "std must not contain 0")
    out = img.astype(np.float32) * np.float32(color_scale_factor)
    out -= stats[0]
    out /= stats[1]
    return out


def to_chw(img: np.ndarray, dtype: type = np.float32) -> np.ndarray:
    """Reorder ``(H, W, C)`` to a contiguous ``(C, H, W)`` array of ``dtype``."""
    return np.ascontiguousarray(as_hwc(img).transpose(2, 0, 1), dtype=dtype)
