"""LIME explanations per second: Irbis on Spark local[2] against the ``lime`` package looping, same run.

Sections:

  images (``--images`` JPEGs, longer side 400-800 px; pretrained EfficientNet-Lite0 class scores)
    (l) ``lime.lime_image.LimeImageExplainer`` looping over the images, ``--image-samples`` each, the
        same SLIC superpixels and the same model (the ImageFeaturizer kernel as ``classifier_fn``),
        its ``batch_size`` set to the fastest of ``--batch-sizes`` (measured on the first image); in one
        process, and in a pool of 2 processes (one thread each) over the images
    (i) ``ImageLIME`` over the same images and model, the same samples, one Spark job, local[2]
    (n) the network alone: the same model's kernel on as many ready 224x224 inputs, in batches of 100,
        in two tasks on the same session; ImageLIME's samples per second are given against it
  table (``--rows`` rows of ``--features`` features; a SparkML LogisticRegressionModel)
    (lt) ``lime.lime_tabular.LimeTabularExplainer`` (continuous sampling) looping over the rows,
         ``--table-samples`` each, the model as the pure LogisticRegression kernel; in one process, and
         in a pool of 2 processes (one thread each) over the rows
    (t) ``TabularLIME`` fitted on the rows, explaining them all in one Spark job, local[2]

Each Spark job writes to the ``noop`` sink after a cold run on a few rows in both partitions; the table's
two methods are each timed three times and the fastest run kept. A pool row is timed after its processes
have started and loaded the model (as the Spark rows are, after a cold job); each section's ratio is to the
faster of the lime package's rows (the best a user could do with it on the same cores).

Usage: ``python benchmarks/explain.py [--quick]``; results are printed and written to
``benchmarks/results/explain.txt`` (``--output`` to change).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from images import SPARK_CONF, write_jpegs  # noqa: E402
from provenance import Run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODIFIER, TARGET = 130.0, 0
#: The table rows' methods are timed this many times each, the fastest kept (the first full Spark job
#: after the cold one still runs about three times slower than the next ones).
TABLE_REPEATS = 3
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 2
#: Processes of the lime package's pool rows: the cores Spark local[2] runs on.
POOL = 2


# -- the lime package ------------------------------------------------------------------------------
def _featurizer_fn():
    from irbis.kernels.blocks import Images
    from irbis.ml.image_featurizer import ImageFeaturizer

    fn = ImageFeaturizer(inputCol="image", outputCol="logits", cutOutputLayers=0)._make_batch_fn()
    return lambda batch: fn({"image": Images.from_arrays(list(np.asarray(batch, np.uint8)))})["logits"].values


def check_superpixels(paths: list[str], samples: int, cell: int) -> int:
    """The most superpixels of an image; every image needs fewer than ``samples`` to be explained."""
    import cv2

    from irbis.explain.segment import superpixels

    most = max(int(superpixels(cv2.imread(p), cell, MODIFIER).max()) + 1 for p in paths)
    if most > samples:
        raise SystemExit(f"an image has {most} superpixels, more than {samples} samples; raise --cell-size")
    return most


def _image_explainer(samples: int, cell: int):
    """``run(path, batch)``: the lime package's explanation of one image file."""
    import cv2
    from lime.lime_image import LimeImageExplainer

    from irbis.explain.segment import superpixels

    score, explainer = _featurizer_fn(), LimeImageExplainer(random_state=0)
    segment = lambda img: superpixels(img, cell, MODIFIER)  # noqa: E731

    def run(path: str, batch: int) -> None:
        explainer.explain_instance(cv2.imread(path), score, labels=(TARGET,), top_labels=None, hide_color=0,
                                   num_samples=samples, batch_size=batch, segmentation_fn=segment)

    return run


def lime_images(paths: list[str], samples: int, batch_sizes: list[int], cell: int) -> tuple[float, int]:
    """Seconds for the lime package over the images in one process, and the batch size it ran with."""
    run = _image_explainer(samples, cell)
    timings = {}
    for batch in batch_sizes:
        start = time.perf_counter()
        run(paths[0], batch)
        timings[batch] = time.perf_counter() - start
    best = min(timings, key=timings.get)
    start = time.perf_counter()
    for path in paths:
        run(path, best)
    return time.perf_counter() - start, best


def _table_explainer(x: np.ndarray, coef: np.ndarray, intercept: np.ndarray, samples: int):
    """``run(rows)``: the lime package's explanations of table rows."""
    from lime.lime_tabular import LimeTabularExplainer

    from irbis.kernels.sparkml.stage_kernels import logistic_regression

    explainer = LimeTabularExplainer(x, discretize_continuous=False, random_state=0)
    predict = lambda rows: logistic_regression(rows, coef, intercept)[1]  # noqa: E731

    def run(rows: np.ndarray) -> None:
        for row in rows:
            explainer.explain_instance(row, predict, labels=(1,), num_features=x.shape[1], num_samples=samples)

    return run


