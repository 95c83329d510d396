"""A worker process is killed mid-training on local-cluster; Spark retries the barrier stage and
training resumes from the last checkpoint with every epoch run exactly once."""

import io
import json
import os
from functools import partial

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors
from sklearn.datasets import load_digits

from irbis.ml import TorchEstimator
from irbis.train.faults import kill_once

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def killer(ckpt_root: str, marker: str):
    """An ``augment`` callable that kills its Python worker once, after the first checkpoint is written
    (the marker file makes it once per run, across processes)."""

    def kill_once_after_first_checkpoint(batch, rng):
        import glob
        import os
        import signal

        if glob.glob(os.path.join(ckpt_root, "*", "latest.json")):
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return batch
            os.kill(os.getpid(), signal.SIGKILL)  # the whole Python worker dies, as on a lost executor
        return batch

    return kill_once_after_first_checkpoint


def test_killed_worker_resumes_from_checkpoint(cluster_spark, tmp_path):
    x, y = load_digits(return_X_y=True)
    df = cluster_spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(x / 16, y)],
                                       ["features", "label"]).repartition(2)
    ckpt_root, marker = str(tmp_path / "ckpt"), str(tmp_path / "killed")

    est = TorchEstimator(network="mlp", networkOptions=json.dumps({"in_features": 64, "hidden": 32,
                                                                    "out_features": 10}),
                         epochs=6, batchSize=32, numWorkers=2, learningRate=3e-3, validationFraction=0.1,
                         checkpointDir=ckpt_root, checkpointInterval=20, showProgress=False,
                         augment=killer(ckpt_root, marker))
    model = est.fit(df)
    import os

    assert os.path.exists(marker), "the fault was never injected"
    assert est.last_results[0].resumed_from is not None and est.last_results[0].resumed_from % 20 == 0
    epochs = [r["epoch"] for r in model.training_summary]
    assert epochs == list(range(1, 7))
    assert model.training_summary[-1]["accuracy"] > 0.85
    assert np.isfinite(model.training_summary[-1]["loss"])


def test_killed_async_worker_loses_no_parameter_server_update(cluster_spark, tmp_path):
    # Downpour on two executors: a worker process dies after the first checkpoint; the retried stage
    # restores the shards it hosted, and every epoch counts the same pushes, all applied.
    x, y = load_digits(return_X_y=True)
    df = cluster_spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(x / 16, y)],
                                       ["features", "label"]).repartition(2)
    ckpt_root, marker = str(tmp_path / "ckpt"), str(tmp_path / "killed")

    est = TorchEstimator(network="mlp", networkOptions=json.dumps({"in_features": 64, "hidden": 32,
                                                                    "out_features": 10}),
                         strategy="downpour", strategyOptions='{"numShards": 3}', optimizer="sgd",
                         epochs=4, batchSize=16, numWorkers=2, learningRate=0.02, validationFraction=0.1,
                         checkpointDir=ckpt_root, checkpointInterval=30, showProgress=False,
                         augment=killer(ckpt_root, marker))
    model = est.fit(df)
    import os

    assert os.path.exists(marker), "the fault was never injected"
    assert est.last_results[0].resumed_from is not None
    summary = model.training_summary
    assert [r["epoch"] for r in summary] == [1, 2, 3, 4]
    counts = [r["psUpdates"] for r in summary]
    assert all(c["pushed"] == c["applied"] and c["rejected"] == 0 and c["replayed"] == 0 for c in counts)
    assert len({c["applied"] for c in counts}) == 1 and counts[0]["applied"] > 0  # every epoch: every push once
    assert summary[-1]["accuracy"] > 0.85



