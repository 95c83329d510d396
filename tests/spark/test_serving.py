"""Serving pipelines fitted and saved by Spark: the answers over HTTP equal ``PipelineModel.transform``.

The servers read the saved folders without Spark; Spark only fits, saves and gives the expected rows.
"""
from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.feature import SQLTransformer, VectorAssembler

from irbis.errors import NoKernelError
from irbis.ml.image_featurizer import ImageFeaturizer
from irbis.serving.predictor import load_predictor
from irbis.serving.server import BackgroundServer, build_app
from irbis.spark.images import read_images
from irbis.spark.standalone import free_port

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


def _rows(n: int, seed: int) -> list[tuple[float, float, float]]:
    return [tuple(float(v) for v in r) for r in np.random.default_rng(seed).normal(size=(n, 3))]


def _save_tabular(spark, path: str) -> str:
    """VectorAssembler + a three-class LogisticRegression, fitted and saved to ``path``."""
    rows = [(a, b, c, int(a + 0.5 * b > 0) + int(c > 0.8)) for a, b, c in _rows(120, 0)]
    frame = spark.createDataFrame(rows, "a double, b double, c double, y int")
    stages = [VectorAssembler(inputCols=["a", "b", "c"], outputCol="features"),
              LogisticRegression(labelCol="y", regParam=0.1)]
    Pipeline(stages=stages).fit(frame).write().overwrite().save(path)
    return path


@pytest.fixture(scope="module")
def tabular(spark, tmp_path_factory):
    return _save_tabular(spark, str(tmp_path_factory.mktemp("tabular") / "model"))