def lime_table(x: np.ndarray, coef: np.ndarray, intercept: np.ndarray, samples: int) -> float:
    run = _table_explainer(x, coef, intercept, samples)
    times = []
    for _ in range(TABLE_REPEATS):
        start = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - start)
    return min(times)


# -- the lime package in a pool of processes ------------------------------------------------------------
_WORKER: dict = {}


def _pool_start(kind: str, *args) -> None:
    """A pool process: one thread (torch and BLAS), and its explainer built once."""
    from threadpoolctl import threadpool_limits

    from irbis.kernels.threads import set_threads

    set_threads(1)
    _WORKER["limits"] = threadpool_limits(1)
    _WORKER["run"] = _image_explainer(*args) if kind == "images" else _table_explainer(*args)


def _pool_images(job: tuple[list[str], int]) -> None:
    for path in job[0]:
        _WORKER["run"](path, job[1])


def _pool_rows(rows: np.ndarray) -> None:
    _WORKER["run"](rows)


def lime_pool(kind: str, shares: list, warm: list, repeats: int, *args) -> float:
    """Seconds of the fastest of ``repeats`` runs of the lime package over ``shares`` (one per process) in a
    pool of ``POOL`` processes, after ``warm`` (one small share per process) has loaded the model in each."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    work = _pool_images if kind == "images" else _pool_rows
    with ProcessPoolExecutor(POOL, mp_context=multiprocessing.get_context("spawn"), initializer=_pool_start,
                             initargs=(kind, *args)) as pool:
        list(pool.map(work, warm))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(work, shares))
            times.append(time.perf_counter() - start)
    return min(times)


# -- Irbis on Spark ----------------------------------------------------------------------------------
def _timed_job(stage, data, repeats: int = 1) -> float:
    """Seconds of the fastest of ``repeats`` jobs of ``stage`` over ``data``, after a cold one."""
    # cold: a few rows in two partitions, so that both Python workers have loaded the model
    stage.transform(data.limit(4).repartition(2)).write.format("noop").mode("overwrite").save()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        stage.transform(data).write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - start)
    return min(times)


def irbis_images(spark, folder: str, samples: int, batch: int, cell: int) -> float:
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.ml.lime import ImageLIME
    from irbis.spark.images import read_images

    images = read_images(folder, dropInvalid=True, spark=spark).repartition(2).cache()
    images.count()
    lime = ImageLIME(model=ImageFeaturizer(inputCol="image", outputCol="logits", cutOutputLayers=0),
                     targetCol="logits", targetClasses=[TARGET], numSamples=samples, cellSize=float(cell),
                     modifier=MODIFIER, miniBatchSize=batch)
    return _timed_job(lime, images)


def network_alone(spark, inputs: int, batch: int) -> float:
    """Seconds to run ``inputs`` preprocessed 224x224 inputs through the network alone: the ImageLIME row's
    model (ImageFeaturizer, engine auto), its kernel called on ready inputs in batches of ``batch``, in two
    tasks on the same local[2] session: the ceiling of ImageLIME's samples per second."""
    import pyarrow as pa

    def run(batches):
        from irbis.kernels.blocks import Prepared
        from irbis.ml.image_featurizer import ImageFeaturizer
        from irbis.spark.resources import set_task_threads

        set_task_threads()  # as every stage's task does: one thread per task slot
        fn = ImageFeaturizer(inputCol="image", outputCol="logits", cutOutputLayers=0)._make_batch_fn()
        x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
        for part in batches:
            for n in part.column(0).to_pylist():
                for start in range(0, n, batch):
                    fn({"image": Prepared(x[:min(batch, n - start)])})
                yield pa.RecordBatch.from_pydict({"n": [n]})

    def job(total: int) -> float:
        # one row per task, in two partitions for sure (a repartition of two rows may put both in one)
        shares = spark.range(0, 2, 1, 2).selectExpr(f"IF(id = 0, {total // 2}, {total - total // 2}) AS n")
        start = time.perf_counter()
        shares.mapInArrow(run, "n long").write.format("noop").mode("overwrite").save()
        return time.perf_counter() - start

    job(2 * batch)  # cold: both Python workers load the network
    return job(inputs)