def test_killed_worker_with_shards_on_the_driver_is_retried_alone_and_rejoins(cluster_spark, tmp_path):
    # placement="driver": an ordinary stage, so Spark retries the dead task alone; the other worker never
    # restarts, the retried one rejoins from the shards' current weights, and no push is lost or doubled
    x, y = load_digits(return_X_y=True)
    df = cluster_spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(x / 16, y)],
                                       ["features", "label"]).repartition(2)
    marker = str(tmp_path / "killed")
    est = TorchEstimator(network="mlp", networkOptions=json.dumps({"in_features": 64, "hidden": 32,
                                                                    "out_features": 10}),
                         strategy="dcasgd", strategyOptions='{"placement": "driver"}', optimizer="sgd",
                         epochs=4, batchSize=16, numWorkers=2, learningRate=0.1, validationFraction=0.1,
                         showProgress=False, augment=partial(kill_once, marker, 80))  # 2nd of ~51-step epochs
    model = est.fit(df)
    import os

    assert os.path.exists(marker), "the fault was never injected"
    assert sorted(r.info["attempt"] for r in est.last_results) == [0, 1]  # one task retried, the other untouched
    summary = model.training_summary
    assert [r["epoch"] for r in summary] == [1, 2, 3, 4]
    assert est.last_results[0].history == est.last_results[1].history
    counts = [r["psUpdates"] for r in summary]
    assert all(c["pushed"] == c["applied"] and c["rejected"] == c["replayed"] == 0 for c in counts)
    assert summary[-1]["accuracy"] > 0.85


def test_killed_worker_resumes_image_training_streamed_from_its_spill(cluster_spark, tmp_path):
    # images streamed from each worker's spill file, augmented per row: a worker dies after the first
    # checkpoint, the retried stage spills its partition again and resumes mid-epoch from the checkpoint
    import cv2
    from skimage import data

    from irbis.kernels.image.decode import array_to_struct
    from irbis.spark.images import IMAGE_STRUCT

    rng = np.random.default_rng(0)
    rows = []
    for label, photo in enumerate([data.chelsea(), data.coffee()]):
        for _ in range(48):
            s = int(rng.integers(100, 300))
            y, x = int(rng.integers(0, photo.shape[0] - s)), int(rng.integers(0, photo.shape[1] - s))
            rows.append((array_to_struct(cv2.resize(np.ascontiguousarray(photo[y:y + s, x:x + s, ::-1]), (40, 40))),
                         label))
    df = cluster_spark.createDataFrame(rows, "image " + IMAGE_STRUCT.simpleString() + ", label int").repartition(2)
    ckpt_root, marker = str(tmp_path / "ckpt"), str(tmp_path / "killed")
    est = TorchEstimator(network="small_cnn", networkOptions='{"num_classes": 2}', inputCol="image",
                         imagePreprocessing="small_cnn_cifar", shuffleBuffer=16,
                         augmentation='[{"op": "flip", "p": 0.5}]', epochs=4, batchSize=8, numWorkers=2,
                         learningRate=3e-3, validationFraction=0.2, checkpointDir=ckpt_root, checkpointInterval=4,
                         showProgress=False, augment=killer(ckpt_root, marker))
    model = est.fit(df)
    import os

    assert os.path.exists(marker), "the fault was never injected"
    assert est.last_results[0].resumed_from is not None and est.last_results[0].resumed_from % 4 == 0
    assert [r["epoch"] for r in model.training_summary] == [1, 2, 3, 4]
    assert model.training_summary[-1]["accuracy"] > 0.8


