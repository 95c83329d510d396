"""A user's own model, by name: a catalogue folder with its weights, featurized like a built-in model."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pandas as pd
import pytest
import torch
from skimage import data as skdata

from irbis import ImageFeaturizer, TorchModel
from irbis.kernels.image.network_input import preprocess_rgb
from irbis.models import (
    ModelRepository,
    build_model,
    get_entry,
    register_catalogue,
    sha256_file,
    unregister_model,
)

NAME = "user_tiny_cnn"
OPTIONS = {"num_classes": 5, "width": 8}
PREPROCESSING = {"input_size": [32, 32], "resize_to": 40, "mean": [100.0, 110.0, 120.0],
                 "std": [50.0, 60.0, 70.0], "interpolation": "area", "color_order": "BGR"}


@pytest.fixture()
def user_model(tmp_path):
    """A catalogue folder: small_cnn weights (seed 3, unlike a fresh build) saved as a state dict."""
    net = build_model("small_cnn", **OPTIONS, seed=3)
    (tmp_path / "weights").mkdir()
    weights = tmp_path / "weights" / "tiny.pt"
    torch.save(net.state_dict(), weights)
    entry = {"name": NAME, "architecture": "small_cnn", "options": OPTIONS, "uri": "weights/tiny.pt",
             "sha256": sha256_file(weights), "size": weights.stat().st_size, "preprocessing": PREPROCESSING,
             "layers": ["flatten", "features"], "num_classes": 5}
    doc = {"format": "irbis-catalogue", "version": 1, "models": [entry]}
    (tmp_path / "catalogue.json").write_text(json.dumps(doc))
    assert register_catalogue(tmp_path) == [NAME]
    yield tmp_path, net
    unregister_model(NAME)


def _photos() -> list[np.ndarray]:
    return [skdata.coffee(), skdata.chelsea(), skdata.astronaut()[::3, ::3]]


def _expected(net, photos, layer: str | None) -> np.ndarray:
    """Run the module directly on each photo preprocessed as the entry says."""
    batch = torch.from_numpy(np.stack([preprocess_rgb(p, get_entry(NAME).preprocessing) for p in photos]))
    with torch.inference_mode():
        out = net(batch) if layer is None else net[: list(dict(net.named_children())).index(layer) + 1](batch)
    return out.reshape(len(photos), -1).numpy()


def test_user_catalogue_model_featurizes_by_name(user_model):
    folder, net = user_model
    photos = _photos()
    frame = pd.DataFrame({"b": [cv2.imencode(".png", p[:, :, ::-1])[1].tobytes() for p in photos]})
    features = ImageFeaturizer(inputCol="b", network=NAME, miniBatchSize=2).transform(frame)["features"]
    np.testing.assert_allclose(np.stack(features), _expected(net, photos, "flatten"), rtol=1e-4, atol=1e-5)
    scores = ImageFeaturizer(inputCol="b", network=NAME, cutOutputLayers=0).transform(frame)["features"]
    np.testing.assert_allclose(np.stack(scores), _expected(net, photos, None), rtol=1e-4, atol=1e-5)
    assert np.stack(scores).shape == (3, 5)
    repo = ModelRepository(folder, include_builtin=False)  # the same folder as a repository
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in repo.load_model(NAME).state_dict().items())


def test_user_catalogue_model_runs_in_torch_model_by_name(user_model):
    _, net = user_model
    photos = _photos()
    pixels = [preprocess_rgb(p, get_entry(NAME).preprocessing).reshape(-1) for p in photos]
    out = TorchModel(network=NAME, inputCol="x", outputCol="y").transform(pd.DataFrame({"x": pixels}))
    np.testing.assert_allclose(np.stack(out["y"]), _expected(net, photos, None), rtol=1e-4, atol=1e-5)


@pytest.mark.spark
def test_user_catalogue_model_on_spark_workers(spark, user_model):
    """The workers know no registry: the entry travels with the stage's source."""
    from pyspark.sql.types import BinaryType, StructType

    _, net = user_model
    photos = _photos()
    df = spark.createDataFrame([(cv2.imencode(".png", p[:, :, ::-1])[1].tobytes(),) for p in photos],
                               StructType().add("b", BinaryType()))
    stage = ImageFeaturizer(inputCol="b", network=NAME, cutOutputLayers=2)
    rows = stage.transform(df).select("features").collect()
    found = np.stack([r.features.toArray() for r in rows])
    np.testing.assert_allclose(found, _expected(net, photos, "features"), rtol=1e-4, atol=1e-5)
