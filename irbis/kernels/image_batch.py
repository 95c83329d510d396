"""Batch kernels over Spark image structs (dicts): the pure bodies of the image stages.

Each function takes a sequence of image structs (``None`` for a null image) and returns one result
per input, so a Spark stage only moves columns in and out.

Examples
--------
>>> import numpy as np
>>> from irbis.kernels.image import array_to_struct
>>> structs = [array_to_struct(np.arange(12, dtype=np.uint8).reshape(2, 2, 3)), None]
>>> [None if v is None else v.tolist() for v in unroll_images(structs)]
[[0.0, 3.0, 6.0, 9.0, 1.0, 4.0, 7.0, 10.0, 2.0, 5.0, 8.0, 11.0], None]
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from irbis.kernels.image import DEFAULT_MAX_PIXELS, array_to_struct, decode_image, struct_to_array
from irbis.kernels.image_chain import ImageChain
from irbis.kernels.image_ops import ImageOpError, flip, to_chw

__all__ = ["AUGMENTATIONS", "OUTPUT_FORMATS", "augment_images", "transform_images", "unroll_images"]

#: What :func:`transform_images` returns per image.
OUTPUT_FORMATS = ("image", "array", "vector")
#: Augmentations of :func:`augment_images`, by name: OpenCV flip code.
AUGMENTATIONS = {"flipLeftRight": 1, "flipUpDown": 0}


def _origin(struct: Any) -> str:
    try:
        return str(struct["origin"] or "")
    except (KeyError, TypeError):
        return ""


def transform_images(images: Sequence[Any], chain: ImageChain, output: str = "image",
                     raise_errors: bool = True, max_pixels: int | None = DEFAULT_MAX_PIXELS
                     ) -> tuple[list[Any], list[str | None]]:
    """Apply ``chain`` to each image struct (or encoded file, decoded in the same pass).

    Parameters
    ----------
    images : sequence of dict, bytes or None
        Spark image structs (BGR data) or encoded files; ``None`` gives ``None``.
    chain : ImageChain
        The operations, applied in one pass per image.
    output : {"image", "array", "vector"}
        ``"image"`` a struct (float images get an OpenCV float mode); ``"array"``/``"vector"`` the
        pixels as a flat float32 array in CHW order.
    raise_errors : bool
        Raise :class:`ImageOpError` (naming the image's origin) on the first failing image; with
        ``False`` the image gives ``None`` and its error message.
    max_pixels : int or None
        Pixel limit when decoding encoded files.

    Returns
    -------
    outputs, errors : list, list of str or None
    """
    if output not in OUTPUT_FORMATS:
        raise ValueError(f"output must be one of {OUTPUT_FORMATS}, found {output!r}")
    outputs: list[Any] = []
    errors: list[str | None] = []
    for struct in images:
        if struct is None:
            outputs.append(None)
            errors.append(None)
            continue
        try:
            encoded = isinstance(struct, (bytes, bytearray, memoryview))
            img = chain(decode_image(struct, max_pixels) if encoded else struct_to_array(struct))
        except (ImageOpError, ValueError) as exc:
            origin = _origin(struct)
            message = f"image {origin!r}: {exc}" if origin else str(exc)
            if raise_errors:
                raise ImageOpError(message) from None
            outputs.append(None)
            errors.append(message)
            continue
        outputs.append(array_to_struct(img, _origin(struct)) if output == "image"
                       else to_chw(img).reshape(-1))
        errors.append(None)
    return outputs, errors


def unroll_images(images: Sequence[Any], dtype: type = np.float64) -> list[np.ndarray | None]:
    """Flatten each image struct into a vector in CHW order (channels in the struct's order)."""
    return [None if s is None else to_chw(struct_to_array(s), dtype).reshape(-1) for s in images]


def augment_images(images: Sequence[Any], augmentations: Sequence[str]
                   ) -> list[list[tuple[str, Any]]]:
    """Return, per image, the original and one flipped copy per augmentation.

    Each entry is a list of ``(variant, struct)`` pairs starting with ``("original", struct)``;
    a null image gives ``[("original", None)]`` so that its row is kept once.
    """
    unknown = [a for a in augmentations if a not in AUGMENTATIONS]
    if unknown:
        raise ValueError(f"unknown augmentations {unknown}; expected some of {list(AUGMENTATIONS)}")
    result = []
    for struct in images:
        variants: list[tuple[str, Any]] = [("original", struct)]
        if struct is not None:
            img = struct_to_array(struct)
            for name in augmentations:
                variants.append((name, array_to_struct(flip(img, AUGMENTATIONS[name]), _origin(struct))))
        result.append(variants)
    return result
