"""Images (Spark image structs or encoded bytes) to a network's input batch, as a model's preprocessing says.

The body of :class:`irbis.ml.ImageFeaturizer` before the network: decode (for bytes), convert the
BGR(A)/grey pixels of any depth to RGB uint8, then :func:`preprocess_rgb` (resize the shorter side,
centre crop, colour order, mean/std, CHW, as the catalogue's
:class:`~irbis.models.preprocess.Preprocessing` record says), writing straight into one float32 batch.

Examples
--------
>>> import numpy as np
>>> from irbis.models import get_entry
>>> from irbis.kernels.image.decode import array_to_struct
>>> batch, valid, errors = preprocess_images(
...     [array_to_struct(np.zeros((300, 400, 3), np.uint8)), None], get_entry("efficientnet_lite0").preprocessing)
>>> batch.shape, valid.tolist(), errors
((1, 3, 224, 224), [True, False], [None, None])
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from irbis.extras import optional
from irbis.kernels.blocks import Binary, Prepared
from irbis.kernels.image.decode import DEFAULT_MAX_PIXELS, ImageDecodeError, decode_image, struct_to_array
from irbis.kernels.image.header import header_size, sniff_format
from irbis.kernels.image.ops import (
    INTERPOLATIONS,
    as_hwc,
    center_crop,
    center_offsets,
    color_format,
    normalize,
    resize,
    resized_size,
    to_chw,
)
from irbis.models.preprocess import Preprocessing

cv2 = optional("cv2", "images")  # OpenCV, imported on first use

__all__ = ["decode_flags", "finish_rgb", "fit_geometry", "image_batch", "load_rgb", "preprocess_images",
           "preprocess_rgb", "to_rgb8"]

#: cv2.IMREAD_REDUCED_COLOR_* and cv2.IMREAD_REDUCED_GRAYSCALE_* by value (a test compares them with cv2's)
_REDUCED = {False: {2: 17, 4: 33, 8: 65}, True: {2: 16, 4: 32, 8: 64}}


def decode_flags(data: bytes, spec: Preprocessing, grey: bool, fast: bool) -> int:
    """OpenCV ``imdecode`` flags for a model input.

    With ``fast``, a JPEG at least 2, 4 or 8 times larger than the size the spec resizes to is
    decoded at that fraction of its size (libjpeg scales in the DCT, which is several times
    faster than a full decode and anti-aliases); the result then goes through the spec's resize.
    """
    full = cv2.IMREAD_GRAYSCALE if grey else cv2.IMREAD_COLOR
    size = header_size(data) if fast and sniff_format(data) == "jpeg" else None
    if size is None:
        return full
    height, width = size
    for factor in (8, 4, 2):
        if spec.resize_to is not None:
            fits = min(height, width) / factor >= spec.resize_to
        else:
            fits = height / factor >= spec.input_size[0] and width / factor >= spec.input_size[1]
        if fits:
            return _REDUCED[grey][factor]
    return full


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


def load_rgb(value: Any, spec: Preprocessing, encoded: bool, max_pixels: int | None = DEFAULT_MAX_PIXELS,
             fast: bool = False) -> np.ndarray:
    """One row's pixels as RGB (or grey) uint8: encoded bytes decoded, a struct or array converted."""
    if encoded:
        flags = decode_flags(value, spec, spec.channels == 1, fast)
        return to_rgb8(decode_image(value, max_pixels, flags))
    return to_rgb8(value if isinstance(value, np.ndarray) else struct_to_array(value))


