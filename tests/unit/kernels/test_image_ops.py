"""Image operations and the op chain (no JVM)."""
from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from skimage import data as skdata

from irbis.kernels.image.op_chain import OPS, ImageChain
from irbis.kernels.image.ops import (
    ImageOpError,
    blur,
    center_crop,
    color_format,
    crop,
    flip,
    normalize,
    resize,
    threshold,
    to_chw,
)

COFFEE = np.ascontiguousarray(skdata.coffee()[:, :, ::-1])  # 400x600x3 BGR


def test_resize_plain_and_keep_aspect_ratio():
    assert resize(COFFEE, 50, 70).shape == (50, 70, 3)
    assert resize(COFFEE, 256, 256, keep_aspect_ratio=True).shape == (256, 384, 3)
    assert resize(COFFEE[:, :, :1], 10, 20).shape == (10, 20, 1)  # channel axis kept
    np.testing.assert_array_equal(resize(COFFEE, 400, 600), COFFEE)
    np.testing.assert_array_equal(
        resize(COFFEE, 100, 150, interpolation="area"),
        cv2.resize(COFFEE, (150, 100), interpolation=cv2.INTER_AREA))


def test_crop_and_center_crop_take_the_right_window():
    np.testing.assert_array_equal(crop(COFFEE, 10, 20, 30, 40), COFFEE[20:50, 10:50])
    np.testing.assert_array_equal(center_crop(COFFEE, 200, 300), COFFEE[100:300, 150:450])


def test_crop_outside_names_op_size_and_arguments():
    with pytest.raises(ImageOpError) as err:
        crop(COFFEE, 590, 0, 10, 20)
    msg = str(err.value)
    assert "crop(x=590, y=0, height=10, width=20)" in msg and "400x600x3 uint8" in msg
    with pytest.raises(ImageOpError, match=r"center_crop\(height=500, width=10\) on a 400x600x3"):
        center_crop(COFFEE, 500, 10)


def test_flip_codes_match_numpy():
    np.testing.assert_array_equal(flip(COFFEE, 1), COFFEE[:, ::-1])
    np.testing.assert_array_equal(flip(COFFEE, 0), COFFEE[::-1])
    np.testing.assert_array_equal(flip(COFFEE, -1), COFFEE[::-1, ::-1])
    with pytest.raises(ImageOpError, match="flip_code must be"):
        flip(COFFEE, 2)


def test_blur_smooths_and_keeps_mean():
    noisy = np.random.default_rng(0).integers(0, 256, (64, 64, 1), dtype=np.uint8)
    out = blur(noisy, 5, 5)
    assert out.shape == noisy.shape and out.std() < noisy.std() / 2
    assert abs(float(out.mean()) - float(noisy.mean())) < 2
    with pytest.raises(ImageOpError, match="must be odd"):
        blur(noisy, 4, 5)


def test_threshold_binary_and_unknown_type():
    out = threshold(COFFEE, 127, 255, "binary")
    assert set(np.unique(out)) <= {0, 255}
    np.testing.assert_array_equal(out, np.where(COFFEE > 127, 255, 0))
    with pytest.raises(ImageOpError, match="unknown type 'otsu'"):
        threshold(COFFEE, 1, 2, "otsu")


def test_color_format_conversions():
    rgb = color_format(COFFEE, "RGB")
    np.testing.assert_array_equal(rgb, COFFEE[:, :, ::-1])
    grey = color_format(rgb, "GRAY", source="RGB")
    np.testing.assert_array_equal(grey[:, :, 0], cv2.cvtColor(COFFEE, cv2.COLOR_BGR2GRAY))
    assert color_format(grey, "BGR").shape == COFFEE.shape
    with pytest.raises(ImageOpError, match="needs 3 channels, found 1"):
        color_format(grey, "RGB", source="BGR")


def test_normalize_per_channel_and_to_chw():
    out = normalize(COFFEE, [1.0, 2.0, 3.0], [2.0, 4.0, 8.0], color_scale_factor=0.5)
    assert out.dtype == np.float32
    expected = (COFFEE.astype(np.float32) * 0.5 - [1, 2, 3]) / [2, 4, 8]
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    chw = to_chw(out)
    assert chw.shape == (3, 400, 600) and chw.flags.c_contiguous
    np.testing.assert_array_equal(chw[1], out[:, :, 1])
    with pytest.raises(ImageOpError, match="mean needs 1 or 3 values, found 2"):
        normalize(COFFEE, [1.0, 2.0], 1.0)


