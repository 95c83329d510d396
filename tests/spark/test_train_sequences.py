"""TorchEstimator on token-id columns (array<int>, lengths varying per row) on real Spark (local[2])."""

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pyspark.sql.types import ArrayType, DoubleType, FloatType, IntegerType, StructField, StructType

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


STEPS_SCHEMA = StructType([StructField("frames", ArrayType(ArrayType(FloatType()))),
                           StructField("label", DoubleType())])
GRU_STEPS = {"features": 3, "hidden": 16}


def steps_task(n: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Rows of 3 to 12 steps of 3 float features (a burst's frame features, in small); the rule: 1 when the
    first feature's mean over the steps is above 0. Chance is about 0.5."""
    rng = np.random.default_rng(seed)
    x = [rng.normal(size=(int(rng.integers(3, 13)), 3)).astype(np.float32) for _ in range(n)]
    return x, np.array([int(r[:, 0].mean() > 0) for r in x])


def steps_frame(spark, x, y):
    return spark.createDataFrame([(None if r is None else r.tolist(), float(v)) for r, v in zip(x, y)],
                                 STEPS_SCHEMA).repartition(2)


def plain_gru(x, y, epochs: int, batch: int) -> torch.nn.Module:
    """Plain PyTorch on the same rows: the same seeded network, Adam at the same rate, shuffled batches of
    ``batch`` rows padded with their mask (the two workers of 16 rows of a sync step)."""
    torch.manual_seed(0)
    net = build_model("gru_classifier", **GRU_STEPS)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    g = np.random.default_rng(0)
    for _ in range(epochs):
        perm = g.permutation(len(y))
        for i in range(0, len(y), batch):
            idx = perm[i:i + batch]
            (xb, mask), _ = make_batch([x[j] for j in idx], "padded")
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xb, mask), torch.as_tensor(y[idx])).backward()
            opt.step()
    return net.eval()


def test_a_gru_learns_from_steps_of_features_as_plain_pytorch(spark):
    """array<array<float>> rows (steps of features, their number varying per row) train a recurrent network
    under sync on two workers to the accuracy plain PyTorch reaches on the same rows, split and epochs (within
    3 points of 100 test rows: the two runs draw their batches differently), and the fitted model scores
    such rows on Spark."""
    x, y = steps_task(400)
    df = steps_frame(spark, x[:300], y[:300])
    assert input_kind(df, "frames") == "sequence"
    est = TorchEstimator(network="gru_classifier", networkOptions=json.dumps(GRU_STEPS), inputCol="frames",
                         epochs=8, batchSize=16, tokenBudget=1024, numWorkers=2, learningRate=1e-2,
                         showProgress=False)
    model = est.fit(df)
    scored = model.transform(steps_frame(spark, x[300:], y[300:])).toPandas()
    got = np.array([np.argmax(v) for v in scored[model.getOutputCol()]])
    irbis_accuracy = float((got == scored["label"].to_numpy()).mean())
    net = plain_gru(x[:300], y[:300], epochs=8, batch=32)
    with torch.no_grad():
        (xb, mask), _ = make_batch(x[300:], "padded")
        plain_accuracy = float((net(xb, mask).argmax(1).numpy() == y[300:]).mean())
    assert plain_accuracy > 0.85, plain_accuracy  # the rule is learnable from these rows
    assert irbis_accuracy >= plain_accuracy - 0.03, (irbis_accuracy, plain_accuracy)


def test_steps_of_unequal_widths_and_unusable_steps_are_named(spark):
    x, y = steps_task(40, seed=1)
    est = TorchEstimator(network="gru_classifier", networkOptions=json.dumps(GRU_STEPS), inputCol="frames",
                         epochs=1, batchSize=16, numWorkers=2, showProgress=False)
    wide = list(x)
    wide[3] = np.concatenate([wide[3], np.zeros((len(wide[3]), 1), np.float32)], axis=1)
    with pytest.raises(ValueError, match="inputCol 'frames': steps have different widths \\(3 and 4 values\\)"):
        est.fit(steps_frame(spark, wide, y))
    bad = list(x)
    bad[5] = bad[5].copy()
    bad[5][1, 2] = np.nan
    with pytest.raises(ValueError, match="inputCol 'frames' has 1 null or empty sequences.*non-finite.*nanPolicy"):
        est.fit(steps_frame(spark, bad, y))
    model = est.copy({est.nanPolicy: "skip"}).fit(steps_frame(spark, bad, y))
    assert model.training_summary[-1]["skippedRows"] == 1
