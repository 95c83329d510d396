"""TextClassifier on Spark: a pretrained encoder fine-tuned on real reviews learns their sentiment, one seed
reproduces a two-worker run, the fitted TextClassifierModel saves and loads with its summary, and bad input
is named before any step."""
from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel

from irbis.demo.reviews import drug_reviews
from irbis.errors import ParamValueError
from irbis.ml import TextClassifier, TextClassifierModel
from irbis.models.text_networks import text_source
from text_networks import tiny_text_network

pytestmark = pytest.mark.spark


def sentiment_frame(spark, split: str, step: int):
    """Every ``step``-th review of ``split`` with its label: 1 for a positive review, else 0."""
    frame = drug_reviews(split).iloc[::step].reset_index(drop=True)
    frame["label"] = (frame["sentiment"] == "positive").astype(int)
    frame["id"] = range(len(frame))
    return frame, spark.createDataFrame(frame[["id", "review", "label"]]).repartition(2)


def tiny(**params):
    """TextClassifier on the tiny BERT encoder: seconds per fit."""
    base = dict(backbone=tiny_text_network("embedding"), inputCol="review", numClasses=2, epochs=2, batchSize=8,
                maxLength=64, learningRate=1e-3, backboneLearningRateFactor=1.0, showProgress=False)
    return TextClassifier(**{**base, **params})


@pytest.mark.classic_only(reason="a fit of MiniLM; the fast cases below run the same path on both sessions")
def test_fine_tuning_minilm_on_reviews_beats_the_majority_class(spark):
    _, train = sentiment_frame(spark, "train", 1)
    test_rows, test = sentiment_frame(spark, "test", 1)
    model = TextClassifier(inputCol="review", numClasses=2, epochs=2, maxLength=128, showProgress=False,
                           validationFraction=0.1, seed=0).fit(train)
    assert isinstance(model, TextClassifierModel) and model.labels == ["0", "1"]
    scored = model.transform(test).orderBy("id").toPandas()
    accuracy = float((scored["prediction"] == test_rows["label"]).mean())
    majority = max(test_rows["label"].mean(), 1 - test_rows["label"].mean())
    assert accuracy >= majority + 0.04, (accuracy, majority)
    summary = model.training_summary
    assert len(summary) == 2 and summary[-1]["loss"] < summary[0]["loss"]
    assert all(r["accuracy"] is not None and 0.0 <= r["auc"] <= 1.0 and r["paddingWaste"] < 1.2 for r in summary)


def test_one_seed_reproduces_a_two_worker_run_exactly(spark):
    _, train = sentiment_frame(spark, "train", 6)
    first, second = tiny(seed=3).fit(train), tiny(seed=3).fit(train)
    other = tiny(seed=4).fit(train)
    mixed = tiny(seed=3, trainingPrecision="bf16").fit(train)
    losses = [r["loss"] for r in first.training_summary]
    assert losses == [r["loss"] for r in second.training_summary]
    assert losses != [r["loss"] for r in other.training_summary]
    # the same run with its steps in bf16 (autocast): other losses, yet about the same
    bf16 = [r["loss"] for r in mixed.training_summary]
    assert bf16 != losses and np.allclose(bf16, losses, rtol=0.05)
    a = np.stack([v.toArray() for v in first.transform(train).orderBy("id").toPandas()["rawPrediction"]])
    b = np.stack([v.toArray() for v in second.transform(train).orderBy("id").toPandas()["rawPrediction"]])
    assert np.array_equal(a, b)


def test_the_fitted_model_saves_and_loads_in_a_pipeline_with_its_summary(spark, tmp_path):
    rows, train = sentiment_frame(spark, "train", 12)
    fitted = Pipeline(stages=[tiny(epochs=1)]).fit(train)
    fitted.write().overwrite().save(str(tmp_path / "pipe"))
    loaded = PipelineModel.load(str(tmp_path / "pipe"))
    model = loaded.stages[0]
    assert isinstance(model, TextClassifierModel)
    assert model.training_summary is not None and len(model.training_summary) == 1
    before = fitted.transform(train).orderBy("id").toPandas()["probability"]
    after = loaded.transform(train).orderBy("id").toPandas()["probability"]
    assert np.allclose(np.stack([v.toArray() for v in before]), np.stack([v.toArray() for v in after]), atol=1e-6)


def test_null_texts_follow_nan_policy_and_bad_labels_are_named(spark):
    rows = [(i, f"review number {i} was {'good' if i % 2 else 'bad'}", i % 2) for i in range(40)]
    df = spark.createDataFrame(rows + [(40, None, 1), (41, None, 0)], "id int, review string, label int")
    with pytest.raises(Exception, match="inputCol|null|review"):
        tiny(epochs=1).fit(df)
    model = tiny(epochs=1, nanPolicy="skip").fit(df)
    assert model.training_summary[0]["skippedRows"] == 2
    bad = spark.createDataFrame([(i, "some text", i % 3) for i in range(12)], "id int, review string, label int")
    with pytest.raises(Exception, match="numClasses"):
        tiny(epochs=1).fit(bad)


def test_bad_settings_are_refused_before_any_job():
    with pytest.raises(ParamValueError, match="backbone"):
        TextClassifier(backbone="no_such_encoder")
    with pytest.raises(ParamValueError, match="trainingPrecision"):
        TextClassifier(trainingPrecision="fp16")
    with pytest.raises(ParamValueError, match="sequence classifier already"):
        TextClassifier(backbone=tiny_text_network("classification"))
    with pytest.raises(ValueError, match="freezeUntil 'no.such.layer'"):
        tiny(freezeUntil="no.such.layer")._estimator(text_source(tiny_text_network("embedding")))
    with pytest.raises(ValueError, match="numClasses"):
        TextClassifier(inputCol="review")._estimator({})
