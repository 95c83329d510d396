"""ModelSpec registry and the pure preprocessing helper."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from irbis.models import MODELS, ModelSpec, build_model, get_spec, layer_output_shapes, preprocess_rgb, register
from irbis.kernels.image_ops import ImageOpError, center_crop, resize


def test_get_spec_unknown_name_lists_known_models():
    with pytest.raises(ValueError, match="unknown model 'nope'.*efficientnet_lite0"):
        get_spec("nope")


def test_register_refuses_duplicates_unless_overwrite():
    spec = dataclasses.replace(get_spec("mlp_digits"), name="mlp_digits_copy")
    try:
        register(spec)
        with pytest.raises(ValueError, match="already registered"):
            register(spec)
        assert register(spec, overwrite=True) is get_spec("mlp_digits_copy")
    finally:
        MODELS.pop("mlp_digits_copy", None)


def test_spec_validates_its_fields():
    base = get_spec("resnet18")
    with pytest.raises(ValueError, match="mean and std need 3 values"):
        dataclasses.replace(base, mean=(1.0, 2.0))
    with pytest.raises(ValueError, match="interpolation"):
        dataclasses.replace(base, interpolation="lanczos9")
    with pytest.raises(ValueError, match="cut_shapes"):
        dataclasses.replace(base, cut_shapes=((512,),))
    with pytest.raises(ValueError, match="1..4 layers, found 5"):
        base.cut_layer(5)
    assert base.cut_layer(2) == "layer4" and base.input_shape == (3, 224, 224)


def test_layer_output_shapes_names_missing_layers():
    with pytest.raises(ValueError, match=r"\['nope'\] not found"):
        layer_output_shapes(build_model("lenet_digits"), ["nope"], (1, 8, 8))


def test_preprocess_resizes_shorter_side_crops_centre_and_normalises():
    spec = get_spec("efficientnet_lite0")
    image = np.full((300, 600, 3), 255, np.uint8)
    image[:, :, 1] = 127
    out = preprocess_rgb(image, spec)
    assert out.shape == (3, 224, 224) and out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_allclose(out[:, 0, 0], [(255 - 127) / 128, 0.0, (255 - 127) / 128], atol=1e-6)
    assert resize(np.zeros((600, 300, 3), np.uint8), 256, 256, keep_aspect_ratio=True).shape == (512, 256, 3)
    assert resize(np.zeros((301, 600, 3), np.uint8), 256, 256, keep_aspect_ratio=True).shape == (256, 510, 3)


def test_center_crop_takes_the_middle():
    image = np.arange(36, dtype=np.uint8).reshape(6, 6, 1)
    np.testing.assert_array_equal(center_crop(image, 2, 2)[:, :, 0], [[14, 15], [20, 21]])
    with pytest.raises(ImageOpError, match="the window is larger than the image"):
        center_crop(image, 8, 8)


def test_preprocess_colour_orders_and_bad_input():
    rgb = np.zeros((32, 32, 3), np.uint8)
    rgb[..., 0] = 200
    bgr_spec = dataclasses.replace(get_spec("small_cnn_cifar"), color_order="BGR")
    out = preprocess_rgb(rgb, bgr_spec)
    np.testing.assert_allclose(out[2], (200 - bgr_spec.mean[2]) / bgr_spec.std[2], rtol=1e-6)
    grey = preprocess_rgb(np.full((8, 8), 16, np.uint8), get_spec("lenet_digits"))
    assert grey.shape == (1, 8, 8) and np.allclose(grey, 1.0)
    assert preprocess_rgb(rgb, get_spec("lenet_digits")).shape == (1, 8, 8)
    with pytest.raises(TypeError, match="uint8, found dtype float64"):
        preprocess_rgb(np.zeros((8, 8, 3)), get_spec("lenet_digits"))
    with pytest.raises(ValueError, match=r"found \(8, 8, 4\)"):
        preprocess_rgb(np.zeros((8, 8, 4), np.uint8), get_spec("lenet_digits"))


def test_specs_are_model_specs():
    assert all(isinstance(s, ModelSpec) and s.name == n for n, s in MODELS.items())