def irbis_table(spark, x: np.ndarray, y: np.ndarray, samples: int):
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.linalg import Vectors

    from irbis.ml.lime import TabularLIME

    df = spark.createDataFrame([(Vectors.dense(r), float(t)) for r, t in zip(x, y)], ["features", "label"])
    df = df.repartition(2).cache()
    model = LogisticRegression(maxIter=50).fit(df)
    lime = TabularLIME(model=model, targetClasses=[1], numSamples=samples).fit(df)
    return _timed_job(lime, df, TABLE_REPEATS), model.coefficientMatrix.toArray(), model.interceptVector.toArray()


def table_data(rows: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features))
    y = (x @ rng.normal(size=features) + 0.5 * rng.normal(size=rows) > 0).astype(float)
    return x, y


def report(rows: list[tuple[str, str, float, int]], header: list[str]) -> str:
    lines = list(header)
    for section in dict.fromkeys(r[0] for r in rows):
        part = [r for r in rows if r[0] == section]
        base = max(n / s for _, label, s, n in part if "lime package" in label)
        lines += ["", f"## {section}", "", "| method | explanations/s | ratio to the lime package's best | seconds |",
                  "|---|---|---|---|"]
        lines += [f"| {label} | {n / s:.3g} | {(n / s) / base:.2f}x | {s:.1f} |" for _, label, s, n in part]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4, help="JPEGs to explain (4: the quoted run)")
    parser.add_argument("--image-samples", type=int, default=1000)
    parser.add_argument("--cell-size", type=int, default=32, help="superpixel size in pixels")
    parser.add_argument("--batch-sizes", default="10,50,100,200", help="the lime package's batch sizes to try")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--table-samples", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="tiny inputs: check that the script runs")
    parser.add_argument("--output", default=str(RESULTS / "explain.txt"))
    args = parser.parse_args()
    if args.quick:
        args.images, args.image_samples, args.batch_sizes, args.cell_size = 2, 60, "20,60", 120
        args.rows, args.table_samples = 40, 200
    folder = Path(tempfile.mkdtemp(prefix="irbis-bench-explain-")) / "images"
    write_jpegs(folder, args.images)
    paths = sorted(str(p) for p in folder.glob("*.jpg"))
    most = check_superpixels(paths, args.image_samples, args.cell_size)
    x, y = table_data(args.rows, args.features)
    run = Run(__file__, packages=("torch", "pyspark", "opencv-python-headless", "numpy", "pyarrow", "lime"))

    from irbis.spark.session import get_spark

    spark = get_spark("local[2]", app_name="irbis-bench-explain", **SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    table_s, coef, intercept = irbis_table(spark, x, y, args.table_samples)
    image_s = irbis_images(spark, str(folder), args.image_samples, 100, args.cell_size)
    network_s = network_alone(spark, args.images * args.image_samples, 100)
    spark.stop()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    lime_image_s, batch = lime_images(paths, args.image_samples, sizes, args.cell_size)
    lime_table_s = lime_table(x, coef, intercept, args.table_samples)
    halves = [paths[i::POOL] for i in range(POOL)]
    pool_image_s = lime_pool("images", [(h, batch) for h in halves], [([h[0]], batch) for h in halves], 1,
                             args.image_samples, args.cell_size)
    parts = np.array_split(x, POOL)
    pool_table_s = lime_pool("table", parts, [r[:2] for r in parts], TABLE_REPEATS, x, coef, intercept,
                             args.table_samples)
    image_job = (f"images ({args.images} JPEGs, EfficientNet-Lite0, {args.image_samples} samples each, "
                 f"up to {most} superpixels)")
    table_job = (f"table ({args.rows} rows x {args.features} features, LogisticRegression, "
                 f"{args.table_samples} samples each)")
    rows = [
        (image_job, f"(l) lime package, batch_size {batch}, 1 process", lime_image_s, args.images),
        (image_job, f"(l2) lime package, batch_size {batch}, {POOL} processes", pool_image_s, args.images),
        (image_job, "(i) ImageLIME, Spark local[2]", image_s, args.images),
        (table_job, "(lt) lime package, 1 process", lime_table_s, args.rows),
        (table_job, f"(lt2) lime package, {POOL} processes", pool_table_s, args.rows),
        (table_job, "(t) TabularLIME, Spark local[2]", table_s, args.rows),
    ]
    header = run.header()
    lime_rate, network_rate = args.images * args.image_samples / image_s, args.images * args.image_samples / network_s
    text = report(rows, header) + (
        f"\n\nImageLIME against the network alone (same model, engine auto, local[2], batches of 100): "
        f"{lime_rate:.1f} explanation samples/s against {network_rate:.1f} preprocessed inputs/s through the "
        f"network ({network_s:.1f} s for the same {args.images * args.image_samples} inputs): "
        f"{lime_rate / network_rate:.2f}x the network's own throughput")
    print(text)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
