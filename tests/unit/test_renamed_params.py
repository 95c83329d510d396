"""Earlier names of Irbis Params (irbis.ml.aliases.Renamed) still work, warn once per process, and load.

TorchModel and ONNXModel's ``modelPath`` is ``network`` and their ``outputType`` is ``outputFormat``;
ImageFeaturizer's ``model`` is ``network`` and its ``modelPath`` is ``weights``; TorchEstimator's
``featuresCol`` is ``inputCol``. The stages saved by earlier versions (tests/data/saved_*) hold the old
names in their metadata and load through the same table (tests/spark/test_saved_references.py and
test_kernel_pipeline.py load them through Spark; here they load without it).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from irbis.ml import aliases

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(aliases, "_WARNED", set())


def _renamed_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught
            if issubclass(w.category, FutureWarning) and "is now called" in str(w.message)]


def test_old_constructor_keywords_and_accessors_work_and_warn_once():
    from irbis.ml import ImageFeaturizer, TorchEstimator, TorchModel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = TorchModel(modelPath="net.pt2", inputCol="x", outputCol="y", outputType="array")
        second = TorchModel(modelPath="other.pt2").setModelPath("third.pt2")
        feat = ImageFeaturizer(model="resnet50", modelPath="")
        est = TorchEstimator(featuresCol="vec")
    assert (first.getNetwork(), first.getOutputFormat(), second.getNetwork()) == ("net.pt2", "array", "third.pt2")
    assert first.getModelPath() == "net.pt2" and first.getOrDefault("modelPath") == "net.pt2"
    assert (feat.getNetwork(), feat.getWeights()) == ("resnet50", "")
    assert est.getInputCol() == "vec" and est.getFeaturesCol() == "vec"
    found = _renamed_warnings(caught)
    assert sorted(found) == sorted(set(found)) and len(found) == 5, found  # once per name, not per use
    # each points at the line that used the old name, here, not at Irbis or PySpark
    assert {w.filename for w in caught if issubclass(w.category, FutureWarning)} == {__file__}
    assert any("'modelPath' is now called 'network'" in m for m in found)
    assert any("'featuresCol' is now called 'inputCol'" in m for m in found)
    assert all(p.name not in {"modelPath", "outputType", "featuresCol"} for s in (first, est) for p in s.params)


def test_the_new_names_do_not_warn():
    from irbis.ml import ImageFeaturizer, TorchEstimator, TorchModel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TorchModel(network="net.pt2", outputFormat="array").setNetwork("b.pt2").getNetwork()
        ImageFeaturizer(network="resnet50", weights="").getNetwork()
        TorchEstimator(inputCol="vec").getInputCol()
    assert not _renamed_warnings(caught)


def test_stages_saved_under_the_old_names_load_without_spark_and_without_warnings():
    from irbis.ml import load_local
    from irbis.ml.persistence import load_local_stage

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch_model = load_local_stage(str(DATA / "saved_v0" / "torch_model"))
        kernels = load_local(str(DATA / "saved_v0" / "torch_model"))
    assert not _renamed_warnings(caught)
    assert Path(torch_model.getNetwork()).is_relative_to(DATA / "saved_v0" / "torch_model")  # the sidecar copy
    assert torch_model.getOutputFormat() == "vector" and torch_model.getInputCol() == "scaled"
    assert kernels[0].inputs == ["scaled"]


def test_renamed_metadata_keeps_a_current_name_over_an_old_one():
    from irbis.ml import TorchModel
    from irbis.ml.aliases import renamed_metadata

    meta = {"paramMap": {"modelPath": "old", "network": "new", "inputCol": "x"},
            "defaultParamMap": {"outputType": "vector"}}
    out = renamed_metadata(TorchModel, meta)
    assert out["paramMap"] == {"network": "new", "inputCol": "x"}
    assert out["defaultParamMap"] == {"outputFormat": "vector"}
    assert meta["paramMap"]["modelPath"] == "old"  # the caller's metadata is left as it was


def test_an_image_classifier_model_of_an_earlier_version_loads_and_scores_as_a_torch_model_on_images():
    """Saved when ImageClassifierModel named its record ``preprocessing`` and still had ImageFeaturizer's layer
    Params, which it never used: it loads without them, its record under imagePreprocessing, and its class
    scores are what a TorchModel with the same network and imagePreprocessing gives."""
    import cv2
    import numpy as np
    import pandas as pd
    from skimage import data

    from irbis.ml import ImageClassifierModel, TorchModel
    from irbis.ml.persistence import load_local_stage

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_local_stage(str(DATA / "saved_v0" / "image_classifier_model"))
    assert not _renamed_warnings(caught)
    assert isinstance(model, ImageClassifierModel)
    assert json.loads(model.getImagePreprocessing())["input_size"] == [32, 32]
    assert ((model.getInputCol(), model.getPredictionCol(), model.getBackbone())
            == ("photo", "species", "small_cnn_cifar"))
    assert not {"outputCol", "outputCols", "outputLayer", "outputLayers", "cutOutputLayers", "weights"} & \
        {p.name for p in model.params}
    photos = [cv2.imencode(".png", np.ascontiguousarray(img[..., ::-1]))[1].tobytes()
              for img in (data.chelsea(), data.coffee(), data.astronaut())]
    out = model.transform(pd.DataFrame({"photo": photos}))
    same = TorchModel(network=model.getNetwork(), inputCol="photo", outputCol="scores",
                      imagePreprocessing=model.getImagePreprocessing()).transform(pd.DataFrame({"photo": photos}))
    raw, scores = np.stack(out["rawPrediction"].map(np.asarray)), np.stack(same["scores"].map(np.asarray))
    np.testing.assert_allclose(raw, scores, rtol=1e-5, atol=1e-6)
    assert out["species"].tolist() == raw.argmax(1).astype(float).tolist()
