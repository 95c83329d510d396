"""HTTP serving: latency and throughput of ``irbis serve`` beside a straightforward endpoint.

Two pipelines, fitted and saved by Spark once (then served without it):

  tabular  VectorAssembler (16 numeric columns) + LogisticRegression (3 classes)
  image    the demo's shape: ImageFeaturizer (EfficientNet-Lite0, pooled, fp32) + LogisticRegression,
           fitted on and sent the demo's camera-trap frames (``irbis.demo.data``: 320x240 JPEGs)

Each is served two ways, each in its own server process on loopback:

  irbis     ``irbis serve`` (kernels, micro-batching)
  plain     a straightforward Starlette endpoint calling the same compiled pipeline once per request
            (no queue, no batching): what one writes by hand
  mlflow    (tabular) the same pipeline logged with ``irbis.mlflow.log_model`` and served by
            ``mlflow models serve --env-manager local`` (its pyfunc runs the stages' kernels, no JVM), sent
            the same rows as ``dataframe_split`` JSON on ``/invocations``

The load comes from separate processes pinned to the last core (``benchmarks/loadgen.py``: raw
keep-alive HTTP/1.1 sockets, pre-encoded requests), keeping C requests in flight for a fixed time, C
in 1, 16, 128; its own ceiling, against a server that answers at once, is printed first. Reported:
p50 and p99 latency (ms) and requests/s. For the image pipeline the network's own time for one image
(the compiled pipeline called on one decoded image in a fresh process, as a server calls it, median
of 400 calls) is printed beside it, and so
is the time to decode one request image, which every image request pays on top.

Usage: ``python benchmarks/serving.py [--seconds 10] [--quick] [--workers N]``; results are printed
and written to ``benchmarks/results/serving.txt``. ``--mlflow-breakdown`` instead splits a tabular
request's time under ``mlflow models serve`` into MLflow's scoring function, its ``PyFuncModel.predict``,
Irbis's pyfunc and the serving predictor, beside both servers' p50 at 1 client
(``benchmarks/results/serving_mlflow.txt``).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from irbis.spark.standalone import free_port
from provenance import Run

ROOT = Path(__file__).resolve().parents[1]
FEATURES = 16
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 2
#: The packages whose versions the results files' header names.
PACKAGES = ("torch", "pyspark", "numpy", "pyarrow", "onnxruntime", "openvino", "starlette", "uvicorn", "mlflow")


# -- setup: fit and save the pipelines (the only Spark in this benchmark) ----------------------------
def build_pipelines(folder: Path, images: int) -> dict[str, Path]:
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.classification import LogisticRegression
    from pyspark.sql import functions as F

    from irbis.demo.data import build_camera_trap_set
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.images import read_images
    from irbis.spark.session import get_spark

    spark = get_spark("local[2]", app_name="bench-serving", **{"spark.ui.enabled": "false"})
    build_tabular(spark, folder)
    # the demo's camera-trap frames (320x240 JPEGs of real photographs), labelled animal / empty
    build_camera_trap_set(folder / "photos", cameras=2, bursts_per_camera=max(2, images // 4), frames_per_burst=2)
    labelled = read_images(str(folder / "photos"), spark=spark, dropInvalid=True, pathGlobFilter="*.jpg").withColumn(
        "y", F.col("path").contains("/animal/").cast("int"))
    Pipeline(stages=[ImageFeaturizer(inputCol="image", outputCol="f1", cutOutputLayers=1, precision="fp32"),
                     LogisticRegression(featuresCol="f1", labelCol="y", regParam=0.05)]).fit(
        labelled).write().overwrite().save(str(folder / "image"))
    mlflow_model = log_with_mlflow(PipelineModel.load(str(folder / "tabular")), folder)
    spark.stop()
    return {"tabular": folder / "tabular", "image": folder / "image", "tabular-mlflow": mlflow_model}


def build_tabular(spark, folder: Path) -> Path:
    """The tabular pipeline (VectorAssembler over 16 numeric columns + LogisticRegression), fitted and saved."""
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.feature import VectorAssembler

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, FEATURES))
    names = [f"x{i}" for i in range(FEATURES)]
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
    frame = spark.createDataFrame([(*map(float, r), int(t)) for r, t in zip(x, y)], [*names, "y"])
    Pipeline(stages=[VectorAssembler(inputCols=names, outputCol="features"),
                     LogisticRegression(labelCol="y", regParam=0.01)]).fit(frame).write().overwrite().save(
        str(folder / "tabular"))
    return folder / "tabular"


def log_with_mlflow(model, folder: Path) -> Path:
    """``model`` logged by irbis.mlflow to a file store under ``folder``; the local folder of the logged model."""
    import mlflow

    import irbis.mlflow

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this
    mlflow.set_tracking_uri((folder / "mlruns").as_uri())
    with mlflow.start_run():
        info = irbis.mlflow.log_model(model, "model")
    return Path(mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(folder / "mlflow-model")))


# -- servers -----------------------------------------------------------------------------------------
def plain_app(path: str, outputs: list[str]):
    """The straightforward endpoint: parse, call the pipeline once, answer (per request). Its engine
    sessions stop spinning after each run, as ``irbis serve``'s do, so both sides run the network on the
    same engine settings."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from irbis.kernels.engines.ort import set_thread_spinning
    from irbis.serving.codecs import encode_response, parse_files, parse_json
    from irbis.serving.predictor import load_predictor

    set_thread_spinning(False)
    predictor = load_predictor(path, outputs)

    async def predict(request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-type", "").startswith("image/"):
            parsed = parse_files([(None, body)], predictor.inputs)
        else:
            parsed = parse_json(body, predictor.inputs, predictor.nullable)
        out = await run_in_threadpool(predictor.predict, parsed.columns)
        return Response(encode_response(out, parsed.single), media_type="application/json")

    return Starlette(routes=[Route("/predict", predict, methods=["POST"])])


def start_server(kind: str, path: Path, port: int, workers: int = 1) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if kind == "irbis":
        cmd = [sys.executable, "-m", "irbis.cli", "serve", str(path), "--port", str(port),
               "--outputs", "probability,prediction", "--processes", str(workers)]
    elif kind == "mlflow":  # its uvicorn from this environment
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", str(path), "--env-manager", "local",
               "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    else:
        cmd = [sys.executable, __file__, "--plain-server", str(path), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_up(f"http://127.0.0.1:{port}", proc)
    return proc


def _wait_up(url: str, proc: subprocess.Popen) -> None:
    import httpx

    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            httpx.post(f"{url}/predict", content=b"", headers={"content-type": "application/json"})
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


# -- load generator (benchmarks/loadgen.py: raw keep-alive sockets, separate processes) ----------------
def run_load(url: str, bodies: list[tuple[bytes, str]], clients: int, seconds: float,
             path: str = "/predict") -> dict:
    """C requests in flight from one process (two past 16 clients), pinned to the last core."""
    from loadgen import run

    return run(url, bodies, clients, seconds, procs=1 if clients <= 16 else 2, cores=[os.cpu_count() - 1],
               path=path)


def load_ceiling(seconds: float) -> str:
    """The generator's own ceiling: requests/s against a server that answers at once."""
    import multiprocessing as mp

    from loadgen import run, trivial_server

    port = free_port()
    server = mp.get_context("spawn").Process(target=trivial_server, args=(port,), daemon=True)
    server.start()
    try:
        _wait_port(port)
        figures = [run(f"http://127.0.0.1:{port}", [(b"{}", "application/json")], c, seconds / 2,
                       procs=1 if c <= 16 else 2, cores=[os.cpu_count() - 1]) for c in (1, 128)]
    finally:
        server.terminate()
    return (f"load generator ceiling (a server answering at once): {figures[0]['rps']:.0f} req/s at 1 client, "
            f"{figures[1]['rps']:.0f} at 128")


def _wait_port(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


def request_bodies(name: str, folder: Path) -> list[tuple[bytes, str]]:
    if name == "tabular-mlflow":  # the same rows, as MLflow's scoring protocol takes them
        rng = np.random.default_rng(1)
        columns = [f"x{i}" for i in range(FEATURES)]
        return [(json.dumps({"dataframe_split": {"columns": columns, "data": [[float(v) for v in row]]}}).encode(),
                 "application/json") for row in rng.normal(size=(64, FEATURES))]
    if name == "tabular":
        rng = np.random.default_rng(1)
        return [(json.dumps({f"x{i}": float(v) for i, v in enumerate(row)}).encode(), "application/json")
                for row in rng.normal(size=(64, FEATURES))]
    return [(p.read_bytes(), "image/jpeg") for p in _photos(folder)]


def _photos(folder: Path) -> list[Path]:
    return sorted((folder / "photos").rglob("*.jpg"))


def decode_time(folder: Path, repeats: int) -> str:
    """Median ms to decode one request image (part of every image request, not of the network's time)."""
    from irbis.kernels.image.decode import decode_image

    files = [p.read_bytes() for p in _photos(folder)]
    times = []
    for _ in range(repeats):
        for data in files:
            start = time.perf_counter()
            decode_image(data)
            times.append(time.perf_counter() - start)
    return (f"decoding one request image (JPEG, 320x240, mean {np.mean([len(d) for d in files]) / 1024:.0f} KiB): "
            f"{np.median(times) * 1000:.2f} ms (median)")


def network_time(path: Path, folder: Path, repeats: int) -> float:
    """Median ms of the compiled image pipeline on one decoded image (the request images in turn), called
    in a fresh process like a server's, with no HTTP: ``repeats`` calls after a warm-up."""
    out = subprocess.run([sys.executable, __file__, "--network-time", str(path), "--photos", str(folder),
                          "--repeats", str(repeats)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _network_time_here(path: str, folder: Path, repeats: int) -> float:
    from irbis.kernels.engines.ort import set_thread_spinning
    from irbis.kernels.image.decode import decode_image
    from irbis.serving.predictor import load_predictor

    set_thread_spinning(False)  # as a server loads it
    predictor = load_predictor(path, ["probability", "prediction"])
    images = [decode_image(p.read_bytes()) for p in _photos(folder)]
    for image in images:
        predictor.predict({"image": [image]})
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        predictor.predict({"image": [images[i % len(images)]]})
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000)


def _median_ms(fn, repeats: int) -> float:
    for _ in range(min(repeats, 50)):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000)


def mlflow_breakdown(seconds: float, repeats: int) -> list[str]:
    """Where a tabular request's time goes under ``mlflow models serve``, beside ``irbis serve``: each
    server's p50 at 1 client over HTTP, then, in this process on the same one-row requests, MLflow's
    scoring function without HTTP (``mlflow.pyfunc.scoring_server.invocations``: JSON to pandas, the
    schema, the pyfunc, the response's JSON), MLflow's ``PyFuncModel.predict`` (schema enforcement, then
    the pyfunc), Irbis's pyfunc (each value checked as ``irbis serve`` checks it) and the serving
    predictor under it."""
    import mlflow.pyfunc
    import pandas as pd
    from mlflow.pyfunc import scoring_server
    from pyspark.ml import PipelineModel

    from irbis.serving.predictor import load_predictor
    from irbis.spark.session import get_spark

    lines = []
    with tempfile.TemporaryDirectory(prefix="bench-serving-mlflow-") as tmp:
        folder = Path(tmp)
        spark = get_spark("local[2]", app_name="bench-serving", **{"spark.ui.enabled": "false"})
        tabular = build_tabular(spark, folder)
        logged = log_with_mlflow(PipelineModel.load(str(tabular)), folder)
        spark.stop()
        p50 = {}
        for kind, path, bodies, route in [("irbis", tabular, request_bodies("tabular", folder), "/predict"),
                                          ("mlflow", logged, request_bodies("tabular-mlflow", folder),
                                           "/invocations")]:
            port = free_port()
            proc = start_server(kind, path, port)
            try:
                p50[kind] = run_load(f"http://127.0.0.1:{port}", bodies, 1, seconds, route)["p50"]
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        model = mlflow.pyfunc.load_model(str(logged))
        schema = model.metadata.get_input_schema()
        body = request_bodies("tabular-mlflow", folder)[0][0].decode()
        row = json.loads(body)["dataframe_split"]
        frame = pd.DataFrame(row["data"], columns=row["columns"])
        irbis_pyfunc = model._model_impl
        predictor = load_predictor(str(tabular), ["probability", "prediction"])
        columns = {c: [float(v)] for c, v in zip(row["columns"], row["data"][0])}
        steps = [("MLflow's scoring function, no HTTP (scoring_server.invocations)",
                  lambda: scoring_server.invocations(body, "application/json", model, schema)),
                 ("MLflow PyFuncModel.predict (schema enforcement + the pyfunc)", lambda: model.predict(frame)),
                 ("Irbis's pyfunc (values checked as irbis serve checks them)", lambda: irbis_pyfunc.predict(frame)),
                 ("Irbis's serving predictor alone", lambda: predictor.predict(columns))]
        lines.append(f"tabular pipeline, one row per request; HTTP p50 at 1 client over {seconds:g} s; in-process "
                     f"steps: median of {repeats} calls")
        lines.append(f"{'step':70s} {'ms':>8s}")
        lines.append(f"{'irbis serve, HTTP p50':70s} {p50['irbis']:8.3f}")
        lines.append(f"{'mlflow models serve, HTTP p50':70s} {p50['mlflow']:8.3f}")
        for label, fn in steps:
            lines.append(f"{label:70s} {_median_ms(fn, repeats):8.3f}")
            print(lines[-1], flush=True)
        lines.append(f"mlflow models serve at {p50['mlflow'] / p50['irbis']:.2f}x irbis serve's p50")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="load time per row")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1, help="irbis serve --processes")
    parser.add_argument("--quick", action="store_true", help="a short check: 1 and 128 clients, 2 s each")
    parser.add_argument("--mlflow-breakdown", action="store_true",
                        help="only where a tabular request's time goes under mlflow models serve "
                             "(results/serving_mlflow.txt)")
    parser.add_argument("--plain-server", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--network-time", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--photos", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=200, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.network_time:
        print(_network_time_here(args.network_time, Path(args.photos), args.repeats))
        return
    if args.plain_server:
        import uvicorn

        uvicorn.run(plain_app(args.plain_server, ["probability", "prediction"]), host="127.0.0.1",
                    port=args.port, log_level="warning")
        return
    run = Run(__file__, packages=PACKAGES)
    if args.mlflow_breakdown:
        breakdown = mlflow_breakdown(args.seconds, 2000)  # before the header, which records the run time
        lines = [*run.header("serving benchmark, MLflow breakdown"), *breakdown]
        print("\n".join(lines))
        (ROOT / "benchmarks" / "results" / "serving_mlflow.txt").write_text("\n".join(lines) + "\n")
        return
    clients = [1, 128] if args.quick else [1, 16, 128]
    seconds = 2.0 if args.quick else args.seconds
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        folder = Path(tmp)
        pipelines = build_pipelines(folder, 4 if args.quick else args.images)
        lines.append(load_ceiling(seconds))
        lines.append(f"image pipeline alone, one decoded image, no HTTP (a fresh process): "
                     f"{network_time(pipelines['image'], folder, 20 if args.quick else 400):.2f} ms (median)")
        lines.append(decode_time(folder, 2 if args.quick else 20))
        lines.append(f"{'pipeline':8s} {'server':6s} {'clients':>7s} {'p50 ms':>8s} {'p99 ms':>8s} "
                     f"{'req/s':>8s} {'errors':>6s}")
        for name, path in pipelines.items():
            bodies = request_bodies(name, folder)
            mlflow = name == "tabular-mlflow"
            for kind in ("mlflow",) if mlflow else ("irbis", "plain"):
                port = free_port()
                proc = start_server(kind, path, port, args.workers)
                try:
                    for c in clients:
                        r = run_load(f"http://127.0.0.1:{port}", bodies, c, seconds,
                                     "/invocations" if mlflow else "/predict")
                        lines.append(f"{name.split('-')[0]:8s} {kind:6s} {c:7d} {r['p50']:8.2f} {r['p99']:8.2f} "
                                     f"{r['rps']:8.0f} {r['errors']:6d}")
                        print(lines[-1], flush=True)
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
    text = "\n".join(run.header(f"serving benchmark: {seconds:g} s per row, irbis serve --processes {args.workers}")
                     + lines)
    print(text)
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / "serving.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
