"""Irbis on a Spark standalone cluster of separate processes (a master and two workers): each result
matches the same work on the local session, and a cluster that cannot run Irbis fails with errors that
say why."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from cluster_checks import cat_canvas, digits, estimator, explain, scores, train_frame
from irbis.ml.image_featurizer import ImageFeaturizer
from irbis.spark.standalone import free_port

pytestmark = pytest.mark.cluster


def test_sync_fit_on_the_cluster_scores_as_the_local_fit_does(cluster_app, spark):
    # Same seed, same split of the rows over two workers: the same model up to the order of float sums
    # (other thread counts), which some 250 Adam steps amplify: logits within 15% on average.
    _, _, _, yte = digits()
    local = scores(estimator("sync").fit(train_frame(spark)))  # while the cluster works
    run = cluster_app.result()
    assert run["sync"]["ok"], run["sync"]
    remote = np.load(run["out"] / "sync.npy")
    accuracy = [(out.argmax(1) == yte).mean() for out in (remote, local)]
    agree = (remote.argmax(1) == local.argmax(1)).mean()
    gap = np.abs(remote - local).mean() / np.abs(local).mean()
    print(f"sync: accuracy cluster {accuracy[0]:.4f} local {accuracy[1]:.4f}, agreement {agree:.4f}, "
          f"mean relative gap {gap:.4f}")
    assert accuracy[0] >= 0.9 and abs(accuracy[0] - accuracy[1]) <= 0.015, accuracy
    assert agree >= 0.97 and gap <= 0.15, (agree, gap)


def test_dcasgd_fit_on_the_cluster_learns_as_the_local_fit_does(cluster_app, spark):
    # Asynchronous: the updates' order differs from run to run, so only the accuracy is compared.
    _, _, _, yte = digits()
    local = (scores(estimator("dcasgd").fit(train_frame(spark))).argmax(1) == yte).mean()  # while the cluster works
    run = cluster_app.result()
    assert run["dcasgd"]["ok"], run["dcasgd"]
    remote = (np.load(run["out"] / "dcasgd.npy").argmax(1) == yte).mean()
    print(f"dcasgd: accuracy cluster {remote:.4f} local {local:.4f}")
    assert remote >= 0.85 and remote >= local - 0.05, (remote, local)


def test_image_features_on_the_cluster_equal_the_local_ones(cluster_app, cluster_images):
    # The same stage on a pandas frame of the same files, in this process.
    paths = sorted(cluster_images.iterdir())
    frame = pd.DataFrame({"b": [p.read_bytes() for p in paths]})
    stage = ImageFeaturizer(inputCol="b", outputCol="features", cutOutputLayers=1, engine="torch")
    local = np.stack(stage.transform(frame)["features"])
    run = cluster_app.result()
    assert run["featurize"]["ok"], run["featurize"]
    remote = np.load(run["out"] / "featurize.npy")
    assert remote.shape == local.shape == (6, 1280)
    np.testing.assert_allclose(remote, local, rtol=1e-4, atol=1e-4)
    assert np.ptp(local, axis=0).max() > 0  # the images differ, so the rows do


def test_replicas_on_the_executors_answer_as_the_model_scores(cluster_app):
    # The sync model, saved by the cluster's driver and shipped to the executors (a zip archive), served by two
    # replicas bound to 0.0.0.0: each answers the test digits as the model scores them on the driver.
    run = cluster_app.result()
    assert run["serve"]["ok"], run["serve"]
    answers, expected = np.load(run["out"] / "serve.npy"), np.load(run["out"] / "sync.npy")[:20]
    assert answers.shape == (2, 20, 10)
    for answer in answers:
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)


def test_image_lime_on_the_cluster_equals_the_local_one(cluster_app, spark):
    # The same photograph, model, seed and samples: the same weights, and they point at the cat.
    run = cluster_app.result()
    assert run["lime"]["ok"], run["lime"]
    remote = np.load(run["out"] / "lime.npy")
    local = explain(spark, cat_canvas(run["out"].parent / "local-cat"))
    assert remote.shape == local.shape == (2, remote.shape[1]) and remote.shape[1] >= 4
    np.testing.assert_allclose(remote, local, rtol=1e-3, atol=1e-4)


def test_executors_without_irbis_fail_the_first_job_naming_the_fix(cluster_app):
    # The executor of the other application runs a Python without irbis: the fit's barrier stage
    # cannot unpickle its task.
    result = cluster_app.result()["fit_bare"]
    assert not result["ok"] and result["type"] == "ExecutorImportError", result
    assert "The Spark executors cannot import 'irbis'" in result["message"]
    assert "irbis pack --output" in result["message"] and "environment=" in result["message"]
    # A transform's job on the same executor: the user's action fails with the same cause and fix.
    transform = (cluster_app.result()["out"].parent.parent / "bare" / "out" / "transform_bare.txt").read_text()
    assert "The Spark executors cannot import 'irbis'" in transform, transform[-2000:]
    assert "irbis pack --output" in transform


def test_the_applications_ran_on_both_workers(cluster_app, standalone):
    run = cluster_app.result()
    assert run["master"] == standalone.url and run["executors"] == 2
    assert standalone.wait_for_workers(2, timeout_s=10)["aliveworkers"] == 2


def test_a_master_that_does_not_answer_fails_at_once_naming_the_url():
    # the probe answers before any JVM starts: the error is the probe's, not Spark's after its retries (the
    # subprocess timeout only guards against a hang)
    url = f"spark://127.0.0.1:{free_port()}"
    code = f"import irbis; irbis.get_spark({url!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "SparkContext" not in done.stderr and "py4j" not in done.stderr, done.stderr[-2000:]
    assert f"ConnectionError: Spark master {url} does not answer" in done.stderr, done.stderr[-2000:]


def test_executors_without_irbis_fit_with_the_packed_environment_shipped(cluster_app):
    # irbis pack's PEX shipped by get_spark(environment=...): the executor's Python runs inside it.
    result = cluster_app.result()["fit_packed"]
    assert result["ok"], result