def test_chain_applies_steps_in_order_and_tracks_colour_order():
    chain = (ImageChain().then("resize", height=256, width=256, keep_aspect_ratio=True)
             .then("center_crop", height=224, width=224).then("color_format", format="RGB")
             .then("color_format", format="GRAY").then("normalize", mean=127.0, std=128.0))
    out, order = chain.apply(COFFEE)
    step = center_crop(resize(COFFEE, 256, 256, keep_aspect_ratio=True), 224, 224)
    expected = (cv2.cvtColor(step, cv2.COLOR_BGR2GRAY).astype(np.float32) - 127) / 128
    assert order == "GRAY" and out.shape == (224, 224, 1)
    np.testing.assert_allclose(out[:, :, 0], expected, atol=1e-6)


def test_chain_is_json_and_validates_eagerly():
    chain = ImageChain([{"op": "flip", "flip_code": np.int64(0)}, {"op": "normalize",
                        "mean": (1, 2, 3), "std": 1}])
    assert json.loads(chain.to_json())[1]["mean"] == [1, 2, 3]
    assert ImageChain.from_json(chain.to_json()) == chain
    bad = [({"op": "rotate"}, "unknown image op 'rotate'"),
           ({"op": "resize", "height": 5}, r"missing arguments \['width'\]"),
           ({"op": "resize", "height": 5, "width": 0}, "width=0 is invalid"),
           ({"op": "flip", "flip_code": True}, "flip_code=True is invalid"),
           ({"op": "blur", "height": 3, "width": 3, "size": 2}, r"unknown arguments \['size'\]"),
           ({"op": "color_format", "format": "HSV"}, "format='HSV' is invalid")]
    for op, message in bad:
        with pytest.raises(ValueError, match=message):
            ImageChain([op])
    assert set(OPS) == {"resize", "crop", "center_crop", "flip", "blur", "threshold",
                        "color_format", "normalize"}


def test_chain_runtime_error_names_op_and_size():
    chain = ImageChain([{"op": "resize", "height": 10, "width": 10},
                        {"op": "crop", "x": 5, "y": 5, "height": 8, "width": 8}])
    with pytest.raises(ImageOpError, match=r"crop\(x=5, y=5, height=8, width=8\) on a 10x10x3"):
        chain(COFFEE)


def test_every_op_keeps_channel_axis_on_grey_16_bit():
    grey16 = (COFFEE[:, :, :1].astype(np.uint16) * 257)
    for name, args in [("resize", {"height": 9, "width": 7}), ("flip", {}),
                       ("blur", {"height": 3, "width": 3}),
                       ("threshold", {"threshold": 30000, "max_val": 65535}),
                       ("crop", {"x": 0, "y": 0, "height": 5, "width": 5})]:
        out = ImageChain([{"op": name, **args}])(grey16)
        assert out.ndim == 3 and out.shape[2] == 1 and out.dtype == np.uint16, name


@pytest.mark.parametrize("name", sorted(__import__("irbis.models", fromlist=["MODELS"]).MODELS))
def test_image_chains_give_every_catalogue_entrys_tensor_exactly(name):
    """The chain a user would write from an entry equals the entry's own preprocessing, bit for bit."""
    from irbis.kernels.image.network_input import preprocess_rgb
    from irbis.models import get_entry

    spec = get_entry(name).preprocessing
    chain = ImageChain()
    if spec.resize_to:
        chain = chain.then("resize", height=spec.resize_to, width=spec.resize_to, keep_aspect_ratio=True,
                           interpolation=spec.interpolation)
        chain = chain.then("center_crop", height=spec.input_size[0], width=spec.input_size[1])
    else:
        chain = chain.then("resize", height=spec.input_size[0], width=spec.input_size[1],
                           interpolation=spec.interpolation)
    chain = (chain.then("color_format", format=spec.color_order)
             .then("normalize", mean=list(spec.mean), std=list(spec.std)))
    for photo in (COFFEE, COFFEE[:, 100:397]):  # landscape, and portrait with an odd width
        rgb = np.ascontiguousarray(photo[:, :, ::-1])
        expected = preprocess_rgb(rgb, spec)
        found = chain(photo).transpose(2, 0, 1)
        assert found.shape == expected.shape
        assert np.array_equal(found, expected), f"{name}: max diff {np.abs(found - expected).max()}"