def preprocess_images(values: Sequence[Any], spec: Preprocessing, *, encoded: bool = False,
                      max_pixels: int | None = DEFAULT_MAX_PIXELS, raise_errors: bool = False,
                      fast_decode: bool = False) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Preprocess a column of images into one float32 batch of the model's input shape.

    Parameters
    ----------
    values : sequence (indexable) of images, dicts, bytes or None
        An :class:`irbis.kernels.blocks.Images` block or ``(H, W, C)`` arrays or Spark image structs
        (``encoded=False``); a :class:`irbis.kernels.blocks.Binary` block or bytes of encoded files
        (``encoded=True``). A row that cannot be read is reported alone.
    spec : Preprocessing
        Input size, resize, interpolation, colour order, mean and std.
    encoded : bool
        Whether ``values`` hold encoded bytes to decode first (in the same pass).
    max_pixels : int or None
        Pixel limit for decoding.
    raise_errors : bool
        Raise on the first bad image instead of reporting it.
    fast_decode : bool
        Decode large JPEGs at a reduced scale (see :func:`decode_flags`).

    Returns
    -------
    batch : ndarray, float32, shape (M, C, H, W)
        The M good rows, in order.
    valid : ndarray of bool, shape (len(values),)
        Which rows are in ``batch``.
    errors : list of str or None
        Why a non-null row could not be used (``None`` for good and for null rows).
    """
    batch = np.empty((len(values), *spec.input_shape), np.float32)
    valid = np.zeros(len(values), bool)
    errors: list[str | None] = [None] * len(values)
    count = 0
    for i in range(len(values)):
        try:
            value = values[i]
            if value is None:
                continue
            batch[count] = preprocess_rgb(load_rgb(value, spec, encoded, max_pixels, fast_decode), spec)
        except (ImageDecodeError, ValueError, TypeError, cv2.error) as exc:
            if raise_errors:
                raise
            errors[i] = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            continue
        valid[i] = True
        count += 1
    return batch[:count], valid, errors


def image_batch(values: Any, preprocessing: Any, raise_errors: bool, max_pixels: int | None = DEFAULT_MAX_PIXELS,
                fast_decode: bool = False) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """A column block of images as the network's batch: (batch, valid, errors) of
    :func:`preprocess_images`, the files decoded first where the block holds
    encoded ones; a :class:`~irbis.kernels.blocks.Prepared` block (LIME's masked samples) is already the
    network's input and is only checked against ``preprocessing``'s shape."""
    if isinstance(values, Prepared):
        if values.values.shape[1:] != tuple(preprocessing.input_shape):
            raise ValueError(f"prepared inputs of shape {values.values.shape[1:]}, the network takes "
                             f"{tuple(preprocessing.input_shape)}")
        return values.values, values.valid, [None] * len(values)
    return preprocess_images(values, preprocessing, encoded=isinstance(values, Binary), max_pixels=max_pixels,
                             raise_errors=raise_errors, fast_decode=fast_decode)


def preprocess_rgb(image: np.ndarray, spec: Preprocessing) -> np.ndarray:
    """Preprocess one RGB (or grey) uint8 image as ``spec`` (a model's preprocessing) prescribes.

    Parameters
    ----------
    image : numpy.ndarray
        uint8 array of shape (H, W, 3) in RGB order, or (H, W) / (H, W, 1) greyscale.
    spec : Preprocessing
        A catalogue entry's ``preprocessing``; supplies ``input_size``, ``resize_to``, ``interpolation``,
        ``color_order``, ``mean``, ``std``.

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
    return finish_rgb(fit_geometry(_check_image(image), spec), spec)


def fit_geometry(image: np.ndarray, spec: Preprocessing) -> np.ndarray:
    """The geometric half of :func:`preprocess_rgb`: resize (and centre-crop) an ``(H, W, C)`` uint8 image to
    the spec's input size."""
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
    return image


def finish_rgb(image: np.ndarray, spec: Preprocessing) -> np.ndarray:
    """The pixel half of :func:`preprocess_rgb`: an RGB (or grey) uint8 image of the input size to the
    network's colour order, mean/std-normalised, as float32 CHW."""
    source = "GRAY" if image.shape[2] == 1 else "RGB"
    return to_chw(normalize(color_format(image, spec.color_order, source), spec.mean, spec.std))


def geometry_matrices(height: int, width: int, spec: Preprocessing) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fit_geometry` of an ``height`` x ``width`` image as two matrices: ``rows`` (h, height) and
    ``cols`` (w, width), so that each channel ``x`` of a float image becomes ``rows @ x @ cols.T``.

    OpenCV resizes in two separable passes, so the matrices are the resize of identity matrices along one
    axis each, then the centre crop's rows.
    """
    out_h, out_w = spec.input_size
    flag = INTERPOLATIONS[spec.interpolation]
    if spec.resize_to is None:
        size, (top, left) = (out_h, out_w), (0, 0)
    else:
        size = resized_size(height, width, spec.resize_to, spec.resize_to, keep_aspect_ratio=True)
        top, left = center_offsets(*size, out_h, out_w)
    rows: np.ndarray = np.eye(height, dtype=np.float32)
    cols: np.ndarray = np.eye(width, dtype=np.float32)
    if size[0] != height:
        rows = cv2.resize(rows, (height, size[0]), interpolation=flag)
    if size[1] != width:
        cols = cv2.resize(cols, (size[1], width), interpolation=flag).T
    return np.ascontiguousarray(rows[top:top + out_h]), np.ascontiguousarray(cols[left:left + out_w])


def masked_inputs(image: np.ndarray, segments: np.ndarray, spec: Preprocessing) -> Callable[[np.ndarray], np.ndarray]:
    """The network's inputs for many copies of ``image`` whose superpixels are switched on or off (off:
    black), with the image preprocessed once instead of once per copy.

    Preprocessing is linear in the pixels: the geometry (:func:`fit_geometry`, as
    :func:`geometry_matrices`) and the pixel half (:func:`finish_rgb`: colour order, then
    ``(x - mean) / std``) up to its constant. So the input of a copy is that constant plus the sum, over
    the superpixels that are on, of each superpixel's own preprocessed contribution, which is non-zero
    only on and around the superpixel: it is computed once per image on the superpixel's bounding box
    and kept sparse. The returned function takes masks (S, F) of booleans, one column per superpixel of
    ``segments`` (H, W, labels 0..F-1), and gives the inputs (S, C, h, w) float32 with one sparse product.

    It equals preprocessing each masked full-size image up to the rounding of the resized image to 8 bits
    that the full path does (within half a level); an interpolation that overshoots 0..255 (bicubic at a
    sharp edge) is clipped to the same bounds. With a grey network input, clipping after the colour
    conversion instead of before can differ at such an edge.
    """
    from scipy import sparse
    from scipy.ndimage import find_objects

    rgb = _check_image(to_rgb8(image)).astype(np.float32)
    labels = np.asarray(segments)
    rows, cols = geometry_matrices(rgb.shape[0], rgb.shape[1], spec)
    channels, (out_h, out_w) = rgb.shape[2], spec.input_size
    off = finish_rgb(np.zeros((out_h, out_w, channels), np.float32), spec)  # (C', h, w): every superpixel off
    index = np.arange(off.size).reshape(off.shape)
    at, to, values = [], [], []
    for label, box in enumerate(find_objects(labels + 1)):
        if box is None:
            continue
        ys, xs = box
        r = np.flatnonzero(rows[:, ys].any(axis=1))
        c = np.flatnonzero(cols[:, xs].any(axis=1))
        if not len(r) or not len(c):  # cropped away
            continue
        rs, cs = slice(r[0], r[-1] + 1), slice(c[0], c[-1] + 1)
        part = np.where((labels[box] == label)[:, :, None], rgb[box], np.float32(0))
        block = np.einsum("ij,jkc,lk->ilc", rows[rs, ys], part, cols[cs, xs], optimize=True)
        linear = finish_rgb(np.ascontiguousarray(block, np.float32), spec) - off[:, rs, cs]
        found = np.flatnonzero(linear)
        at.append(index[:, rs, cs].reshape(-1)[found])
        to.append(np.full(len(found), label, np.int32))
        values.append(linear.reshape(-1)[found])
    count = int(labels.max()) + 1
    contributions = sparse.csr_matrix((np.concatenate(values), (np.concatenate(at), np.concatenate(to))),
                                      shape=(off.size, count), dtype=np.float32)  # (C'*h*w, F)

    # The 8-bit path clips a resize that overshoots 0..255: the same bounds, preprocessed.
    full = finish_rgb(np.full((out_h, out_w, channels), 255, np.float32), spec)
    low, high = np.minimum(off, full), np.maximum(off, full)

    def inputs(masks: np.ndarray) -> np.ndarray:
        on = np.asarray(masks, np.float32).T  # (F, S)
        out = np.asarray(contributions @ on).T.reshape(on.shape[1], *off.shape)
        out += off
        return np.clip(out, low, high, out=out)

    return inputs


def _check_image(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise TypeError(f"image must be uint8, found dtype {image.dtype}; convert 0..255 pixels to uint8")
    image = as_hwc(image)
    if image.ndim != 3 or image.shape[2] not in (1, 3):
        raise ValueError(f"image must have shape (H, W, 3), (H, W, 1) or (H, W), found {image.shape}")
    return image
