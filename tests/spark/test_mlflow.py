"""irbis.mlflow: pipelines logged as MLflow models (Spark and pyfunc faces), fits logged as MLflow runs.

Every test tracks into a file store in its own temporary folder; no tracking server.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

mlflow = pytest.importorskip("mlflow")

import torch  # noqa: E402
from pyspark.ml import PipelineModel  # noqa: E402
from pyspark.ml.feature import VectorAssembler  # noqa: E402

import irbis.mlflow  # noqa: E402
from irbis.ml import TorchEstimator  # noqa: E402
from irbis.ml.basic import Repartition  # noqa: E402
from irbis.ml.torch_model import TorchModel  # noqa: E402
from irbis.spark.standalone import free_port  # noqa: E402

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    """A file store in ``tmp_path`` (which MLflow 3 keeps behind MLFLOW_ALLOW_FILE_STORE); no run left active
    afterwards."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    mlflow.set_experiment("irbis-tests")
    yield tmp_path
    while mlflow.active_run() is not None:
        mlflow.end_run()


def _rows(n: int, seed: int) -> list[tuple[float, float, float]]:
    return [tuple(float(v) for v in r) for r in np.random.default_rng(seed).normal(size=(n, 3))]


@pytest.fixture(scope="module")
def pipeline(spark):
    """VectorAssembler (a SparkML stage) then a small network (an Irbis stage): a fitted PipelineModel."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    scorer = TorchModel.from_module(net.eval(), inputCol="features", outputCol="scores", inputShape=[3],
                                    engine="torch")  # eager: no ONNX export in every process that scores
    return PipelineModel([VectorAssembler(inputCols=["a", "b", "c"], outputCol="features"), scorer])


def _expected(spark, model, rows) -> np.ndarray:
    frame = spark.createDataFrame(rows, "a double, b double, c double")
    return np.stack([r.scores.toArray() for r in model.transform(frame).select("scores").collect()])


def test_logged_pipeline_loads_as_spark_and_as_pyfunc_with_equal_outputs(spark, tracking, pipeline):
    rows = _rows(12, 1)
    example = spark.createDataFrame(_rows(8, 2), "a double, b double, c double")
    with mlflow.start_run():
        info = irbis.mlflow.log_model(pipeline, "model", input_example=example)
    expected = _expected(spark, pipeline, rows)

    loaded = irbis.mlflow.load_model(info.model_uri)
    assert isinstance(loaded, PipelineModel)
    np.testing.assert_allclose(_expected(spark, loaded, rows), expected, rtol=1e-6)

    local = Path(mlflow.artifacts.download_artifacts(info.model_uri))
    np.testing.assert_allclose(_expected(spark, PipelineModel.load(str(local / "sparkml")), rows), expected,
                               rtol=1e-6)
    np.testing.assert_allclose(_expected(spark, mlflow.spark.load_model(info.model_uri), rows), expected, rtol=1e-6)

    pyfunc = mlflow.pyfunc.load_model(info.model_uri)
    answer = pyfunc.predict(pd.DataFrame(rows, columns=["a", "b", "c"]))
    assert list(answer.columns) == ["scores"]
    np.testing.assert_allclose(np.stack(answer["scores"].map(np.asarray)), expected, rtol=1e-5, atol=1e-6)

    # signature and input example; network files stored as files of the saved stage, nothing pickled
    assert info.signature is not None
    assert info.signature.inputs.input_names() == ["a", "b", "c"]
    assert info.signature.outputs.input_names() == ["scores"]
    example_doc = json.loads((local / "input_example.json").read_text())
    assert example_doc["columns"] == ["a", "b", "c"] and len(example_doc["data"]) == 5
    files = [p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()]
    assert not [f for f in files if f.endswith((".pkl", ".pickle"))], files
    assert any(f.startswith("sparkml/stages/1_") and "/data/" in f for f in files), files


def test_single_stage_logs_and_answers_all_outputs(spark, tracking, pipeline):
    scorer = pipeline.stages[1]
    rows = [[0.5, -1.0, 2.0], [1.0, 0.0, -0.5]]
    with mlflow.start_run():
        info = irbis.mlflow.log_model(scorer, "scorer", input_example=pd.DataFrame({"features": rows}))
    assert type(irbis.mlflow.load_model(info.model_uri)) is TorchModel
    answer = mlflow.pyfunc.load_model(info.model_uri).predict({"features": rows[0]})
    want = scorer.transform(pd.DataFrame({"features": [np.asarray(rows[0])]}))["scores"][0]
    np.testing.assert_allclose(answer["scores"][0], np.asarray(want), rtol=1e-5)
    everything = mlflow.pyfunc.load_model(info.model_uri, model_config={"outputs": ["all"]})
    assert list(everything.predict({"features": rows[1]}).columns) == ["scores"]


def test_image_pipeline_logs_with_read_images_rows_as_its_example(spark, tracking, tmp_path):
    """A ``read_images`` DataFrame as the input example: its image structs are kept as PNG bytes, the signature
    takes binary images, and the pyfunc answers base64 text, PNG bytes and Spark's image structs alike."""
    import base64

    import cv2

    from irbis.ml.image import UnrollImage
    from irbis.spark.images import read_images

    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.png"), rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8))
    images = read_images(str(folder), spark=spark, dropInvalid=True).orderBy("path")
    model = PipelineModel([UnrollImage(inputCol="image", outputCol="pixels")])
    with mlflow.start_run():
        info = irbis.mlflow.log_model(model, "model", input_example=images)
    expected = np.stack([r.pixels.toArray() for r in model.transform(images).select("pixels").collect()])

    assert info.signature.inputs.input_names() == ["image"]
    assert info.signature.inputs.inputs[0].type.name == "binary"
    local = Path(mlflow.artifacts.download_artifacts(info.model_uri))
    example = json.loads((local / "input_example.json").read_text())
    assert example["columns"] == ["image"] and len(example["data"]) == 3

    pyfunc = mlflow.pyfunc.load_model(info.model_uri)
    files = [(folder / f"{i}.png").read_bytes() for i in range(3)]
    for rows in (pd.DataFrame({"image": [base64.b64encode(f).decode() for f in files]}),
                 pd.DataFrame({"image": files}), images.select("image").toPandas()):
        answer = pyfunc.predict(rows)
        np.testing.assert_array_equal(np.stack(answer["pixels"].map(np.asarray)), expected)


