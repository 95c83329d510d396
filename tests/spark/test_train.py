"""TorchEstimator on real Spark (local[2]) with scikit-learn's handwritten digits."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from irbis.ml import TorchEstimator

pytestmark = pytest.mark.spark

MLP = json.dumps({"in_features": 64, "hidden": 64, "out_features": 10})
STRATEGY_RUNS = {"sync": "{}", "model_averaging": '{"period": 4}', "block_momentum": '{"blockSize": 4}',
                 "one_bit": "{}"}
EPOCHS = 12


def estimator(**kw):
    base = dict(network="mlp", networkOptions=MLP, epochs=EPOCHS, batchSize=32, numWorkers=2,
                learningRate=3e-3, validationFraction=0.1, showProgress=False)
    return TorchEstimator(**{**base, **kw})


def test_accuracy(model, digits):
    _, xte, _, yte = digits
    out = model.transform(pd.DataFrame({"features": list(xte.astype(np.float32))}))
    return float((np.stack(out["prediction"].map(np.asarray)).argmax(1) == yte).mean())


test_accuracy.__test__ = False  # a helper, not a test


@pytest.fixture(scope="module")
def fitted(train_df):
    return {name: estimator(strategy=name, strategyOptions=opts).fit(train_df)
            for name, opts in STRATEGY_RUNS.items()}


@pytest.mark.parametrize("name", sorted(STRATEGY_RUNS))
def test_every_strategy_reaches_high_test_accuracy(fitted, digits, name):
    model = fitted[name]
    assert test_accuracy(model, digits) >= 0.9
    summary = model.training_summary
    assert [r["epoch"] for r in summary] == list(range(1, EPOCHS + 1))
    assert {"loss", "accuracy", "samplesPerSecond", "bytesPerStep"} <= set(summary[-1])
    assert summary[-1]["loss"] < summary[0]["loss"] and summary[-1]["accuracy"] > 0.85


def test_one_bit_sends_25x_fewer_bytes_at_equal_accuracy(fitted, digits):
    sync, onebit = fitted["sync"].training_summary[-1], fitted["one_bit"].training_summary[-1]
    assert sync["bytesPerStep"] / onebit["bytesPerStep"] >= 25
    assert test_accuracy(fitted["one_bit"], digits) >= test_accuracy(fitted["sync"], digits) - 0.03


def test_sync_two_workers_with_plain_sgd_take_the_full_batch_gradient_step(spark, digits):
    """2 workers, each with its whole half in one batch, under plain SGD == full-batch gradient descent in one
    process: equal halves, so the mean of the workers' mean gradients is the mean over all rows. SGD's step is
    proportional to the gradient, so a backend that summed the workers' gradients (a step twice as long)
    fails here, where Adam (the test below) divides the gradient's scale out."""
    from pyspark.ml.linalg import Vectors

    from irbis.models import build_model

    xtr, xte, ytr, _ = digits
    n = len(ytr) // 4 * 4  # even halves of even input partitions: the workers' rows are equal in number
    df = spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(xtr[:n], ytr[:n])], ["features", "label"])
    steps, lr = 8, 0.5
    dist = estimator(optimizer="sgd", learningRate=lr, epochs=steps, batchSize=n, validationFraction=0.0,
                     engine="torch").fit(df)
    model = build_model("mlp", **json.loads(MLP)).train()
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.tensor(xtr[:n], dtype=torch.float32), torch.tensor(ytr[:n])
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert float((torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - start).abs().max()) > 0.05
    probe = xte[:64].astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(probe)).numpy()
    got = np.stack(dist.transform(pd.DataFrame({"features": list(probe)}))["prediction"].map(np.asarray))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_sync_two_workers_match_one_process_with_doubled_batch(fitted, digits):
    """The Adam run (its optimizer's path): as accurate as one process on batches of twice the size. Adam is
    blind to the gradient's scale; the plain-SGD test above checks that the workers average."""
    from irbis.models import build_model

    xtr, xte, ytr, yte = digits
    model = build_model("mlp", **json.loads(MLP)).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = torch.tensor(xtr, dtype=torch.float32), torch.tensor(ytr)
    g = torch.Generator().manual_seed(0)
    keep = torch.randperm(len(y), generator=g)[: int(len(y) * 0.9)]  # same amount of training rows
    x, y = x[keep], y[keep]
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(y), generator=g).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    ref_acc = float((model(torch.tensor(xte, dtype=torch.float32)).argmax(1).numpy() == yte).mean())
    with torch.no_grad():
        ref_loss = float(torch.nn.functional.cross_entropy(model(x), y))
    dist = fitted["sync"]
    assert abs(test_accuracy(dist, digits) - ref_acc) <= 0.03
    assert 0.5 < dist.training_summary[-1]["loss"] / ref_loss < 2.0


def test_bad_inputs_fail_before_training(spark, train_df):
    short = spark.createDataFrame([([1.0, 2.0], 0.0), ([1.0], 1.0)], ["features", "label"])
    with pytest.raises(ValueError, match="same length"):
        estimator(network="mlp", networkOptions='{"in_features": 2, "hidden": 4, "out_features": 2}').fit(short)
    nulls = spark.createDataFrame([([1.0, 2.0], 0.0), ([1.0, 3.0], None)], "features array<double>, label double")
    with pytest.raises(ValueError, match="null"):
        estimator(networkOptions='{"in_features": 2, "hidden": 4, "out_features": 2}').fit(nulls)
    text = spark.createDataFrame([([1.0, 2.0], "cat")], ["features", "label"])
    with pytest.raises(TypeError, match="StringIndexer"):
        estimator().fit(text)
    with pytest.raises(ValueError, match="at least 10 outputs"):
        estimator(networkOptions='{"in_features": 64, "hidden": 8, "out_features": 5}').fit(train_df)
    with pytest.raises(ValueError, match="inputCol 'features'"):
        estimator(networkOptions='{"in_features": 60, "hidden": 8, "out_features": 10}').fit(train_df)
    with pytest.raises(ValueError, match="only 2 tasks"):
        estimator(numWorkers=3).fit(train_df)
    with pytest.raises(ValueError, match="Param strategy='nope' is not allowed; expected one of 'sync'"):
        estimator(strategy="nope")


def test_estimator_params_persist_as_json(tmp_path):
    est = estimator(strategy="block_momentum", strategyOptions='{"blockSize": 3}', checkpointInterval=10)
    est.save(str(tmp_path / "est"))
    loaded = TorchEstimator.load(str(tmp_path / "est"))
    assert loaded.getStrategyOptions() == '{"blockSize": 3}' and loaded.getCheckpointInterval() == 10
    with pytest.raises(ValueError, match="cannot be saved"):
        TorchEstimator(network=lambda: torch.nn.Linear(64, 10)).save(str(tmp_path / "lambda"))
