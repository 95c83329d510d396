"""TorchEstimator with vector labels (multi-label, soft and vector targets) and several input columns, each
compared with a plain PyTorch loop on the same generated data, split and epochs."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from pyspark.ml.linalg import Vectors

from irbis.ml import TorchEstimator, TorchModel
from irbis.models import build_model
from irbis.serving.predictor import compile_stages
from irbis.spark.targets import vote_labels
from irbis.spark.tensors import tensor_bytes_column
from tests.multi_input_networks import patch_and_meta, two_inputs

pytestmark = pytest.mark.spark

N_TRAIN, N_TEST, FEATURES, CLASSES, EPOCHS, LR = 1200, 400, 8, 4, 12, 1e-2
MLP = {"in_features": FEATURES, "hidden": 32, "out_features": CLASSES}


@pytest.fixture(scope="module")
def data():
    """Features, and each row's votes of 10 annotators over 4 classes: class c is seen by each annotator with
    probability sigmoid(3 * x @ w_c) (the known rule), so the votes' readings differ but share one source."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N_TRAIN + N_TEST, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES, CLASSES))
    votes = rng.binomial(10, 1 / (1 + np.exp(-3 * x @ w / np.sqrt(FEATURES))))
    return x, votes, w


def frame(spark, columns):
    """A two-partition DataFrame of the training rows of ``columns`` (name -> per-row values)."""
    names = list(columns)
    rows = list(zip(*(columns[n] for n in names)))
    return spark.createDataFrame(rows, names).repartition(2)


