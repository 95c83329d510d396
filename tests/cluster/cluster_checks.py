"""The driver of the standalone-cluster tests: connects to a master URL, runs the checks named, and
writes their results to a folder (``results.json`` and arrays as ``.npy``).

It runs as a process of its own because a Python process holds one SparkContext, and the test run's
own process keeps its local session. Usage::

    python cluster_checks.py --master spark://127.0.0.1:7077 --out DIR --images DIR featurize sync dcasgd

``fit_bare`` fits on an application of its own whose executors run the Python given by ``--bare-python``;
``fit_packed`` does the same with Irbis's environment shipped as the PEX given by ``--environment``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from jvm_options import executor_jvm_options

#: The estimator settings of the training checks, shared with the tests' local fits.
MLP = json.dumps({"in_features": 64, "hidden": 64, "out_features": 10})
FITS = {
    "sync": dict(strategy="sync", learningRate=3e-3, epochs=6, batchSize=32),
    "dcasgd": dict(strategy="dcasgd", strategyOptions='{"lambda_": 2.0}', optimizer="sgd", learningRate=0.1,
                   epochs=8, batchSize=16),
}


def estimator(name: str):
    from irbis.ml import TorchEstimator

    return TorchEstimator(network="mlp", networkOptions=MLP, numWorkers=2, validationFraction=0.1, seed=0,
                          showProgress=False, **FITS[name])


def digits():
    """Digits scaled to [0, 1]: x_train, x_test, y_train, y_test (stratified, 20% test)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    return train_test_split(x / 16, y, test_size=0.2, stratify=y, random_state=0)


def train_frame(spark):
    from pyspark.ml.linalg import Vectors

    xtr, _, ytr, _ = digits()
    df = spark.createDataFrame([(Vectors.dense(a), int(b)) for a, b in zip(xtr, ytr)], ["features", "label"])
    return df.repartition(2).cache()


def scores(model) -> np.ndarray:
    """The model's outputs on the test digits, computed on the driver."""
    import pandas as pd

    _, xte, _, _ = digits()
    out = model.transform(pd.DataFrame({"features": list(xte.astype(np.float32))}))
    return np.stack(out["prediction"].map(np.asarray))


def featurize(spark, images: str) -> np.ndarray:
    """Pooled EfficientNet-Lite0 features of the images under ``images``, ordered by path."""
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.images import read_images

    df = read_images(images, spark=spark).repartition(2)
    stage = ImageFeaturizer(inputCol="image", outputCol="features", cutOutputLayers=1, engine="torch")
    rows = stage.transform(df).select("path", "features").orderBy("path").collect()
    return np.stack([r.features.toArray() for r in rows])


def cat_canvas(folder: Path) -> Path:
    """The cat of scikit-image's ``chelsea`` in one corner of a black canvas four times its size (the
    ImageLIME check's photograph), written as a PNG under ``folder``."""
    import cv2
    from skimage import data

    cat = data.chelsea()[::2, ::2, ::-1]
    h, w = cat.shape[:2]
    canvas = np.zeros((2 * h, 2 * w, 3), np.uint8)
    canvas[h:, w:] = cat
    folder.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(folder / "cat.png"), canvas)
    return folder / "cat.png"


def explain(spark, image: Path) -> np.ndarray:
    """ImageLIME's weights of the cat classes on ``image`` (EfficientNet-Lite0's logits, torch engine)."""
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.ml.lime import ImageLIME
    from irbis.spark.images import read_images

    net = ImageFeaturizer(inputCol="image", outputCol="logits", cutOutputLayers=0, engine="torch")
    lime = ImageLIME(model=net, targetCol="logits", targetClasses=[285, 281], numSamples=48, cellSize=75.0,
                     miniBatchSize=48, seed=0)
    row = lime.transform(read_images(str(image), spark=spark)).collect()[0]
    assert row.explainError is None, row.explainError
    return np.array(row.weights)


def serve(spark, model, out: Path) -> np.ndarray:
    """The fitted ``model`` saved as a pipeline, served by two replicas on the executors (``irbis serve
    --spark``'s path, bound to 0.0.0.0 as a cluster needs); each replica's answers on the test digits."""
    import urllib.request

    from pyspark.ml import PipelineModel

    from irbis.serving.replicas import start_replicas

    PipelineModel([model]).save(str(out / "pipeline"))
    _, xte, _, _ = digits()
    body = json.dumps([{"features": row.tolist()} for row in xte[:20]]).encode()
    replicas = start_replicas(str(out / "pipeline"), spark, 2, host="0.0.0.0", outputs=["prediction"])
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        answers = []
        for address in sorted(replicas.addresses.values()):
            request = urllib.request.Request(f"http://{address}/predict", body, {"Content-Type": "application/json"})
            with opener.open(request, timeout=120) as reply:
                answers.append([row["prediction"] for row in json.load(reply)])
    finally:
        replicas.stop()
    return np.array(answers)


