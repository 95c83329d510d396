"""Batch kernels over images: the pure bodies of the image stages.

Each function takes an indexable column of images (an :class:`irbis.kernels.blocks.Images` block,
``(H, W, C)`` arrays, Spark image structs or encoded files; ``None`` for a null image) and returns one
result per input, so a Spark stage only moves columns in and out.

Examples
--------
>>> import numpy as np
>>> from irbis.kernels.image.decode import array_to_struct
>>> images = [np.arange(12, dtype=np.uint8).reshape(2, 2, 3), None]
>>> [None if v is None else v.tolist() for v in unroll_images(images)]
[[0.0, 3.0, 6.0, 9.0, 1.0, 4.0, 7.0, 10.0, 2.0, 5.0, 8.0, 11.0], None]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, cast

import numpy as np

from irbis.extras import optional
from irbis.kernels.blocks import Images, stack_rows
from irbis.kernels.image.decode import DEFAULT_MAX_PIXELS, decode_batch, decode_image, struct_to_array
from irbis.kernels.image.op_chain import ImageChain
from irbis.kernels.image.ops import ImageOpError, as_hwc, flip, to_chw

cv2 = optional("cv2", "images")  # OpenCV, imported on first use

__all__ = [
    "AUGMENTATIONS", "OUTPUT_FORMATS", "DecodeKernel", "TransformKernel", "UnrollKernel", "augment_images",
    "pixels_of", "transform_images", "unroll_images",
]

#: What :func:`transform_images` returns per image.
OUTPUT_FORMATS = ("image", "array", "vector")
#: Augmentations of :func:`augment_images`, by name: OpenCV flip code.
AUGMENTATIONS = {"flipLeftRight": 1, "flipUpDown": 0}


def _origin(value: Any) -> str:
    try:
        return str(value["origin"] or "") if isinstance(value, dict) else ""
    except KeyError:
        return ""


def pixels_of(value: Any, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """An image cell as an ``(H, W, C)`` array: encoded bytes are decoded, structs unpacked."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return decode_image(value, max_pixels)
    return value if isinstance(value, np.ndarray) else struct_to_array(value)


def transform_images(images: Sequence[Any], chain: ImageChain, output: str = "image",
                     raise_errors: bool = True, max_pixels: int | None = DEFAULT_MAX_PIXELS,
                     origins: Sequence[str | None] | None = None
                     ) -> tuple[list[np.ndarray | None], list[str | None]]:
    """Apply ``chain`` to each image (or encoded file, decoded in the same pass).

    Parameters
    ----------
    images : indexable of ndarray, dict, bytes or None
        An :class:`irbis.kernels.blocks.Images` or ``Binary`` block, ``(H, W, C)`` BGR arrays,
        Spark image structs or encoded files; ``None`` gives ``None``.
    chain : ImageChain
        The operations, applied in one pass per image.
    output : {"image", "array", "vector"}
        ``"image"`` the ``(H, W, C)`` result; ``"array"``/``"vector"`` the pixels as a flat float32
        array in CHW order.
    raise_errors : bool
        Raise :class:`ImageOpError` (naming the image's origin) on the first failing image; with
        ``False`` the image gives ``None`` and its error message.
    max_pixels : int or None
        Pixel limit when decoding encoded files.
    origins : sequence of str, optional
        Names of the images for error messages (a struct's own ``origin`` otherwise).

    Returns
    -------
    outputs, errors : list, list of str or None
    """
    if output not in OUTPUT_FORMATS:
        raise ValueError(f"output must be one of {OUTPUT_FORMATS}, found {output!r}")
    outputs: list[np.ndarray | None] = [None] * len(images)
    errors: list[str | None] = [None] * len(images)
    for i in range(len(images)):
        value = None
        try:
            value = images[i]
            if value is None:
                continue
            img = chain(pixels_of(value, max_pixels))
        except (ImageOpError, ValueError) as exc:
            origin = (origins[i] if origins is not None else _origin(value)) or ""
            message = f"image {origin!r}: {exc}" if origin else str(exc)
            if raise_errors:
                raise ImageOpError(message) from None
            errors[i] = message
            continue
        outputs[i] = img if output == "image" else to_chw(img).reshape(-1)
    return outputs, errors


