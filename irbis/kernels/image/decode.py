"""Image decoding and the Spark image struct, as pure functions over numpy.

An image travels through Spark as a struct with Spark's own image schema:
``origin`` (str), ``height``, ``width``, ``nChannels``, ``mode`` (the OpenCV
type code, e.g. 16 = ``CV_8UC3``) and ``data`` (the pixels, row-major,
channels interleaved in BGR(A) order, native byte order for 16-bit and
float images).  Inside a kernel the same image is a ``(height, width,
channels)`` ndarray; single-channel images keep their channel axis.

The operations (resize, crop, flip, ...) live in :mod:`irbis.kernels.image.ops`
and the chain that applies several of them in one pass in
:mod:`irbis.kernels.image.op_chain`.

Examples
--------
>>> import cv2, numpy as np
>>> ok, buf = cv2.imencode(".png", np.zeros((4, 6, 3), np.uint8))
>>> img = decode_image(buf.tobytes())
>>> img.shape
(4, 6, 3)
>>> array_to_struct(img, origin="a.png")["mode"]
16
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from irbis.extras import optional
from irbis.kernels.image.header import header_size, sniff_format
from irbis.kernels.image.ops import as_hwc

cv2 = optional("cv2", "images")  # OpenCV, imported on first use

__all__ = [
    "DEFAULT_MAX_PIXELS", "IMAGE_FIELDS", "ImageDecodeError", "array_to_struct", "decode_batch", "decode_image",
    "image_view", "ocv_mode", "struct_to_array",
]

#: Images larger than this many pixels are refused before decoding.
DEFAULT_MAX_PIXELS = 100_000_000

#: Field names of Spark's image struct, in schema order.
IMAGE_FIELDS = ("origin", "height", "width", "nChannels", "mode", "data")

# OpenCV depth codes: mode = depth + 8 * (channels - 1).
_DEPTHS: dict[np.dtype, int] = {np.dtype(np.uint8): 0, np.dtype(np.int8): 1, np.dtype(np.uint16): 2,
           np.dtype(np.int16): 3, np.dtype(np.int32): 4, np.dtype(np.float32): 5,
           np.dtype(np.float64): 6}
_DTYPES: dict[int, np.dtype] = {code: dtype for dtype, code in _DEPTHS.items()}


class ImageDecodeError(ValueError):
    """Raised when encoded bytes cannot be turned into an image."""


def ocv_mode(dtype: np.dtype | type, channels: int) -> int:
    """Return the OpenCV type code (Spark's ``mode``) for a dtype and channel count.

    >>> ocv_mode(np.uint8, 3), ocv_mode(np.uint16, 1), ocv_mode(np.float32, 3)
    (16, 2, 21)
    """
    dtype = np.dtype(dtype)
    if dtype not in _DEPTHS:
        raise TypeError(f"image dtype {dtype} has no OpenCV type; expected one of "
                        f"{sorted(str(d) for d in _DEPTHS)}")
    if not 1 <= channels <= 4:
        raise ValueError(f"image channels must be 1-4, found {channels}")
    return _DEPTHS[dtype] + 8 * (channels - 1)


def array_to_struct(img: np.ndarray, origin: str = "") -> dict[str, Any]:
    """Pack a ``(H, W[, C])`` ndarray into a Spark image struct (a dict).

    The channel order is not changed: pass BGR(A) pixels to match Spark's
    image source.
    """
    img = as_hwc(np.asarray(img))
    if img.ndim != 3:
        raise ValueError(f"image array must have shape (H, W) or (H, W, C), found {img.shape}")
    height, width, channels = img.shape
    return {"origin": origin, "height": int(height), "width": int(width),
            "nChannels": int(channels), "mode": ocv_mode(img.dtype, channels),
            "data": np.ascontiguousarray(img).tobytes()}


def struct_to_array(image: Any) -> np.ndarray:
    """Unpack a Spark image struct (dict, Row or pandas Series) into an ``(H, W, C)`` ndarray.

    The result is a read-only view on the struct's bytes; copy it before
    writing in place.
    """
    get = image.__getitem__
    height, width, channels, mode = (int(get(k)) for k in ("height", "width", "nChannels", "mode"))
    return image_view(get("data"), height, width, channels, mode, get("origin"))


def image_view(data: Any, height: int, width: int, channels: int, mode: int,
               origin: str | None = "") -> np.ndarray:
    """The pixels of one image struct as an ``(H, W, C)`` view on ``data`` (bytes or a buffer slice).

    Raises ``ValueError`` naming the image when the fields disagree with each other or with the
    number of bytes.
    """
    depth = mode & 7
    if depth not in _DTYPES or (mode >> 3) + 1 != channels:
        raise ValueError(f"image {origin!r}: mode {mode} does not match nChannels "
                         f"{channels}; expected mode = depth + 8 * (nChannels - 1)")
    dtype = _DTYPES[depth]
    expected = height * width * channels * dtype.itemsize
    if len(data) != expected:
        raise ValueError(f"image {origin!r}: data has {len(data)} bytes, expected "
                         f"{expected} for {height}x{width}x{channels} {dtype}")
    return np.frombuffer(data, dtype=dtype).reshape(height, width, channels)


def decode_image(data: bytes | bytearray | memoryview, max_pixels: int | None = DEFAULT_MAX_PIXELS,
                 flags: int = -1) -> np.ndarray:
    """Decode encoded image bytes with OpenCV into an ``(H, W, C)`` ndarray.

    Grey, colour (BGR), alpha (BGRA) and 16-bit images keep their channels
    and depth (``IMREAD_UNCHANGED``).  The size declared in the header is
    checked against ``max_pixels`` before any pixel is decoded.

    Parameters
    ----------
    data : bytes
        The encoded file (JPEG, PNG, BMP, TIFF, WebP, ... as OpenCV reads).
    max_pixels : int or None
        Refuse images with more pixels than this; ``None`` for no limit.
    flags : int
        OpenCV ``imread`` flags.

    Raises
    ------
    ImageDecodeError
        For empty, truncated, unknown or oversized input.
    """
    if data is None or len(data) == 0:
        raise ImageDecodeError("empty input (0 bytes): not an image")
    size = header_size(data)
    if size is not None:
        _check_pixels(size, max_pixels, "header declares")
    buf = np.frombuffer(data, dtype=np.uint8)
    try:
        img = cv2.imdecode(buf, flags)
    except cv2.error as exc:
        raise ImageDecodeError(f"OpenCV could not decode {len(data)} bytes: "
                               f"{str(exc).strip().splitlines()[-1]}") from None
    if img is None:
        fmt = sniff_format(data)
        what = f"corrupt or truncated {fmt} data" if fmt else "unknown format, not an image"
        raise ImageDecodeError(f"OpenCV could not decode {len(data)} bytes: {what}")
    img = as_hwc(img)
    _check_pixels(img.shape[:2], max_pixels, "decoded image has")
    return img


def _check_pixels(size: Sequence[int], max_pixels: int | None, what: str) -> None:
    height, width = int(size[0]), int(size[1])
    if max_pixels is not None and height * width > max_pixels:
        raise ImageDecodeError(f"{what} {height}x{width} = {height * width} pixels, over the "
                               f"limit of {max_pixels}; raise maxPixels to accept it")
    if height <= 0 or width <= 0:
        raise ImageDecodeError(f"{what} an empty size {height}x{width}")


def decode_batch(contents: Sequence[Any], max_pixels: int | None = DEFAULT_MAX_PIXELS
                 ) -> tuple[list[np.ndarray | None], list[str | None]]:
    """Decode many encoded images (bytes, buffer slices or ``None``) into arrays, never raising.

    Returns
    -------
    images : list of ndarray or None
        One ``(H, W, C)`` array per input, ``None`` where decoding failed or the input was null.
    errors : list of str or None
        ``None`` where decoding worked (or the input was null), otherwise a readable reason.
    """
    images: list[np.ndarray | None] = [None] * len(contents)
    errors: list[str | None] = [None] * len(contents)
    for i in range(len(contents)):
        data = contents[i]
        if data is None:
            continue
        try:
            images[i] = decode_image(data, max_pixels)
        except ImageDecodeError as exc:
            errors[i] = str(exc)
    return images, errors