def session(master: str, python: str | None = None, environment: str | None = None):
    """A session on ``master`` whose executors run ``python`` (default: this interpreter), or the Python of
    the shipped ``environment`` (``irbis pack``'s PEX)."""
    import os

    import irbis

    os.environ["PYSPARK_PYTHON"] = python or sys.executable  # read when the SparkContext starts
    one = bool(python or environment)
    return irbis.get_spark(master, app_name="irbis-cluster-checks", environment=environment,
                           **{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                              "spark.driver.memory": "1g", "spark.executor.memory": "1g",
                              **executor_jvm_options(),
                              # wait for every core asked for: one (one executor) without irbis, else two
                              "spark.cores.max": "1" if one else "2",
                              "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                              "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
                              # a task that fails fails its job: no retries of a failed import
                              **({"spark.task.maxFailures": "1", "spark.stage.maxConsecutiveAttempts": "1"}
                                 if one else {})})


def fit_bare(master: str, python: str, out: Path) -> None:
    """Fit on an application whose one executor runs ``python``, a Python without irbis. The data is made
    in the JVM alone, so a transform's pandas UDF is the first Python work on the executors (its error's
    text is saved to ``transform_bare.txt``), the fit's barrier stage the second."""
    import torch
    from pyspark.sql import functions as F

    from irbis.ml import TorchModel

    spark = session(master, python)
    try:
        df = spark.range(64, numPartitions=2).select(F.array(*[F.rand(i) for i in range(64)]).alias("features"),
                                                     (F.col("id") % 10).cast("int").alias("label"))
        try:  # a transform's job first: a pandas UDF of Irbis on the executor
            TorchModel.from_module(torch.nn.Linear(64, 10), inputCol="features", outputCol="v").transform(df).collect()
        except Exception as err:  # noqa: BLE001 - the text the user reads, judged by the test
            (out / "transform_bare.txt").write_text(str(err))
        estimator("sync").setNumWorkers(1).fit(df)
    finally:
        spark.stop()


def fit_packed(master: str, environment: str) -> None:
    """The same fit as :func:`fit_bare`, its executor's Python lacking irbis as there, but with Irbis's
    environment shipped as a PEX (``get_spark(environment=...)``): the executor runs the fit in it."""
    from pyspark.sql import functions as F

    spark = session(master, environment=environment)
    try:
        df = spark.range(64, numPartitions=2).select(F.array(*[F.rand(i) for i in range(64)]).alias("features"),
                                                     (F.col("id") % 10).cast("int").alias("label"))
        model = estimator("sync").setNumWorkers(1).setEpochs(1).fit(df)
        assert model.training_summary[-1]["loss"] > 0
        python = spark.sparkContext.parallelize([0], 1).map(lambda _: sys.executable).collect()[0]
        assert python != sys.executable, python  # the PEX's environment, not this driver's
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--images", default="")
    parser.add_argument("--bare-python", default="", help="the executors' Python of the fit_bare check")
    parser.add_argument("--environment", default="", help="the PEX the fit_packed check ships")
    parser.add_argument("checks", nargs="+", choices=["featurize", "sync", "dcasgd", "serve", "lime", "fit_bare",
                                                         "fit_packed"])
    args = parser.parse_args()
    out = Path(args.out)
    results: dict = {}
    fitted: dict = {}  # the models the training checks fitted, by check
    spark = None
    for check in args.checks:
        t = time.perf_counter()
        try:
            if check in ("fit_bare", "fit_packed"):  # an application of its own
                if spark is not None:
                    spark.stop()
                    spark = None
                if check == "fit_bare":
                    fit_bare(args.master, args.bare_python, out)
                else:
                    fit_packed(args.master, args.environment)
            else:
                if spark is None:
                    spark = session(args.master)
                    results["session_s"] = time.perf_counter() - t
                    sc = spark.sparkContext
                    results["master"] = sc.master
                    results["executors"] = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # less the driver
                if check == "featurize":
                    np.save(out / "featurize.npy", featurize(spark, args.images))
                elif check == "lime":
                    np.save(out / "lime.npy", explain(spark, cat_canvas(out / "cat")))
                elif check == "serve":
                    np.save(out / "serve.npy", serve(spark, fitted["sync"], out))
                else:
                    fitted[check] = estimator(check).fit(train_frame(spark))
                    np.save(out / f"{check}.npy", scores(fitted[check]))
            results[check] = {"ok": True}
        except Exception as err:  # noqa: BLE001 - reported to the test, which judges it
            results[check] = {"ok": False, "type": type(err).__name__, "message": str(err)[:4000],
                              "traceback": traceback.format_exc()[:3000] + "\n...\n" + traceback.format_exc()[-3000:]}
        results[check]["seconds"] = time.perf_counter() - t
        print(f"{check}: {results[check]['seconds']:.1f} s", flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))  # after each check
    if spark is not None:
        spark.stop()
    results["done"] = True
    (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