def test_tabular_answers_equal_transform(spark, tabular):
    rows = _rows(20, 1)
    expected = (PipelineModel.load(tabular).transform(spark.createDataFrame(rows, "a double, b double, c double"))
                .select("probability", "rawPrediction", "prediction").collect())
    with BackgroundServer(build_app(tabular)) as url:
        answer = httpx.post(f"{url}/predict", json=[dict(zip("abc", r)) for r in rows]).json()
        single = httpx.post(f"{url}/predict", json=dict(zip("abc", rows[0]))).json()
    assert len(answer) == 20 and single == answer[0]
    assert list(single) == ["rawPrediction", "probability", "prediction"]  # the last stage's; no "features"
    for got, want in zip(answer, expected):
        np.testing.assert_allclose(got["probability"], want.probability.toArray(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got["rawPrediction"], want.rawPrediction.toArray(), rtol=1e-9)
        assert got["prediction"] == want.prediction


def test_mixed_pipeline_answers_equal_transform(spark, tmp_path):
    """Strings, a missing value, scaling and a forest: every SparkML kernel on the request path."""
    from pyspark.ml.classification import RandomForestClassifier
    from pyspark.ml.feature import Imputer, OneHotEncoder, StandardScaler, StringIndexer

    rng = np.random.default_rng(3)
    colours = ["red", "green", "blue"]
    rows = [(colours[i % 3], None if i % 7 == 0 else float(x), float(z), int(x + (i % 3 == 1) > 0.3))
            for i, (x, z) in enumerate(rng.normal(size=(90, 2)))]
    frame = spark.createDataFrame(rows, "colour string, x double, z double, y int")
    stages = [StringIndexer(inputCol="colour", outputCol="ci"),
              OneHotEncoder(inputCol="ci", outputCol="co"),
              Imputer(inputCols=["x"], outputCols=["xi"]),
              VectorAssembler(inputCols=["co", "xi", "z"], outputCol="raw"),
              StandardScaler(inputCol="raw", outputCol="features", withMean=True),
              RandomForestClassifier(labelCol="y", numTrees=5, maxDepth=3, seed=1)]
    path = str(tmp_path / "mixed")
    Pipeline(stages=stages).fit(frame).write().save(path)
    queries = [{"colour": c, "x": x, "z": z} for c, x, z, _ in rows[:12]]
    expected = PipelineModel.load(path).transform(frame.limit(12)).select("probability", "prediction").collect()
    with BackgroundServer(build_app(path)) as url:
        answer = httpx.post(f"{url}/predict", json=queries).json()
    for got, want in zip(answer, expected):
        np.testing.assert_allclose(got["probability"], want.probability.toArray(), rtol=1e-9)
        assert got["prediction"] == want.prediction


def test_outputs_and_refused_stage(spark, tabular, tmp_path):
    predictor = load_predictor(tabular, outputs=["prediction"])
    assert predictor.outputs == ["prediction"] and set(predictor.inputs) == {"a", "b", "c"}
    assert load_predictor(tabular).outputs == ["rawPrediction", "probability", "prediction"]
    assert load_predictor(tabular, ["all"]).outputs == ["features", "rawPrediction", "probability", "prediction"]
    with pytest.raises(ValueError, match=r"does not produce; it writes \['features', 'rawPrediction'.*--outputs all"):
        load_predictor(tabular, outputs=["nope"])
    path = str(tmp_path / "sql")
    frame = spark.createDataFrame([(1.0,)], "a double")
    PipelineModel(stages=[SQLTransformer(statement="SELECT a * 2 AS b FROM __THIS__")]).write().save(path)
    assert frame.count() == 1
    with pytest.raises(NoKernelError, match=r"no kernel: SQLTransformer \(SQLTransformer_.*--master") as info:
        load_predictor(path)
    assert info.value.classes == ["SQLTransformer"]


def test_reading_a_saved_pipeline_starts_no_spark(tabular):
    script = ("from pyspark import SparkContext; from irbis.serving.predictor import load_predictor; "
              f"p = load_predictor({tabular!r}); out = p.predict({{'a': [1.0], 'b': [2.0], 'c': [0.5]}}); "
              "print(SparkContext._active_spark_context is None, out['prediction'])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert done.stdout.split()[0] == "True"


def _wait_until_ready(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    """Wait until the server ``proc`` answers ``GET /ready`` with 200. Fail, with its output, when it exits first
    or has not answered after ``timeout`` seconds (a bound for a server that hangs, not a pace it must keep)."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            answer = httpx.get(f"{url}/ready", timeout=30)
            if answer.status_code == 200:
                return
            last = f"HTTP {answer.status_code}: {answer.text[:200]}"
        except httpx.TransportError as err:
            last = f"{type(err).__name__}: {err}"
        time.sleep(0.1)
    what = f"exited with code {proc.returncode}" if proc.poll() is not None else f"is not ready after {timeout:g} s"
    proc.kill()
    output = proc.stdout.read().decode(errors="replace")
    raise AssertionError(f"the server on {url} {what} (last: {last}); its output:\n{output[-3000:]}")


def test_cli_serves_and_stops_on_sigterm(tabular):
    """Depends on the server's readiness (``GET /ready`` answering 200), which the test waits for, failing with the
    server's output if it exits or never gets there; not on how long the CLI takes to start."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IRBIS_SERVE_TOKEN": "t0k"}
    proc = subprocess.Popen([sys.executable, "-m", "irbis.cli", "serve", tabular, "--port", str(port),
                             "--outputs", "prediction"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until_ready(url, proc)
        row = {"a": 1.0, "b": 1.0, "c": 0.0}
        assert httpx.post(f"{url}/predict", json=row, timeout=60).status_code == 401
        answer = httpx.post(f"{url}/predict", json=row, headers={"Authorization": "Bearer t0k"}, timeout=60).json()
        assert list(answer) == ["prediction"]
        proc.send_signal(signal.SIGTERM)
        # uvicorn finishes the accepted requests, then re-raises the signal it caught
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@pytest.fixture(scope="module")
def image_pipeline(spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(8):
        img = rng.integers(0, 60, size=(48, 64, 3), dtype=np.uint8)
        img[:, :, i % 2 * 2] += 150  # blue or red: the class
        cv2.imwrite(str(folder / f"{i}.png"), img)
    images = read_images(str(folder), spark=spark, dropInvalid=True)
    from pyspark.sql import functions as F
    labelled = images.withColumn("y", (F.regexp_extract("path", r"(\d+)\.png$", 1).cast("int") % 2))
    stages = [ImageFeaturizer(inputCol="image", outputCol="f1", cutOutputLayers=1, precision="fp32"),
              LogisticRegression(featuresCol="f1", labelCol="y", regParam=0.1)]
    path = str(tmp_path_factory.mktemp("image") / "model")
    model = Pipeline(stages=stages).fit(labelled)
    model.write().overwrite().save(path)
    expected = {Path(r.path).name: r.probability.toArray()
                for r in model.transform(images).select("path", "probability").collect()}
    return path, folder, expected


def test_image_pipeline_answers_equal_transform(image_pipeline):
    path, folder, expected = image_pipeline
    with BackgroundServer(build_app(path, outputs=["probability", "prediction"])) as url:
        raw = httpx.post(f"{url}/predict", content=(folder / "0.png").read_bytes(),
                         headers={"content-type": "image/png"}, timeout=60).json()
        files = [("image", (n, (folder / n).read_bytes(), "image/png")) for n in ("1.png", "2.png")]
        multi = httpx.post(f"{url}/predict", files=files, timeout=60).json()
        text = base64.b64encode((folder / "3.png").read_bytes()).decode()
        as_json = httpx.post(f"{url}/predict", json={"image": text}, timeout=60).json()
        bad = httpx.post(f"{url}/predict", content=b"\x89PNG\r\n\x1a\nbroken",
                         headers={"content-type": "image/png"}, timeout=60)
    for got, name in [(raw, "0.png"), (multi[0], "1.png"), (multi[1], "2.png"), (as_json, "3.png")]:
        np.testing.assert_allclose(got["probability"], expected[name], atol=1e-5)
    assert bad.status_code == 422 and "undecodable image" in bad.json()["error"]


def test_lone_and_batched_image_requests_give_the_same_answers(image_pipeline):
    """A request on an idle server is decoded and run on one thread; a busy server queues and batches."""
    path, folder, expected = image_pipeline
    app = build_app(path, outputs=["probability", "prediction"])
    names = [f"{i}.png" for i in range(8)]

    def post(url: str, name: str) -> dict:
        return httpx.post(f"{url}/predict", content=(folder / name).read_bytes(),
                          headers={"content-type": "image/png"}, timeout=60).json()
    with BackgroundServer(app) as url:
        lone = [post(url, n) for n in names]
        app.state.batcher._busy += 1  # as if a batch were running: every request takes the queue
        try:
            with ThreadPoolExecutor(8) as pool:
                batched = list(pool.map(lambda n: post(url, n), names))
        finally:
            app.state.batcher._busy -= 1
        rows = httpx.get(f"{url}/metrics").text
    for name, a, b in zip(names, lone, batched):
        np.testing.assert_allclose(a["probability"], expected[name], atol=1e-5)
        np.testing.assert_allclose(b["probability"], a["probability"], atol=1e-5)
        assert a["prediction"] == b["prediction"]
    assert "irbis_batch_rows_sum 16.0" in rows  # both paths count their rows


@pytest.mark.classic_only(reason="the server's Spark path starts an embedded classic session (local[2]), which a "
                                 "Spark Connect client process cannot have")
def test_spark_path_serves_a_stage_without_kernel(spark, tmp_path):
    path = str(tmp_path / "sql")
    stages = [VectorAssembler(inputCols=["a", "b"], outputCol="features"),
              SQLTransformer(statement="SELECT *, a * 2 AS twice FROM __THIS__")]
    PipelineModel(stages=stages).write().save(path)
    predictor = load_predictor(path, spark="local[2]")
    assert predictor.slow and set(predictor.inputs) == {"a", "b"}
    assert predictor.outputs == ["twice"]  # by default the column the last stage adds
    assert load_predictor(path, ["all"], spark="local[2]").outputs == ["features", "twice"]
    with BackgroundServer(build_app(path, outputs=["twice", "features"], spark="local[2]")) as url:
        answer = httpx.post(f"{url}/predict", json=[{"a": 1.5, "b": 2}, {"a": -1, "b": 0}], timeout=120).json()
        ready = httpx.get(f"{url}/ready").json()
    assert answer == [{"twice": 3.0, "features": [1.5, 2.0]}, {"twice": -2.0, "features": [-1.0, 0.0]}]
    assert ready["spark"] is True


@pytest.mark.slow
def test_two_replicas_on_a_local_cluster(cluster_spark, tmp_path):
    from irbis.serving.replicas import start_replicas

    tabular = _save_tabular(cluster_spark, str(tmp_path / "model"))
    rows = _rows(12, 2)
    frame = cluster_spark.createDataFrame(rows, "a double, b double, c double")
    expected = PipelineModel.load(tabular).transform(frame).select("probability", "prediction").collect()
    assert len({r.prediction for r in expected}) > 1  # the rows reach more than one class
    listing = tmp_path / "addresses.txt"
    replicas = start_replicas(tabular, cluster_spark, 2, port=0, outputs=["probability", "prediction"],
                              addresses_file=str(listing))
    try:
        addresses = listing.read_text().split()
        assert len(set(addresses)) == 2 and sorted(addresses) == sorted(replicas.addresses.values())
        queries = [dict(zip("abc", r)) for r in rows]
        answers = [httpx.post(f"http://{a}/predict", json=queries, timeout=60).json() for a in addresses]
        for answer in answers:
            assert len(answer) == len(expected)
            for got, want in zip(answer, expected):
                np.testing.assert_allclose(got["probability"], want.probability.toArray(), rtol=1e-9, atol=1e-12)
                assert got["prediction"] == want.prediction
    finally:
        replicas.stop()
    assert not replicas.job.is_alive()  # the barrier stage ended: the executors are free again
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{addresses[0]}/health", timeout=5)


@pytest.fixture(scope="module")
def text_pipelines(spark, tmp_path_factory):
    """Two saved pipelines on a tiny BERT: a TextEmbedder (with an error column) and a TextClassifierModel."""
    from irbis.ml import TextClassifierModel, TextEmbedder
    from text_networks import tiny_text_network

    texts = ["The tablets eased my migraine within an hour.", "", "Awful.", "Dizzy for two days, then fine. " * 12,
             "No change at all after six weeks on the full dose, and my doctor agreed to switch."]
    frame = spark.createDataFrame([(t,) for t in texts], "review string")
    root = tmp_path_factory.mktemp("text")
    stages = {"embedder": TextEmbedder(network=tiny_text_network("embedding"), inputCol="review", outputCol="e",
                                       errorCol="why", engine="torch"),
              "classifier": TextClassifierModel(network=tiny_text_network("classification"), inputCol="review",
                                                engine="torch")}
    paths, expected = {}, {}
    for name, stage in stages.items():
        model = PipelineModel(stages=[stage])
        paths[name] = str(root / name)
        model.write().save(paths[name])
        expected[name] = PipelineModel.load(paths[name]).transform(frame).collect()
    return texts, paths, expected


def test_text_embedder_served_answers_what_transform_answers(text_pipelines):
    texts, paths, expected = text_pipelines
    with BackgroundServer(build_app(paths["embedder"])) as url:
        answer = httpx.post(f"{url}/predict", json=[{"review": t} for t in texts], timeout=120).json()
        single = httpx.post(f"{url}/predict", json={"review": texts[0]}, timeout=60).json()
        null = httpx.post(f"{url}/predict", json=[{"review": None}, {"review": texts[2]}], timeout=60)
        number = httpx.post(f"{url}/predict", json=[{"review": 12}], timeout=60)
        listed = httpx.post(f"{url}/predict", json={"review": ["a", "b"]}, timeout=60)
        after = httpx.post(f"{url}/predict", json={"review": texts[2]}, timeout=60)
        with ThreadPoolExecutor(len(texts)) as pool:  # concurrent requests, batched as they queue
            concurrent = list(pool.map(lambda t: httpx.post(f"{url}/predict", json={"review": t}, timeout=60).json(),
                                       texts))
    # with length groups, concurrent requests of mixed lengths (several rows, a null among them) are answered alike
    from irbis.serving.app import ServeOptions

    bodies = [{"review": t} for t in texts] + [[{"review": texts[3]}, {"review": None}, {"review": texts[2]}]]
    options = ServeOptions(length_groups=True, max_wait_ms=50)
    with BackgroundServer(build_app(paths["embedder"], options=options)) as url:
        with ThreadPoolExecutor(len(bodies)) as pool:
            grouped = list(pool.map(lambda b: httpx.post(f"{url}/predict", json=b, timeout=60).json(), bodies))
    assert grouped[-1][1] == {"e": None, "why": "null text"}
    for got, want in [*zip(concurrent, answer), *zip(grouped, answer), (grouped[-1][0], answer[3]),
                      (grouped[-1][2], answer[2])]:  # each answer back to its own request
        np.testing.assert_allclose(got["e"], want["e"], atol=1e-5)
    assert list(single) == ["e", "why"]
    for got, want in zip(answer + [single], expected["embedder"] + expected["embedder"][:1]):
        ours, theirs = np.asarray(got["e"]), want.e.toArray()
        assert ours @ theirs / np.linalg.norm(ours) / np.linalg.norm(theirs) >= 0.9999
        assert got["why"] is None
    # a null text: a null embedding and its reason, the other row of the request answered
    assert null.status_code == 200 and null.json()[0] == {"e": None, "why": "null text"}
    np.testing.assert_allclose(null.json()[1]["e"], expected["embedder"][2].e.toArray(), atol=1e-5)
    for refused in (number, listed):
        assert refused.status_code == 422 and "must be a string, found" in refused.json()["error"]
    assert after.status_code == 200  # the server lives on


def test_text_classifier_served_answers_what_transform_answers(text_pipelines):
    texts, paths, expected = text_pipelines
    with BackgroundServer(build_app(paths["classifier"])) as url:
        answer = httpx.post(f"{url}/predict", json=[{"review": t} for t in texts], timeout=120).json()
        null = httpx.post(f"{url}/predict", json=[{"review": texts[0]}, {"review": None}], timeout=60).json()
    assert list(answer[0]) == ["rawPrediction", "probability", "prediction"]
    for got, want in zip(answer, expected["classifier"]):
        np.testing.assert_allclose(got["probability"], want.probability.toArray(), atol=1e-5)
        assert got["prediction"] == want.prediction
    assert null[1] == {"rawPrediction": None, "probability": None, "prediction": None}
    np.testing.assert_allclose(null[0]["probability"], answer[0]["probability"], atol=1e-5)
