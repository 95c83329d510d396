"""Spark Connect: images, fused stages, TorchEstimator, and the classic-only features' errors on an sc:// session."""
from __future__ import annotations

import contextlib
import time

import pytest

from connect_mode import connect_mode

pytestmark = pytest.mark.spark


def _rows(df):
    return sorted((r.path, r.error, None if r.image is None else (r.image.height, r.image.width, bytes(r.image.data)))
                  for r in df.collect())


def test_read_images_on_connect_equals_classic(spark, connect, tiny_images, tmp_path):
    from irbis.spark.images import read_images

    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    paths = [str(p) for p in tiny_images.values()] + [str(tmp_path / "broken.jpg")]
    expected = _rows(read_images(paths, spark=spark))
    with connect_mode():
        found = _rows(read_images(paths, spark=connect))
    assert found == expected and sum(r[1] is not None for r in found) == 1


def test_fused_pipeline_on_connect(spark, connect, tiny_images):
    import numpy as np
    import torch

    from irbis.ml import ImageTransformer, TorchModel, fuse
    from irbis.spark.images import read_images

    torch.manual_seed(0)
    small = ImageTransformer(inputCol="image", outputCol="small").resize(16, 16).colorFormat("RGB")
    net = TorchModel.from_module(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(768, 3)),
                                 inputCol="small", outputCol="scores", inputShape=[3, 16, 16])
    model = fuse([small, net])
    paths = [str(p) for p in tiny_images.values()]
    expected = {r.path: r.scores.toArray() for r in model.transform(read_images(paths, spark=spark)).collect()}
    with connect_mode():
        found = {r.path: r.scores.toArray()
                 for r in model.transform(read_images(paths, spark=connect)).collect()}
    assert found.keys() == expected.keys()
    for path, scores in expected.items():
        np.testing.assert_allclose(found[path], scores, rtol=1e-5, atol=1e-6)


def test_classic_only_features_say_so(connect):
    from irbis.spark.images import ImageReadStats
    from irbis.spark.session import ClassicOnlyError, is_connect

    with connect_mode():
        assert is_connect(connect) and is_connect(connect.range(1))
        with pytest.raises(ClassicOnlyError, match="ImageReadStats needs accumulators"):
            ImageReadStats(connect)


def test_default_parallelism_is_known_on_connect(spark, connect):
    from irbis.spark.resources import default_parallelism

    expected = default_parallelism(spark)  # spark.default.parallelism of the test run's session
    with connect_mode():
        assert default_parallelism(connect) == expected == 2


def test_get_spark_asks_a_connect_client_for_the_server_url(connect):
    from irbis.spark.session import get_spark

    with connect_mode(), pytest.raises(RuntimeError,
                                       match="Spark Connect client.*sc:// URL instead of master 'local.2.'"):
        get_spark("local[2]")


# -- TorchEstimator ------------------------------------------------------------------------------
def _digits_frames(spark, connect):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x / 16, y, test_size=0.2, stratify=y, random_state=0)
    rows = [(a.tolist(), int(b)) for a, b in zip(xtr, ytr)]
    schema = "features array<double>, label int"
    classic = spark.createDataFrame(rows, schema)
    with connect_mode():
        remote = connect.createDataFrame(rows, schema)
    return classic, remote, xte, yte


def _digits_estimator(**kw):
    from irbis.ml import TorchEstimator

    base = dict(network="mlp", networkOptions='{"in_features": 64, "hidden": 64, "out_features": 10}',
                epochs=6, batchSize=32, numWorkers=2, learningRate=3e-3, showProgress=False)
    return TorchEstimator(**{**base, **kw})


def _accuracy(model, xte, yte):
    import numpy as np
    import pandas as pd

    out = model.transform(pd.DataFrame({"features": list(xte.astype(np.float32))}))
    return float((np.stack(out["prediction"].map(np.asarray)).argmax(1) == yte).mean())


def test_torch_estimator_fits_on_connect_as_on_classic(spark, connect):
    classic, remote, xte, yte = _digits_frames(spark, connect)
    expected = _accuracy(_digits_estimator().fit(classic), xte, yte)
    with connect_mode():
        model = _digits_estimator(showProgress=True).fit(remote)  # no progress bar there: logged, not failed
    found = _accuracy(model, xte, yte)
    assert expected >= 0.88 and found >= 0.88 and abs(found - expected) <= 0.04, (expected, found)
    assert [r["epoch"] for r in model.training_summary] == list(range(1, 7))