def plain_fit(make_net, loss_fn, xs, y, epochs=EPOCHS, batch=64, lr=LR):
    """Plain PyTorch: Adam, seeded shuffles, ``batch`` rows a step (two workers of 32 under sync)."""
    torch.manual_seed(0)
    net = make_net()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    xs = [torch.as_tensor(x) for x in xs]
    y = torch.as_tensor(y)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=g)
        for i in range(0, len(y), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            loss_fn(net(*[x[idx] for x in xs]), y[idx]).backward()
            opt.step()
    return net.eval()


def estimator(**kw):
    base = dict(network="mlp", networkOptions=json.dumps(MLP), epochs=EPOCHS, batchSize=32, numWorkers=2,
                learningRate=LR, showProgress=False, engine="torch")
    return TorchEstimator(**{**base, **kw})


def predict(model, **columns):
    out = model.transform(pd.DataFrame({k: list(v) for k, v in columns.items()}))
    return np.stack(out[model.getOutputCol()].map(np.asarray))


def mlp():
    return build_model("mlp", **MLP)


def test_multi_label_from_votes_learns_as_plain_pytorch_and_predicts_probabilities(spark, data):
    """The margin is measured: the plain loop scores 0.906-0.911 over four orders of the same rows, a two-worker
    run 0.904; targets whose columns slip by one (the bug this guards) score 0.50."""
    x, votes, _ = data
    df = frame(spark, {"features": [Vectors.dense(r) for r in x[:N_TRAIN]], "votes": votes[:N_TRAIN].tolist()})
    df = df.withColumn("label", vote_labels("votes", "multi_label", min_votes=5))
    model = estimator(loss="bce").fit(df)
    target = (votes >= 5).astype(np.float32)
    probs = predict(model, features=x[N_TRAIN:])
    assert probs.shape == (N_TEST, CLASSES) and probs.min() >= 0 and probs.max() <= 1
    acc = ((probs > 0.5) == target[N_TRAIN:]).mean()
    plain = plain_fit(mlp, torch.nn.functional.binary_cross_entropy_with_logits, [x[:N_TRAIN]], target[:N_TRAIN])
    with torch.no_grad():
        ref = ((plain(torch.as_tensor(x[N_TRAIN:])) > 0).numpy() == target[N_TRAIN:]).mean()
    assert ref > 0.85 and acc >= ref - 0.02, (acc, ref)


def test_soft_targets_from_votes_learn_the_likeliest_class_as_plain_pytorch(spark, data):
    x, votes, w = data
    has_votes = votes.sum(1) > 0
    x, votes = x[has_votes], votes[has_votes]
    n = N_TRAIN
    df = frame(spark, {"features": [r.tolist() for r in x[:n]], "votes": votes[:n].tolist()})
    model = estimator(loss="soft_cross_entropy").fit(df.withColumn("label", vote_labels("votes", "soft")))
    soft = (votes / votes.sum(1, keepdims=True)).astype(np.float32)
    majority = (x[n:] @ w).argmax(1)  # the class the annotators most likely vote for (the known rule)
    acc = (predict(model, features=x[n:]).argmax(1) == majority).mean()
    plain = plain_fit(mlp, torch.nn.functional.cross_entropy, [x[:n]], soft[:n])
    with torch.no_grad():
        ref = (plain(torch.as_tensor(x[n:])).argmax(1).numpy() == majority).mean()
    assert ref > 0.6 and acc >= ref - 0.01, (acc, ref)


def test_vector_regression_with_mse_fits_as_plain_pytorch(spark, data):
    x, _, w = data
    y = (x @ w / np.sqrt(FEATURES)).astype(np.float32)
    df = frame(spark, {"features": [Vectors.dense(r) for r in x[:N_TRAIN]],
                       "label": [Vectors.dense(r) for r in y[:N_TRAIN]]})
    model = estimator(loss="mse").fit(df)

    def r2(pred):
        return 1 - ((pred - y[N_TRAIN:]) ** 2).sum() / ((y[N_TRAIN:] - y[N_TRAIN:].mean(0)) ** 2).sum()

    plain = plain_fit(mlp, torch.nn.functional.mse_loss, [x[:N_TRAIN]], y[:N_TRAIN])
    with torch.no_grad():
        ref = r2(plain(torch.as_tensor(x[N_TRAIN:])).numpy())
    assert ref > 0.9 and r2(predict(model, features=x[N_TRAIN:])) >= ref - 0.01


def test_two_input_columns_learn_as_plain_pytorch_and_survive_save_and_load(spark, data, tmp_path):
    x, _, w = data
    a, b = x[:, :5], x[:, 5:]
    label = (x @ w[:, :3]).argmax(1)
    df = frame(spark, {"a": [r.tolist() for r in a[:N_TRAIN]], "b": [Vectors.dense(r) for r in b[:N_TRAIN]],
                       "label": label[:N_TRAIN].tolist()})
    est = estimator(network="tests.multi_input_networks:two_inputs", networkOptions="{}")
    model = est.setInputCols(["a", "b"]).fit(df)
    assert model.getInputCols() == ["a", "b"] and model.getInputShapes() == [[5], [3]]
    model.write().overwrite().save(str(tmp_path / "two"))
    loaded = TorchModel.load(str(tmp_path / "two"))
    pred = predict(loaded, a=a[N_TRAIN:], b=b[N_TRAIN:])
    np.testing.assert_allclose(pred, predict(model, a=a[N_TRAIN:], b=b[N_TRAIN:]), atol=1e-5)
    served = compile_stages(str(tmp_path / "two")).predict({"a": a[N_TRAIN:N_TRAIN + 5].tolist(),
                                                           "b": b[N_TRAIN:N_TRAIN + 5].tolist()})
    np.testing.assert_allclose(np.array(served["prediction"]), pred[:5], atol=1e-5)  # serving: no Spark
    acc = (pred.argmax(1) == label[N_TRAIN:]).mean()
    plain = plain_fit(two_inputs, torch.nn.functional.cross_entropy, [a[:N_TRAIN], b[:N_TRAIN]],
                      torch.as_tensor(label[:N_TRAIN]))
    with torch.no_grad():
        ref = (plain(torch.as_tensor(a[N_TRAIN:]), torch.as_tensor(b[N_TRAIN:])).argmax(1).numpy()
               == label[N_TRAIN:]).mean()
    assert ref > 0.85 and acc >= ref - 0.01, (acc, ref)


@pytest.mark.slow  # the heaviest fit here (48 epochs for both to converge)
def test_a_tensor_column_beside_a_vector_column_learns_as_plain_pytorch(spark, data):
    """The margin is measured, not a run's luck: the plain loop itself scores 0.93-0.95 over four orders of
    the same rows, a two-worker run of 32 rows each has taken 0.92, and a network that loses either input (the
    wiring bug this guards) scores 0.54 (no patch) or 0.69 (no meta). 0.05 below the plain loop lies between."""
    x, _, _ = data
    rng = np.random.default_rng(1)
    patch = rng.normal(size=(len(x), 1, 4, 4)).astype(np.float32)
    meta = x[:, :3]
    score = np.stack([patch[:, 0, :2, :2].sum((1, 2)), patch[:, 0, 2:, 2:].sum((1, 2)), 2 * meta[:, 0]], 1)
    label = score.argmax(1)
    df = frame(spark, {"p": patch[:N_TRAIN].tolist(), "m": meta[:N_TRAIN].tolist(), "label": label[:N_TRAIN].tolist()})
    df = tensor_bytes_column(df, "p", "patch").withColumnRenamed("m", "meta")  # tensor bytes, and numbers
    est = estimator(network="tests.multi_input_networks:patch_and_meta", networkOptions="{}", epochs=EPOCHS * 4)
    model = est.setInputCols(["patch", "meta"]).setInputShapes([[1, 4, 4], [3]]).fit(df)
    test = spark.createDataFrame(list(zip(patch[N_TRAIN:].tolist(), meta[N_TRAIN:].tolist())), ["p", "m"])
    test = tensor_bytes_column(test, "p", "patch").withColumnRenamed("m", "meta")
    out = model.transform(test.select("patch", "meta")).toPandas()  # no shuffle: the rows in their order
    acc = (np.stack(out["prediction"].map(np.asarray)).argmax(1) == label[N_TRAIN:]).mean()
    plain = plain_fit(patch_and_meta, torch.nn.functional.cross_entropy, [patch[:N_TRAIN], meta[:N_TRAIN]],
                      torch.as_tensor(label[:N_TRAIN]), epochs=EPOCHS * 4)
    with torch.no_grad():
        ref = (plain(torch.as_tensor(patch[N_TRAIN:]), torch.as_tensor(meta[N_TRAIN:])).argmax(1).numpy()
               == label[N_TRAIN:]).mean()
    assert ref > 0.8 and acc >= ref - 0.05, (acc, ref)


def test_multi_label_under_a_parameter_server_learns(spark, data):
    x, votes, _ = data
    target = (votes >= 5).astype(np.float32)
    df = frame(spark, {"features": [r.tolist() for r in x[:N_TRAIN]], "label": target[:N_TRAIN].tolist()})
    model = estimator(loss="bce", strategy="downpour", epochs=EPOCHS * 2).fit(df)
    acc = ((predict(model, features=x[N_TRAIN:]) > 0.5) == target[N_TRAIN:]).mean()
    assert acc > 0.85


def test_a_label_of_another_width_than_the_output_is_named(spark, data):
    x, votes, _ = data
    tags = (votes[:200, :3] >= 5).astype(float).tolist()
    df = frame(spark, {"features": [r.tolist() for r in x[:200]], "tags": tags})
    with pytest.raises(ValueError, match=r"labelCol 'tags' holds vectors of 3 values but the network outputs \(4,\)"):
        estimator(loss="bce", labelCol="tags", epochs=1).fit(df)


def test_vector_labels_with_cross_entropy_point_to_the_vector_losses(spark, data):
    x, votes, _ = data
    df = frame(spark, {"features": [r.tolist() for r in x[:200]], "label": votes[:200].tolist()})
    with pytest.raises(ValueError, match="labelCol 'label' holds vectors of 4 values.*soft_cross_entropy"):
        estimator(epochs=1).fit(df)


def test_input_col_and_input_cols_are_exclusive():
    with pytest.raises(ValueError, match="inputCol and inputCols are exclusive"):
        TorchEstimator(inputCol="x", inputCols=["a", "b"])
    est = TorchEstimator(inputCol="x")
    with pytest.raises(ValueError, match="exclusive"):
        est.setInputCols(["a", "b"])


def test_vote_readings_agree_with_numpy(spark):
    votes = [[3, 1, 0, 6], [0, 0, 0, 0], [2, 2, 5, 1]]
    df = spark.createDataFrame([(v,) for v in votes], ["votes"])
    rows = df.select(vote_labels("votes", "majority").alias("m"), vote_labels("votes", "soft").alias("s"),
                     vote_labels("votes", "multi_label", min_votes=2).alias("ml")).collect()
    v = np.array(votes, float)
    assert [r.m for r in rows] == [3, None, 2]
    np.testing.assert_allclose(rows[0].s, v[0] / v[0].sum(), rtol=1e-6)
    assert rows[1].s is None
    assert [list(r.ml) for r in rows] == (v >= 2).astype(float).tolist()


def test_input_cols_that_cannot_be_joined_are_named_before_training(spark):
    df = spark.createDataFrame([([1.0, 2.0], [0.5, 0.5, 0.5], 1)] * 4, ["a", "b", "label"])
    df = tensor_bytes_column(df, "b", "b_bytes", "uint8")
    est = estimator(network="tests.multi_input_networks:two_inputs", networkOptions="{}", epochs=1)
    with pytest.raises(ValueError, match=r"inputCols \['a', 'b_bytes'\] mix numbers \(\['a'\]\) and tensor bytes"):
        est.setInputCols(["a", "b_bytes"]).setInputDtype("uint8").fit(df)
    with pytest.raises(ValueError, match=r"inputShapes gives column 'b' the shape \[2, 2\] \(4 values\) but its rows "
                                         r"hold 3"):
        est.setInputCols(["a", "b"]).setInputShapes([[2], [2, 2]]).setInputDtype("float32").fit(df)
    with pytest.raises(ValueError, match=r"inputShape.*unset with inputCols \['a', 'b'\]"):
        est.setInputShape([5]).fit(df)
