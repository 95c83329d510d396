"""`irbis demo` end to end on the small camera-trap set: the full ladder, its intervals and artefacts.

On the classic session the ladder is the camera-trap notebook's (the ``camera_trap_run`` fixture, shared with
the notebook's test): its ``run_demo`` runs in the notebook's kernel and its results are read back with
``load_demo``. Not under ``--connect``: each stage of the ladder is checked on Connect by the conformance suite.
"""
from __future__ import annotations

import ast
import json
import re

import numpy as np
import pandas as pd
import pytest
from pyspark.ml import PipelineModel

from irbis.demo.camera_trap import load_demo
from irbis.spark.images import read_images

pytestmark = [pytest.mark.spark,
              pytest.mark.classic_only(reason="the ladder's stages are each checked on Connect (conformance) and the "
                                              "demo's ladder is the camera-trap notebook's on the classic session")]


@pytest.fixture(scope="module")
def demo(spark, request):
    _, _, folder = request.getfixturevalue("camera_trap_run")
    return load_demo(folder / "camera-trap-output")


def _shown_rows(table: str) -> dict[str, list[float]]:
    """The variant lines of a printed ladder table: variant -> accuracy, its interval, AUC, its interval."""
    number = r"(\d\.\d{3})"
    cells = rf"{number} \[{number}, {number}\]"
    rows = re.findall(rf"^(\S+) +{cells} +{cells}  ", table, flags=re.MULTILINE)
    return {r[0]: [float(v) for v in r[1:]] for r in rows}


def test_a_finished_run_reads_back_as_run_demo_returned_it(demo, request):
    # demo was read back: the notebook's kernel printed run_demo's own table, best rung and seconds
    from notebook_runner import outputs_of

    shown = outputs_of(request.getfixturevalue("camera_trap_run")[0], "text/plain")
    printed = "".join(shown)
    assert demo.table in printed and f"best: {demo.best}" in printed
    rows = _shown_rows(printed)
    assert list(rows) == [s.variant for s in demo.scores]
    for s in demo.scores:
        np.testing.assert_allclose(rows[s.variant], [s.accuracy, *s.accuracy_ci, s.roc_auc, *s.roc_auc_ci],
                                   atol=5e-4, err_msg=s.variant)
    seconds = [ast.literal_eval(text) for text in shown if text.startswith("{") and "'total'" in text]
    assert seconds == [demo.seconds]
    with pytest.raises(FileNotFoundError, match="lime holds no finished camera-trap demo run: metrics.json is missing"):
        load_demo(demo.output / "lime")


def test_full_ladder_with_intervals(demo):
    scores = {s.variant: s for s in demo.scores}
    a = next(v for v in scores if v.endswith("+A"))
    assert list(scores) == ["LR120", "EN1", "EN2", a, f"{a}+E", f"{a}+E+T"]
    assert len({s.images for s in demo.scores}) == 1  # the same test images everywhere
    for s in demo.scores:
        for value, (low, high) in ((s.accuracy, s.accuracy_ci), (s.roc_auc, s.roc_auc_ci)):
            assert low <= value <= high
    low, high = scores["LR120"].accuracy_ci  # a perfect rung may have [1, 1]; the baseline is not perfect
    assert high - low > 0
    deep = max(scores["EN1"].roc_auc, scores["EN2"].roc_auc)
    assert deep > scores["LR120"].roc_auc + 0.1
    assert all("regParam" in demo.chosen[v] for v in ("LR120", "EN1", "EN2", a))
    meta = pd.read_csv(demo.output / "data" / "metadata.csv")  # the built set: every image, its label, camera
    test = meta[meta["camera"].isin(demo.folds.loc[demo.folds["is_test"], "camera"])]
    for s in demo.scores:  # each rung's figures agree with its confusion matrix over the test cameras' images
        (tn, fp), (fn, tp) = s.confusion
        assert (tn + fp, fn + tp) == ((test["label"] != "animal").sum(), (test["label"] == "animal").sum())
        assert s.images == len(test)
        assert s.accuracy == pytest.approx((tn + tp) / len(test)), s.variant
        assert s.precision == pytest.approx(tp / (tp + fp) if tp + fp else 0.0), s.variant
        assert s.recall == pytest.approx(tp / (tp + fn)), s.variant


def test_grouped_cv_never_sees_a_test_camera(demo):
    folds = demo.folds
    assert (folds.loc[folds["is_test"], "fold"] == -1).all()
    train = folds[~folds["is_test"]]
    assert (train["fold"] >= 0).all() and train["fold"].nunique() == 2  # folds=2, as the notebook runs it
    assert train.groupby("camera")["fold"].nunique().max() == 1  # a camera lies in one fold
    assert not set(train["camera"]) & set(folds.loc[folds["is_test"], "camera"])
    assert sorted(folds["camera"]) == sorted(set(pd.read_csv(demo.output / "data" / "metadata.csv")["camera"]))


def test_artefacts_and_saved_pipeline(demo, spark):
    out = demo.output
    for name in ["report.html", "roc.png", "ladder.png", "wrong.png", "metrics.json", "table.txt",
                 "model.json", "lime/index.html"]:
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert {st["roc_auc_verdict"] for st in metrics["steps"]} <= {"better", "worse", "not significant"}
    assert "95%" in (out / "report.html").read_text()
    card = json.loads((out / "model.json").read_text())
    assert card["variant"] == demo.best
    model = PipelineModel.load(str(out / "model"))
    frames = read_images(str(out / "data" / "animal"), spark=spark, dropInvalid=True).limit(2)
    assert model.transform(frames).count() == 2


def test_head_selection_does_not_depend_on_the_partition_layout(spark):
    from pyspark.ml.functions import array_to_vector

    from irbis.demo.ladder import select_head

    rng = np.random.default_rng(0)
    n = 600  # more training rows per fold than one batch: the mini-batches follow the row order
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, 6)) + np.outer(y, [1.0, 0.5, 0, 0, 0, 0])
    rows = pd.DataFrame({"path": [f"img{i // 2:03d}.png" for i in range(n)],
                         "augmentation": ["original", "flip"] * (n // 2), "y": y, "fold": (np.arange(n) // 2) % 3})
    rows["f"] = list(x)  # arrays: Arrow (and so Spark Connect) takes no DenseVector objects in a pandas frame

    def frame(pdf):
        return spark.createDataFrame(pdf).withColumn("f", array_to_vector("f"))

    one = frame(rows).repartition(3)
    other = frame(rows.sample(frac=1.0, random_state=1)).repartition(5)
    first, second = select_head(one, "f", seed=0), select_head(other, "f", seed=0)
    assert first == second  # the same choice, the same scores of every setting
    assert first[2] == 6 and len(set(first[1].values())) > 1


def test_the_lr_cross_validation_reports_each_fit_and_chooses_as_without_the_count(spark):
    """The progress bar's steps: one call per fold and regParam, the same choice and scores as without."""
    from pyspark.ml.functions import array_to_vector

    from irbis.demo.ladder import fit_lr

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 120)
    x = rng.normal(size=(120, 3)) + np.outer(y, [1.0, 0.0, 0.0])
    rows = pd.DataFrame({"y": y.astype(float), "fold": np.arange(120) % 2, "f": list(x)})
    train = spark.createDataFrame(rows).withColumn("f", array_to_vector("f"))
    fits = []
    counted = fit_lr(train, "f", 2, grid=(0.01, 1.0), maxIter=5, on_fit=lambda: fits.append(1))[1]
    assert len(fits) == 2 * 2
    assert counted == fit_lr(train, "f", 2, grid=(0.01, 1.0), maxIter=5)[1]