def unroll_images(images: Sequence[Any], dtype: type = np.float64) -> list[np.ndarray | None]:
    """Flatten each image into a vector in CHW order (channels in the image's order)."""
    return [None if images[i] is None else to_chw(pixels_of(images[i]), dtype).reshape(-1)
            for i in range(len(images))]


def augment_images(images: Sequence[Any], augmentations: Sequence[str], *, crop: float = 0.0,
                   exposure: float = 1.0) -> list[list[tuple[str, np.ndarray | None]]]:
    """Return, per image, the original and one copy per augmentation, as arrays.

    Each entry is a list of ``(variant, image)`` pairs starting with ``("original", image)``, then one
    flipped copy per name of ``augmentations``, then (when ``crop`` > 0) a ``"crop"`` copy: the central
    ``crop`` share of the height and width, resized back to the image's size (a closer view), then
    (when ``exposure`` != 1) an ``"exposure"`` copy with the pixel values times ``exposure``
    (a darker or brighter shot). A null image gives ``[("original", None)]`` so that its row is kept once.
    """
    unknown = [a for a in augmentations if a not in AUGMENTATIONS]
    if unknown:
        raise ValueError(f"unknown augmentations {unknown}; expected some of {list(AUGMENTATIONS)}")
    if not 0.0 <= crop < 1.0 or exposure <= 0.0:
        raise ValueError(f"crop must be in [0, 1) and exposure > 0, found crop={crop}, exposure={exposure}")
    result: list[list[tuple[str, np.ndarray | None]]] = []
    for i in range(len(images)):
        if images[i] is None:
            result.append([("original", None)])
            continue
        img = pixels_of(images[i])
        copies: list[tuple[str, np.ndarray | None]] = [("original", img)]
        copies += [(name, flip(img, AUGMENTATIONS[name])) for name in augmentations]
        if crop > 0.0:
            copies.append(("crop", _central_crop(img, crop)))
        if exposure != 1.0:
            copies.append(("exposure", as_hwc(np.clip(img * np.float32(exposure), 0, 255).astype(img.dtype))))
        result.append(copies)
    return result


def _central_crop(img: np.ndarray, share: float) -> np.ndarray:
    h, w = img.shape[:2]
    ch, cw = max(int(round(h * share)), 1), max(int(round(w * share)), 1)
    y, x = (h - ch) // 2, (w - cw) // 2
    return as_hwc(cv2.resize(img[y:y + ch, x:x + cw], (w, h), interpolation=cv2.INTER_LINEAR))


# -- the image stages' kernels: plain values the Spark runner ships (no closure over a stage) -------------
@dataclass(frozen=True)
class DecodeKernel:
    """ImageDecoder's kernel: the encoded files of ``column`` decoded (at most ``max_pixels``) into
    ``output`` as images, each with its ``origin_col`` value; a file that does not decode gets a null and,
    with ``error_col``, its reason."""

    column: str
    output: str
    origin_col: str = ""
    error_col: str = ""
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        images, errors = decode_batch(blocks[self.column], self.max_pixels)
        origins = blocks[self.origin_col] if self.origin_col else None
        out = {self.output: Images.from_arrays(images, origins)}
        return {**out, self.error_col: errors} if self.error_col else out


@dataclass(frozen=True)
class TransformKernel:
    """ImageTransformer's kernel: the images of ``column`` through ``chain``, into ``output`` as ``fmt`` says
    (:data:`OUTPUT_FORMATS`); with ``error_col`` an image the chain refuses gets a null and its reason, else
    the batch fails."""

    column: str
    output: str
    chain: ImageChain
    fmt: str = "image"
    error_col: str = ""

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        images = blocks[self.column]
        origins = cast(Sequence["str | None"], images.origin) if isinstance(images, Images) else None
        values, errors = transform_images(images, self.chain, self.fmt, not self.error_col,
                                          origins=origins)
        out = {self.output: Images.from_arrays(values, origins) if self.fmt == "image" else stack_rows(values)}
        return {**out, self.error_col: errors} if self.error_col else out


@dataclass(frozen=True)
class UnrollKernel:
    """UnrollImage's kernel: each image of ``column`` as one flat row of doubles (CHW order) in ``output``."""

    column: str
    output: str

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        return {self.output: stack_rows(unroll_images(blocks[self.column]))}
