"""`irbis demo` end to end on a small camera-trap set: the ladder's shape and the saved artefacts."""
from __future__ import annotations

import json

import pytest
from pyspark.ml import PipelineModel

from irbis.demo.camera_trap import VARIANTS, run_demo
from irbis.spark.images import read_images

pytestmark = pytest.mark.spark

#: cameras, bursts per camera, frames per burst: 72 images, 2 test cameras
SMALL = (6, 4, 3)


@pytest.fixture(scope="module")
def demo(spark, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return run_demo(spark, out, data_size=SMALL, test_fraction=0.34, progress=False)


def test_ladder_shape(demo):
    scores = {s.variant: s for s in demo.scores}
    assert list(scores) == list(VARIANTS)
    assert all(s.images == scores["LR120"].images for s in demo.scores)  # same test images everywhere
    deep = max(scores["EN1"].roc_auc, scores["EN2"].roc_auc)
    assert deep > scores["LR120"].roc_auc + 0.1
    assert max(scores["EN1"].accuracy, scores["EN2"].accuracy) > scores["LR120"].accuracy
    assert scores["EN1+A+E"].roc_auc >= scores["EN1+A"].roc_auc - 0.02
    assert scores["EN1+A+E"].accuracy >= scores["EN1+A"].accuracy - 0.05


def test_artefacts_and_saved_pipeline(demo, spark):
    out = demo.output
    for name in ["report.html", "roc.png", "metrics.json", "table.txt", "model.json"]:
        assert (out / name).is_file(), name
    assert len(list(out.glob("confusion_*.png"))) == len(VARIANTS)
    assert "EN1+A+E" in (out / "report.html").read_text()
    card = json.loads((out / "model.json").read_text())
    assert card["variant"] == demo.best
    model = PipelineModel.load(str(out / "model"))
    frames = read_images(str(out / "data" / "animal"), spark=spark, dropInvalid=True).limit(2)
    probs = [r.probability for r in model.transform(frames).select("probability").collect()]
    assert len(probs) == 2 and all(abs(sum(p) - 1.0) < 1e-6 for p in probs)
