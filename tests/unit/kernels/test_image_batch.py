"""Batch kernels behind the image stages and the featurizer's preprocessing (no JVM)."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data as skdata

from irbis.kernels.image.batch import augment_images, transform_images, unroll_images
from irbis.kernels.image.decode import array_to_struct
from irbis.kernels.image.network_input import decode_flags, preprocess_images, preprocess_rgb, to_rgb8
from irbis.kernels.image.op_chain import ImageChain
from irbis.kernels.image.ops import ImageOpError
from irbis.models import get_entry

CAT_BGR = np.ascontiguousarray(skdata.chelsea()[:, :, ::-1])
CAT = array_to_struct(CAT_BGR, origin="cat.png")


def test_transform_images_outputs_struct_or_flat_chw():
    chain = ImageChain([{"op": "resize", "height": 8, "width": 6}, {"op": "color_format", "format": "RGB"}])
    expected = cv2.resize(CAT_BGR, (6, 8), interpolation=cv2.INTER_LINEAR)[:, :, ::-1]
    (img, none), errors = transform_images([CAT, None], chain, "image")
    assert none is None and errors == [None, None]
    np.testing.assert_array_equal(img, expected)
    (flat,), _ = transform_images([CAT], chain, "array")
    assert flat.dtype == np.float32 and flat.shape == (3 * 8 * 6,)
    np.testing.assert_array_equal(flat.reshape(3, 8, 6), expected.transpose(2, 0, 1))


def test_transform_images_errors_name_the_image_or_become_null():
    chain = ImageChain([{"op": "crop", "x": 400, "y": 0, "height": 10, "width": 100}])
    with pytest.raises(ImageOpError, match=r"image 'cat.png': crop\(x=400.*300x451x3 uint8"):
        transform_images([CAT], chain)
    outputs, errors = transform_images([CAT, None], chain, raise_errors=False)
    assert outputs == [None, None] and "falls outside the image" in errors[0] and errors[1] is None


def test_unroll_is_chw_order():
    img = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    (vec, none) = unroll_images([array_to_struct(img), None])
    np.testing.assert_array_equal(unroll_images([img])[0], vec)
    assert none is None and vec.dtype == np.float64
    np.testing.assert_array_equal(vec, img.transpose(2, 0, 1).reshape(-1))


def test_augment_emits_original_and_flips():
    rows = augment_images([CAT, None], ["flipLeftRight", "flipUpDown"])
    assert [v for v, _ in rows[0]] == ["original", "flipLeftRight", "flipUpDown"]
    np.testing.assert_array_equal(rows[0][1][1], CAT_BGR[:, ::-1])
    np.testing.assert_array_equal(rows[0][2][1], CAT_BGR[::-1])
    assert rows[1] == [("original", None)]
    with pytest.raises(ValueError, match="unknown augmentations"):
        augment_images([CAT], ["rotate"])


def test_augment_adds_a_closer_view_and_an_exposure_copy():
    rows = augment_images([CAT], ["flipLeftRight"], crop=0.5, exposure=0.5)[0]
    assert [v for v, _ in rows] == ["original", "flipLeftRight", "crop", "exposure"]
    crop, dark = rows[2][1], rows[3][1]
    assert crop.shape == CAT_BGR.shape and dark.shape == CAT_BGR.shape
    h, w = CAT_BGR.shape[:2]  # the crop's centre pixel is the original's centre pixel
    assert np.abs(crop[h // 2, w // 2].astype(int) - CAT_BGR[h // 2, w // 2].astype(int)).max() <= 12
    np.testing.assert_allclose(dark.astype(float), np.floor(CAT_BGR * 0.5), atol=1)
    with pytest.raises(ValueError, match="crop must be in"):
        augment_images([CAT], [], crop=1.0)


def test_to_rgb8_handles_depth_alpha_and_grey():
    np.testing.assert_array_equal(to_rgb8(CAT_BGR), CAT_BGR[:, :, ::-1])
    np.testing.assert_array_equal(to_rgb8((CAT_BGR.astype(np.uint16) * 257)), CAT_BGR[:, :, ::-1])
    bgra = np.dstack([CAT_BGR, np.zeros(CAT_BGR.shape[:2], np.uint8)])
    np.testing.assert_array_equal(to_rgb8(bgra), CAT_BGR[:, :, ::-1])
    assert to_rgb8(CAT_BGR[:, :, :1]).shape == (300, 451, 1)


def test_preprocess_images_structs_and_bytes_agree_with_the_spec():
    spec = get_entry("efficientnet_lite0").preprocessing
    png = cv2.imencode(".png", CAT_BGR)[1].tobytes()
    from_struct, valid, errors = preprocess_images([None, CAT], spec)
    from_bytes, valid_b, errors_b = preprocess_images([png, b"junk", None], spec, encoded=True)
    reference = preprocess_rgb(CAT_BGR[:, :, ::-1], spec)
    assert valid.tolist() == [False, True] and errors == [None, None]
    assert valid_b.tolist() == [True, False, False] and "not an image" in errors_b[1]
    np.testing.assert_array_equal(from_struct[0], reference)
    np.testing.assert_array_equal(from_bytes[0], reference)
    with pytest.raises(ValueError, match="not an image"):
        preprocess_images([b"junk"], spec, encoded=True, raise_errors=True)


def test_transform_images_decodes_encoded_files_in_the_same_pass():
    chain = ImageChain([{"op": "flip", "flip_code": 1}])
    png = cv2.imencode(".png", CAT_BGR)[1].tobytes()
    (img, bad), errors = transform_images([png, b"junk"], chain, raise_errors=False)
    np.testing.assert_array_equal(img, CAT_BGR[:, ::-1])
    assert bad is None and errors[1].endswith("unknown format, not an image")
    _, errors = transform_images([png], chain, raise_errors=False, max_pixels=100)
    assert "over the limit of 100" in errors[0]


def test_fast_decode_picks_the_dct_scale_and_stays_close():
    spec = get_entry("efficientnet_lite0").preprocessing  # shorter side to 256
    big = cv2.resize(CAT_BGR, None, fx=4, fy=4, interpolation=cv2.INTER_CUBIC)  # 1200x1804
    jpeg = cv2.imencode(".jpg", big, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()
    assert decode_flags(jpeg, spec, grey=False, fast=True) == cv2.IMREAD_REDUCED_COLOR_4
    assert decode_flags(jpeg, spec, grey=False, fast=False) == cv2.IMREAD_COLOR
    small = cv2.imencode(".jpg", CAT_BGR)[1].tobytes()  # shorter side 300: no room to reduce
    assert decode_flags(small, spec, grey=True, fast=True) == cv2.IMREAD_GRAYSCALE
    png = cv2.imencode(".png", big)[1].tobytes()
    assert decode_flags(png, spec, grey=False, fast=True) == cv2.IMREAD_COLOR
    full, _, _ = preprocess_images([jpeg], spec, encoded=True)
    fast, _, _ = preprocess_images([jpeg], spec, encoded=True, fast_decode=True)
    assert full.shape == fast.shape == (1, 3, 224, 224)
    assert float(np.abs(full - fast).mean()) < 0.03  # in (x - 127) / 128 units: under 4 grey levels
