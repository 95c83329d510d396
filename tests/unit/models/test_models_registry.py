"""The model registry (shipped catalogue + registered entries), catalogue entries and preprocessing."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from irbis.cli import main
from irbis.kernels.image.network_input import preprocess_rgb
from irbis.kernels.image.ops import ImageOpError, center_crop, resize
from irbis.models import (
    MODELS,
    CatalogueEntry,
    ModelRepository,
    Preprocessing,
    build_model,
    get_entry,
    layer_output_shapes,
    register_catalogue,
    register_model,
    unregister_model,
)


def test_get_entry_unknown_name_lists_known_models():
    with pytest.raises(ValueError, match="unknown model 'nope'.*efficientnet_lite0"):
        get_entry("nope")


def test_models_is_a_read_only_view():
    assert set(MODELS) >= {"efficientnet_lite0", "mlp_digits", "small_cnn_cifar"}
    with pytest.raises(TypeError):
        MODELS["x"] = get_entry("resnet18")  # type: ignore[index]
    assert all(isinstance(e, CatalogueEntry) and e.name == n for n, e in MODELS.items())


def test_register_model_refuses_duplicates_unless_overwrite():
    entry = dataclasses.replace(get_entry("mlp_digits"), name="mlp_digits_copy")
    try:
        assert register_model(entry) is get_entry("mlp_digits_copy")
        assert "mlp_digits_copy" in MODELS and "mlp_digits_copy" in {e.name for e in ModelRepository().entries()}
        with pytest.raises(ValueError, match="already registered"):
            register_model(entry)
        with pytest.raises(ValueError, match="already registered"):
            register_model(dataclasses.replace(entry, name="resnet18"))
        assert register_model(entry, overwrite=True) is get_entry("mlp_digits_copy")
    finally:
        unregister_model("mlp_digits_copy")
    assert "mlp_digits_copy" not in MODELS


def test_register_catalogue_and_the_cli_read_a_user_folder(tmp_path, capsys):
    doc = {"format": "irbis-catalogue", "version": 1,
           "models": [{"name": "user_cnn", "architecture": "small_cnn", "options": {"num_classes": 3},
                       "preprocessing": {"input_size": [32, 32], "mean": [0, 0, 0], "std": [255, 255, 255]},
                       "layers": ["flatten"], "num_classes": 3}]}
    (tmp_path / "catalogue.json").write_text(json.dumps(doc))
    assert main(["models", "--catalogue", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert "user_cnn" in listed and "input [3, 32, 32]" in listed and "efficientnet_lite0" in listed
    try:
        assert register_catalogue(tmp_path) == ["user_cnn"]
        entry = get_entry("user_cnn")
        assert entry.input_shape == (3, 32, 32) and entry.base == str(tmp_path.resolve())
        assert entry.build()[-1].out_features == 3
    finally:
        unregister_model("user_cnn")


def test_entry_validates_its_fields():
    base = get_entry("resnet18")
    pre = base.preprocessing
    with pytest.raises(ValueError, match="mean and std need 3 values"):
        dataclasses.replace(pre, mean=(1.0, 2.0))
    with pytest.raises(ValueError, match="interpolation"):
        dataclasses.replace(pre, interpolation="lanczos9")
    with pytest.raises(ValueError, match="resize_to must be at least"):
        dataclasses.replace(pre, resize_to=100)
    with pytest.raises(ValueError, match="layer_shapes"):
        dataclasses.replace(base, layer_shapes=((512,),))
    with pytest.raises(ValueError, match="differs from the preprocessing"):
        dataclasses.replace(base, input_shape=(1, 224, 224))
    with pytest.raises(ValueError, match="unknown architecture 'vgg'"):
        dataclasses.replace(base, architecture="vgg")
    with pytest.raises(ValueError, match="1..4 layers, found 5"):
        base.cut_layer(5)
    assert base.cut_layer(2) == "layer4" and base.input_shape == (3, 224, 224)


def test_entry_reads_options_and_names_unknown_keys():
    given = {"name": "m", "architecture": "mlp", "options": {"in_features": 4, "hidden": 3, "out_features": 2},
             "input_shape": [4]}
    entry = CatalogueEntry.from_dict(given)
    assert entry.options == {"in_features": 4, "hidden": 3, "out_features": 2}
    assert entry.to_dict()["options"] == entry.options
    for unknown in ("colour", "architecture_kwargs"):
        with pytest.raises(ValueError, match=rf"unknown keys \['{unknown}'\]"):
            CatalogueEntry.from_dict({**given, unknown: "RGB"})


def test_layer_output_shapes_names_missing_layers():
    with pytest.raises(ValueError, match=r"\['nope'\] not found"):
        layer_output_shapes(build_model("lenet_digits"), ["nope"], (1, 8, 8))


def test_preprocess_resizes_shorter_side_crops_centre_and_normalises():
    pre = get_entry("efficientnet_lite0").preprocessing
    image = np.full((300, 600, 3), 255, np.uint8)
    image[:, :, 1] = 127
    out = preprocess_rgb(image, pre)
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
    bgr = dataclasses.replace(get_entry("small_cnn_cifar").preprocessing, color_order="BGR")
    out = preprocess_rgb(rgb, bgr)
    np.testing.assert_allclose(out[2], (200 - bgr.mean[2]) / bgr.std[2], rtol=1e-6)
    digits = get_entry("lenet_digits").preprocessing
    grey = preprocess_rgb(np.full((8, 8), 16, np.uint8), digits)
    assert grey.shape == (1, 8, 8) and np.allclose(grey, 1.0)
    assert preprocess_rgb(rgb, digits).shape == (1, 8, 8)
    with pytest.raises(TypeError, match="uint8, found dtype float64"):
        preprocess_rgb(np.zeros((8, 8, 3)), digits)
    with pytest.raises(ValueError, match=r"found \(8, 8, 4\)"):
        preprocess_rgb(np.zeros((8, 8, 4), np.uint8), digits)
    assert isinstance(digits, Preprocessing) and digits.input_shape == (1, 8, 8)


def test_colour_orders_speak_the_image_operations_vocabulary():
    from irbis.kernels.image.ops import COLOR_FORMATS

    gray = get_entry("lenet_digits").preprocessing.to_dict()
    assert set(gray["color_order"].split()) <= set(COLOR_FORMATS)
    pre = Preprocessing.from_dict(gray)
    assert pre.color_order == "GRAY" and pre.channels == 1 and pre == get_entry("lenet_digits").preprocessing
    for other in ("L", "BGRA"):
        with pytest.raises(ValueError, match="color_order must be one of .*'GRAY'"):
            Preprocessing.from_dict({**gray, "color_order": other})
    with pytest.raises(AttributeError, match="irbis.kernels.image.network_input"):
        __import__("irbis.models", fromlist=["x"]).preprocess_rgb