_NO_SPARK_SCRIPT = textwrap.dedent("""
    import json, sys
    import mlflow
    import pandas as pd
    model = mlflow.pyfunc.load_model(sys.argv[1])
    out = model.predict(pd.DataFrame(json.loads(sys.argv[2]), columns=["a", "b", "c"]))
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    print(json.dumps({"scores": [list(map(float, v)) for v in out["scores"]],
                      "context": SparkContext._active_spark_context is not None,
                      "gateway": SparkContext._gateway is not None,
                      "session": SparkSession.getActiveSession() is not None}))
""")


def test_pyfunc_scores_in_a_fresh_process_without_spark(spark, tracking, pipeline):
    rows = _rows(4, 3)
    with mlflow.start_run():
        info = irbis.mlflow.log_model(pipeline, "model")
    local = mlflow.artifacts.download_artifacts(info.model_uri)
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": "--this-would-fail-if-a-jvm-started"}
    done = subprocess.run([sys.executable, "-c", _NO_SPARK_SCRIPT, local, json.dumps(rows)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not (result["context"] or result["gateway"] or result["session"])
    np.testing.assert_allclose(result["scores"], _expected(spark, pipeline, rows), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # a server process: about 15 s on two cores
def test_mlflow_models_serve_answers_without_spark(spark, tracking, pipeline):
    import httpx

    rows = _rows(3, 4)
    with mlflow.start_run():
        info = irbis.mlflow.log_model(pipeline, "model")
    local = mlflow.artifacts.download_artifacts(info.model_uri)
    port = free_port()
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": "--this-would-fail-if-a-jvm-started",
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}  # its uvicorn
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", local, "--env-manager",
                               "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    try:
        deadline, answer = time.monotonic() + 90, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                answer = httpx.post(f"http://127.0.0.1:{port}/invocations", timeout=30,
                                    json={"dataframe_split": {"columns": ["a", "b", "c"], "data": rows}})
                break
            except httpx.TransportError:
                time.sleep(0.3)
        assert answer is not None, server.communicate(timeout=5)[0][-3000:] if server.poll() is not None else "timeout"
        assert answer.status_code == 200, answer.text
        scores = [r["scores"] for r in answer.json()["predictions"]]
        np.testing.assert_allclose(scores, _expected(spark, pipeline, rows), rtol=1e-5, atol=1e-6)
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.classic_only(reason="its pyfunc scores through a local Spark session, which a Spark Connect client "
                                 "process cannot start")
def test_stage_without_kernel_logs_for_spark_with_a_warning(spark, tracking, pipeline):
    model = PipelineModel([Repartition(numPartitions=2), *pipeline.stages])
    with mlflow.start_run():
        with pytest.warns(UserWarning, match="Repartition has no kernel.*Spark session"):
            info = irbis.mlflow.log_model(model, "model")
    rows = _rows(5, 5)
    loaded = irbis.mlflow.load_model(info.model_uri)
    assert [type(s).__name__ for s in loaded.stages] == ["Repartition", "VectorAssembler", "TorchModel"]
    conf = mlflow.models.Model.load(info.model_uri).flavors["irbis"]
    assert conf["kernels"] is False
    answer = mlflow.pyfunc.load_model(info.model_uri).predict(pd.DataFrame(rows, columns=["a", "b", "c"]))
    np.testing.assert_allclose(np.stack(answer["scores"].map(np.asarray)), _expected(spark, pipeline, rows),
                               rtol=1e-5, atol=1e-6)


def test_log_model_refuses_a_sparkml_stage_alone(tracking):
    with pytest.raises(TypeError, match="PipelineModel"):
        irbis.mlflow.log_model(VectorAssembler(inputCols=["a"], outputCol="v"), "model")


# -- tracking a fit -------------------------------------------------------------------------------------
MLP = json.dumps({"in_features": 64, "hidden": 16, "out_features": 10})


def _estimator(**kw):
    base = dict(network="mlp", networkOptions=MLP, epochs=3, batchSize=32, numWorkers=2, learningRate=3e-3,
                validationFraction=0.1, showProgress=False)
    return TorchEstimator(**{**base, **kw})


def _history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_fit_inside_an_active_run_logs_params_metrics_and_loss_curve(tracking, train_df):
    with mlflow.start_run() as run:
        model = _estimator().fit(train_df)
    client = mlflow.MlflowClient()
    data = client.get_run(run.info.run_id).data
    assert data.params["epochs"] == "3" and data.params["strategy"] == "sync" and data.params["network"] == "mlp"
    summary = model.training_summary
    logged = _history(client, run.info.run_id, "loss")
    assert [s for s, _ in logged] == [r["epoch"] for r in summary] == [1, 2, 3]
    assert [v for _, v in logged] == pytest.approx([r["loss"] for r in summary])
    for key in ("validationLoss", "accuracy", "samplesPerSecond"):
        assert [s for s, _ in _history(client, run.info.run_id, key)] == [1, 2, 3], key
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "loss_curve.png" in artifacts
    png = Path(client.download_artifacts(run.info.run_id, "loss_curve.png", str(tracking)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mlflow_run_param_starts_a_run_and_logs_staleness(tracking, train_df):
    assert mlflow.active_run() is None
    est = _estimator(strategy="downpour", optimizer="sgd", learningRate=0.02, validationFraction=0.0,
                     mlflowRun=True)
    est.fit(train_df)
    assert mlflow.active_run() is None  # the run the fit started is ended
    runs = mlflow.search_runs(output_format="list")
    assert len(runs) == 1
    run_id = runs[0].info.run_id
    client = mlflow.MlflowClient()
    assert runs[0].data.params["mlflowRun"] == "True" and runs[0].data.params["strategy"] == "downpour"
    for key in ("loss", "staleness.mean", "staleness.max", "psUpdates.applied"):
        assert [s for s, _ in _history(client, run_id, key)] == [1, 2, 3], key


def test_fit_without_a_run_logs_nothing(tracking, train_df):
    _estimator(epochs=1).fit(train_df)
    assert mlflow.search_runs(output_format="list") == []


def test_second_fit_in_one_run_goes_to_a_nested_run(tracking, train_df):
    with mlflow.start_run() as run:
        _estimator(epochs=1).fit(train_df)
        _estimator(epochs=1, learningRate=1e-2).fit(train_df)
    runs = mlflow.search_runs(output_format="list")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == run.info.run_id]
    assert len(runs) == 2 and len(children) == 1
    assert children[0].data.params["learningRate"] == "0.01"


def test_mlflow_run_without_mlflow_installed_fails_before_training(train_df, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "irbis.mlflow", None)
    with pytest.raises(ImportError, match="mlflowRun=True needs MLflow"):
        _estimator(epochs=1, mlflowRun=True).fit(train_df)


def test_irbis_does_not_import_mlflow():
    code = ("import sys, irbis, irbis.ml, irbis.ml.estimator, irbis.serving.predictor; "
            "print('mlflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_text_pipeline_logs_and_its_pyfunc_answers_what_transform_answers(spark, tracking):
    """A TextEmbedder on a tiny BERT (its network folder logged with the stage) into a logistic regression."""
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression

    from irbis.ml import TextEmbedder
    from text_networks import tiny_text_network

    texts = ["Worked within a day, no side effects.", "Terrible headaches and nausea.", "Great relief.",
             "It did nothing for me and I felt sick.", "Best medicine I have taken.", "Awful, stopped after a week."]
    frame = spark.createDataFrame([(t, float(i % 2)) for i, t in enumerate(texts)], "review string, label double")
    model = Pipeline(stages=[TextEmbedder(network=tiny_text_network("embedding"), inputCol="review",
                                          outputCol="features", engine="torch"),
                             LogisticRegression(maxIter=20)]).fit(frame)
    queries = texts[:3] + ["", None]
    expected = model.transform(spark.createDataFrame([(t,) for t in queries[:4]], "review string")).collect()
    with mlflow.start_run():
        info = irbis.mlflow.log_model(model, "model", input_example=pd.DataFrame({"review": texts[:2]}))
    assert info.signature.inputs.input_names() == ["review"]
    answer = mlflow.pyfunc.load_model(info.model_uri).predict(pd.DataFrame({"review": queries}))
    assert list(answer.columns) == ["rawPrediction", "probability", "prediction"]
    for got, want in zip(answer.itertuples(), expected):
        np.testing.assert_allclose(got.probability, want.probability.toArray(), atol=1e-5)
        assert got.prediction == want.prediction
    # a null text: no embedding, so no prediction (Spark's LogisticRegression fails its task on a null vector)
    assert answer["probability"].iloc[4] is None and np.isnan(answer["prediction"].iloc[4])
