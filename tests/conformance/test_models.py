"""Conformance suite for every entry of ``irbis.models.MODELS``: registering a spec enrols it here."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from irbis.models import MODELS, CatalogueEntry, ModelSpec, preprocess_rgb

SPECS = sorted(MODELS)


@pytest.fixture(params=SPECS)
def spec(request) -> ModelSpec:
    return MODELS[request.param]


def test_output_and_cut_layer_shapes(spec):
    model = spec.build()
    assert not model.training
    modules = dict(model.named_modules())
    shapes: dict[str, tuple[int, ...]] = {}
    for name in spec.cut_layers:
        modules[name].register_forward_hook(
            lambda _m, _i, out, name=name: shapes.__setitem__(name, tuple(out.shape[1:])))
    with torch.inference_mode():
        assert model(torch.zeros(1, *spec.input_shape)).shape == (1, spec.num_classes)
    assert [shapes[name] for name in spec.cut_layers] == list(spec.cut_shapes)


def test_preprocessing_is_deterministic_and_fits_the_input(spec):
    image = np.random.default_rng(0).integers(0, 256, size=(37, 53, 3), dtype=np.uint8)
    assert spec.resize_to is None or spec.resize_to >= max(spec.input_size)
    first, second = preprocess_rgb(image, spec), preprocess_rgb(image.copy(), spec)
    assert first.shape == spec.input_shape and first.dtype == np.float32
    assert np.isfinite(first).all()
    np.testing.assert_array_equal(first, second)


def test_spec_is_picklable_and_cataloguable(spec):
    assert callable(pickle.loads(pickle.dumps(spec.builder)))  # specs travel to Spark workers
    entry = CatalogueEntry.from_spec(spec)
    text = json.dumps(entry.to_dict())
    assert CatalogueEntry.from_dict(json.loads(text)).to_dict() == entry.to_dict()
    assert entry.layers == spec.cut_layers and tuple(entry.input_shape) == spec.input_shape