def test_killed_worker_resumes_training_on_variable_length_rows(cluster_spark, tmp_path):
    # token ids whose length varies by row, in length batches: a worker dies mid-epoch after the first
    # checkpoint (the kill rides on augment, which sequences get before padding), the run resumes from it
    import sys
    from pathlib import Path

    from pyspark.sql.types import ArrayType, DoubleType, IntegerType, StructField, StructType

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "train"))
    from train_helpers import token_task

    x, y = token_task(320)
    schema = StructType([StructField("ids", ArrayType(IntegerType())), StructField("label", DoubleType())])
    df = cluster_spark.createDataFrame([(r.tolist(), float(v)) for r, v in zip(x, y)], schema).repartition(2)
    ckpt_root, marker = str(tmp_path / "ckpt"), str(tmp_path / "killed")
    est = TorchEstimator(network="lstm_classifier", networkOptions='{"vocab_size": 20, "embed": 8, "hidden": 16}',
                         inputCol="ids", epochs=6, batchSize=16, tokenBudget=1024, numWorkers=2, learningRate=1e-2,
                         validationFraction=0.2, checkpointDir=ckpt_root, checkpointInterval=5, showProgress=False,
                         augment=killer(ckpt_root, marker))
    model = est.fit(df)
    import os

    assert os.path.exists(marker), "the fault was never injected"
    assert est.last_results[0].resumed_from is not None and est.last_results[0].resumed_from % 5 == 0
    summary = model.training_summary
    assert [r["epoch"] for r in summary] == list(range(1, 7))
    assert all(1.0 <= r["paddingWaste"] < 1.6 for r in summary)
    assert summary[-1]["accuracy"] > 0.75  # chance is 0.5


def _without_dropout(folder: str, into) -> str:
    """A copy of the encoder folder ``folder`` whose config turns dropout off: the training is then the same
    steps wherever it restarts (a resumed run draws no dropout masks of its own)."""
    import shutil

    into.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        shutil.copy(os.path.join(folder, name), into / name)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (into / "config.json").write_text(json.dumps(config))
    return str(into)


def test_killed_worker_resumes_a_text_fine_tuning_run(cluster_spark, tmp_path):
    # a text encoder fine-tuned by TextClassifier on real reviews, one worker, one epoch: it dies after the first
    # checkpoint, the retried stage tokenizes its texts again and resumes mid-epoch; the fitted model is the one
    # a run that never died trains
    import torch
    from safetensors.torch import load_file

    from irbis.demo.reviews import drug_reviews
    from irbis.ml import TextClassifier
    from text_networks import tiny_text_network

    reviews = drug_reviews().head(48)
    df = cluster_spark.createDataFrame([(str(t), int(s == "positive")) for t, s in
                                        zip(reviews["review"], reviews["sentiment"])],
                                       "text string, label int").repartition(2)
    ckpt_root, marker = str(tmp_path / "ckpt"), str(tmp_path / "killed")
    backbone = _without_dropout(tiny_text_network("embedding"), tmp_path / "encoder")

    def fit():  # after the kill the marker exists: the same augment then lets every batch through
        clf = TextClassifier(backbone=backbone, inputCol="text", numClasses=2, epochs=1, batchSize=8, maxLength=64,
                             numWorkers=1, dropout=0.0, checkpointDir=ckpt_root,
                             checkpointInterval=2, showProgress=False, augment=killer(ckpt_root, marker))
        model = clf.fit(df)
        results = clf.last_estimator.last_results
        return model, results[0], torch.load(io.BytesIO(results[0].state), weights_only=True)

    resumed, result, weights = fit()
    assert os.path.exists(marker), "the fault was never injected"
    assert result.resumed_from is not None and result.resumed_from % 2 == 0
    assert [r["epoch"] for r in resumed.training_summary] == [1]
    uninterrupted, reference, expected = fit()
    assert reference.resumed_from is None
    assert [r["epoch"] for r in uninterrupted.training_summary] == [1]
    assert resumed.training_summary[0]["loss"] == pytest.approx(uninterrupted.training_summary[0]["loss"], rel=1e-6)
    pretrained = load_file(os.path.join(backbone, "model.safetensors"))
    assert not torch.equal(expected["model.bert.pooler.dense.weight"], pretrained["pooler.dense.weight"])  # it trained
    for k in expected:
        assert torch.allclose(weights[k], expected[k], atol=1e-6), k
    rows = df.orderBy("text").limit(4)
    got = [r.probability.toArray() for r in resumed.transform(rows).orderBy("text").collect()]
    want = [r.probability.toArray() for r in uninterrupted.transform(rows).orderBy("text").collect()]
    np.testing.assert_allclose(got, want, atol=1e-6)
