"""TorchEstimator on token-id columns (array<int>, lengths varying per row) on real Spark (local[2])."""

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pyspark.sql.types import ArrayType, DoubleType, IntegerType, StructField, StructType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "train"))
from irbis.ml import TorchEstimator  # noqa: E402
from irbis.models import build_model  # noqa: E402
from irbis.spark.training import input_kind  # noqa: E402
from irbis.train.ragged import make_batch  # noqa: E402
from train_helpers import token_task  # noqa: E402

pytestmark = pytest.mark.spark

LSTM = {"vocab_size": 20, "embed": 8, "hidden": 16}
SCHEMA = StructType([StructField("ids", ArrayType(IntegerType())), StructField("label", DoubleType())])


def frame(spark, x, y):
    return spark.createDataFrame([(None if r is None else r.tolist(), float(v)) for r, v in zip(x, y)], SCHEMA)


def estimator(**kw):
    base = dict(network="lstm_classifier", networkOptions=json.dumps(LSTM), inputCol="ids", epochs=6, batchSize=16,
                tokenBudget=1024, numWorkers=2, learningRate=1e-2, showProgress=False)
    return TorchEstimator(**{**base, **kw})


def accuracy(est, x, y):
    """The trained network applied to held-out rows directly (packed, as it trained)."""
    net = build_model("lstm_classifier", **LSTM)
    net.load_state_dict(torch.load(io.BytesIO(est.last_results[0].state), weights_only=True))
    packed, _ = make_batch(list(x), "packed")
    with torch.no_grad():
        return float((net.eval()(packed).argmax(1).numpy() == y).mean())


@pytest.mark.parametrize("strategy, options, epochs", [("sync", "{}", 6), ("dcasgd", '{"lambda_": 2.0}', 10)])
def test_an_lstm_learns_from_a_token_id_column(spark, strategy, options, epochs):
    # dcasgd's workers push as they go: its run is not one fixed schedule, and it is given more epochs
    x, y = token_task(400)
    est = estimator(strategy=strategy, strategyOptions=options, epochs=epochs)
    model = est.fit(frame(spark, x[:300], y[:300]))
    assert accuracy(est, x[300:], y[300:]) > 0.75  # chance is 0.5
    assert all(1.0 <= r["paddingWaste"] < 1.6 for r in model.training_summary)
    if model.hasParam("variableLength"):
        assert model.getOrDefault("variableLength") is True


def test_a_token_id_column_is_a_sequence_and_its_bad_rows_are_named(spark):
    x, y = token_task(40)
    df = frame(spark, x, y)
    assert input_kind(df, "ids") == "sequence"
    x[5] = None
    with pytest.raises(ValueError, match="inputCol 'ids' has 1 null or empty sequences.*nanPolicy"):
        estimator(epochs=1).fit(frame(spark, x, y))
    model = estimator(epochs=1, nanPolicy="skip").fit(frame(spark, x, y))
    assert model.training_summary[-1]["skippedRows"] == 1
    with pytest.raises(ValueError, match="labelCol 'label'.*class indices up to 4"):
        estimator(epochs=1).fit(frame(spark, token_task(40)[0], np.arange(40) % 5))