def test_torch_estimator_bad_data_raises_the_same_error_on_connect(spark, connect):
    from irbis.errors import ColumnNotFoundError

    classic, remote, _, _ = _digits_frames(spark, connect)
    few_outputs = dict(networkOptions='{"in_features": 64, "hidden": 8, "out_features": 5}', epochs=1)
    with pytest.raises(ValueError) as on_classic:
        _digits_estimator(**few_outputs).fit(classic)
    with connect_mode(), pytest.raises(ValueError) as on_connect:
        _digits_estimator(**few_outputs).fit(remote)
    assert type(on_connect.value) is type(on_classic.value) is ValueError
    assert str(on_connect.value) == str(on_classic.value)
    assert "labelCol 'label' has class indices up to 9; it needs at least 10 outputs" in str(on_connect.value)
    assert on_connect.value.column == "label" and on_connect.value.expected == 10
    with connect_mode(), pytest.raises(ColumnNotFoundError, match="inputCol 'pixels' not found"):
        _digits_estimator(inputCol="pixels").fit(remote)
    with connect_mode(), pytest.raises(ValueError, match="only 2 tasks"):
        _digits_estimator(numWorkers=3).fit(remote)
    with connect_mode(), pytest.raises(ValueError, match="placement=.driver. .parameter-server shards on the driver. "
                                                         "needs a classic session"):
        _digits_estimator(strategy="downpour", strategyOptions='{"placement": "driver"}').fit(remote)


def _held_until(release: str):
    """A UDF whose tasks wait until the file ``release`` exists (a Spark task on this machine sees the test's
    files), then give their input back; failing loudly if nothing releases them."""
    from pyspark.sql import functions as F

    def wait(i):
        import os
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(release):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test did not release the tasks ({release}) within 120 s")
            time.sleep(0.01)
        return i
    return F.udf(wait, "long")


@pytest.mark.parametrize("remote", [False, True], ids=["classic", "connect"])
def test_the_progress_bar_follows_the_jobs_of_its_block(spark, connect, remote, tmp_path):
    """On Connect the bar sees a job only through the progress reports the server sends while it runs, so the
    job's four tasks wait until a report of their stage has reached the client (a handler of the test's own
    releases them); the final report then completes the bar. On classic the bar polls Spark's status tracker,
    and the test waits until it has seen the job end. Neither depends on how long the tasks take."""
    from irbis.demo.job_progress import spark_progress

    session = connect if remote else spark
    mode = connect_mode() if remote else contextlib.nullcontext()
    release = tmp_path / "release"

    def reported(stages, inflight_tasks, operation_id, done):
        if any(stage.num_tasks for stage in stages or ()):
            release.touch()
    if remote:
        session.registerProgressHandler(reported)
    else:
        release.touch()  # the status tracker sees the job whatever its tasks' length
    try:
        with mode, spark_progress(session, "count", images=100, enabled=True, interval=0.05) as bar:
            assert bar.n == 0
            session.range(0, 4, 1, 4).select(_held_until(str(release))("id").alias("s")).collect()
            deadline = time.monotonic() + 60
            while bar.n < 100 and time.monotonic() < deadline:  # the classic bar polls in its own thread
                time.sleep(0.05)
            assert release.exists()
            assert bar.n == 100, "the bar did not see every task of the block's job finish before the block ended"
    finally:
        if remote:
            session.removeProgressHandler(reported)


def test_two_input_columns_and_multi_label_votes_fit_on_connect(connect):
    import numpy as np
    import pandas as pd

    from irbis.spark.targets import vote_labels

    rng = np.random.default_rng(0)
    x = rng.normal(size=(700, 8)).astype(np.float32)
    votes = rng.binomial(10, 1 / (1 + np.exp(-3 * x @ rng.normal(size=(8, 3)) / np.sqrt(8))))
    rows = [(r[:5].tolist(), r[5:].tolist(), v.tolist()) for r, v in zip(x[:500], votes[:500])]
    with connect_mode():
        df = connect.createDataFrame(rows, "a array<double>, b array<double>, votes array<int>")
        df = df.withColumn("tags", vote_labels("votes", "multi_label", min_votes=5))
        est = _digits_estimator(network="tests.multi_input_networks:two_inputs", networkOptions="{}", loss="bce",
                                labelCol="tags", epochs=12, learningRate=1e-2)
        model = est.setInputCols(["a", "b"]).fit(df)
    out = model.transform(pd.DataFrame({"a": list(x[500:, :5]), "b": list(x[500:, 5:])}))
    probs = np.stack(out["prediction"].map(np.asarray))
    assert model.getInputShapes() == [[5], [3]] and probs.min() >= 0 and probs.max() <= 1
    assert ((probs > 0.5) == (votes[500:] >= 5)).mean() > 0.8
