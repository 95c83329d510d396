"""`irbis demo --text` on a sample of the drug reviews (the rungs that run everywhere), and the ladder's
choices made without the test reviews."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from pyspark.sql import functions as F

from irbis.cli import main
from irbis.demo.text_demo import reviews_table
from irbis.demo.text_ladder import RUNGS, climb

pytestmark = pytest.mark.spark


def test_the_choice_is_the_same_whatever_the_test_reviews_say(spark):
    """Grouped CV sees the training reviews alone: test reviews with shuffled labels and other texts leave
    the chosen setting and every setting's CV accuracy as they were, and only the test scores change."""
    data = reviews_table(folds=2, seed=0, sample=60)
    rows = spark.createDataFrame(data[["id", "review", "y", "fold", "is_test"]]).cache()
    train, test = rows.where(~F.col("is_test")), rows.where(F.col("is_test"))
    rng = np.random.default_rng(0)
    other = data[data["is_test"]].assign(y=lambda d: rng.permutation(d["y"].to_numpy()),
                                         review=lambda d: rng.permutation(d["review"].to_numpy()))
    shuffled = spark.createDataFrame(other[["id", "review", "y", "fold", "is_test"]])
    rung = dataclasses.replace(RUNGS["TF-IDF+LR"], grid=({"regParam": 1.0, "maxIter": 10},
                                                                      {"regParam": 0.001, "maxIter": 10}))
    fits = []
    scored, chosen = climb(rung, train, test, folds=2, on_fit=lambda: fits.append(1))
    scored_other, chosen_other = climb(rung, train, shuffled, folds=2)
    assert chosen == chosen_other and set(chosen["cv_accuracy"]) == {"regParam=1.0, maxIter=10",
                                                                                "regParam=0.001, maxIter=10"}
    assert len(fits) == 2 * 2 + 1  # each fold and setting, then the refit on every training review
    assert list(scored["id"]) == list(scored_other["id"]) == sorted(data.loc[data["is_test"], "id"])
    assert not np.allclose(scored["score"], scored_other["score"])
    rows.unpersist()


@pytest.mark.classic_only(reason="the command runs on its own session from --master local[2], a classic one, "
                                 "which a Spark Connect client process cannot have")
def test_cli_demo_text_climbs_the_first_rungs_with_intervals(spark, tmp_path, capsys):
    out = tmp_path / "text"
    code = main(["demo", "--text", "--rungs", "TF-IDF+LR,MiniLM+LR", "--sample", "40", "--folds", "2",
                 "--output", str(out), "--master", "local[2]", "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "majority -> TF-IDF+LR" in printed and "TF-IDF+LR -> MiniLM+LR" in printed
    for name in ("report.html", "ladder.png", "metrics.json", "table.txt"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    rungs = {v["variant"]: v for v in metrics["variants"]}
    assert list(rungs) == ["majority", "TF-IDF+LR", "MiniLM+LR"]
    assert all(v["images"] == 40 for v in rungs.values())  # the same 40 test reviews everywhere
    for v in rungs.values():
        low, high = v["accuracy_ci"]
        assert low <= v["accuracy"] <= high and high - low > 0
    majority = rungs["majority"]
    assert majority["roc_auc"] == 0.5 and majority["accuracy"] in (np.mean(_test_labels()), 1 - np.mean(_test_labels()))
    assert [(s["base"], s["variant"]) for s in metrics["steps"]] == [("majority", "TF-IDF+LR"),
                                                                    ("TF-IDF+LR", "MiniLM+LR")]
    assert "grouped by drug" in (out / "report.html").read_text()


def _test_labels() -> np.ndarray:
    data = reviews_table(folds=2, seed=0, sample=40)
    return data.loc[data["is_test"], "y"].to_numpy()
