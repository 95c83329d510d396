"""Conformance suite for every model of the catalogue (``irbis.models.MODELS``): an entry of the shipped
``catalogue.json`` is enrolled here by being there."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from irbis.kernels.image.network_input import preprocess_rgb
from irbis.models import MODELS, CatalogueEntry, layer_output_shapes, read_catalogue


@pytest.fixture(params=sorted(MODELS))
def entry(request) -> CatalogueEntry:
    return MODELS[request.param]


def test_the_registry_is_the_shipped_catalogue():
    shipped = read_catalogue(None)
    assert len({e.name for e in shipped}) == len(shipped)
    assert {e.name for e in shipped} <= set(MODELS)


def test_output_and_feature_layer_shapes(entry):
    model = entry.build()
    assert not model.training
    with torch.inference_mode():
        assert model(torch.zeros(1, *entry.input_shape)).shape == (1, entry.num_classes)
    assert entry.layers or entry.preprocessing is None, f"{entry.name}: an image model names a feature layer"
    shapes = layer_output_shapes(model, entry.layers, entry.input_shape)
    if entry.layer_shapes:
        assert [shapes[name] for name in entry.layers] == list(entry.layer_shapes)


def test_preprocessing_is_deterministic_and_fits_the_input(entry):
    pre = entry.preprocessing
    if pre is None:
        pytest.skip(f"{entry.name} takes no images")
    image = np.random.default_rng(0).integers(0, 256, size=(37, 53, 3), dtype=np.uint8)
    first, second = preprocess_rgb(image, pre), preprocess_rgb(image.copy(), pre)
    assert first.shape == entry.input_shape and first.dtype == np.float32
    assert np.isfinite(first).all()
    np.testing.assert_array_equal(first, second)


def test_entry_round_trips_through_json(entry):
    text = json.dumps(entry.to_dict())
    again = CatalogueEntry.from_dict(json.loads(text), base=entry.base)
    assert again.to_dict() == entry.to_dict() and again.input_shape == entry.input_shape
    assert ("input_shape" in entry.to_dict()) == (entry.preprocessing is None)  # stored once


def test_weights_are_complete_when_shipped(entry):
    if entry.uri is None:
        assert entry.sha256 is None and entry.size is None
    else:
        assert len(entry.sha256) == 64 and entry.size > 0
