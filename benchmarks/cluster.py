"""Irbis on a Spark standalone cluster of 1 and 2 workers against Spark local[2], and a cost model projected
to 20 executors beside the shape of the MMLSpark paper's Figure 1.

The cluster is a master and two workers of one core each, started on this host as separate processes
(``irbis.spark.standalone.start_standalone``), each worker with its own work, local and temporary
folders; the application's driver is a process of its own, in client mode. Every row runs the same
job, end to end, on the same 2 cores:

  (f) ImageFeaturizer: binaryFile -> ImageFeaturizer(inputCol="content") (EfficientNet-Lite0, pooled
      1280-d, fp32, engine auto) -> the ``noop`` sink, on JPEGs of the shipped photographs (those of
      ``images.py``), at 96 and 384 images in 2 and 8 tasks;
  (t) TorchEstimator: ``sync`` fit of the small CNN on 3x32x32 digits (``train_sync.py``'s cnn), 2
      epochs, global batch 64, one worker per executor (numWorkers 1 or 2).

Spark local[2] (one JVM, 2 task slots, the driver inside) is the baseline: what the same job gets on
these cores without a cluster. Its speed-up is what the cluster's must be compared to, not 1 worker's.

This machine stops at 2 cores, so the figures past 2 executors are a projection. A cost model is
fitted to the measured ImageFeaturizer runs (least squares over every (images, tasks, executors) run):

    T = job + driver_task * tasks + task * ceil(tasks / executors) + image * images / executors

``job`` is the fixed cost of a job on the driver, ``driver_task`` the driver's serial share per task
(scheduling, result handling), ``task`` the fixed cost of a task on its executor (a Python worker's
batch set-up), ``image`` the cost of one image on one core. Between hosts the network adds, per
executor, its share of the JPEG bytes over its link (``--link-gbps``, a parameter: on this host the
bytes never cross one); the projection is over 82,382 images (the paper's data set) in tasks of 256.

Usage: ``python benchmarks/cluster.py [--quick] [--repeats 2]``; a full run writes
``benchmarks/results/cluster.txt`` and ``cluster.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
from provenance import Run  # noqa: E402

#: The MMLSpark paper's data set (section 4): the projection's size.
PAPER_IMAGES = 82_382
#: Images per task in the projection (a split of about 15 MiB of JPEGs).
TASK_IMAGES = 256
CNN = {"num_classes": 10, "width": 32}
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1


# -- the application (a process of its own: one SparkContext per process) ------------------------------
def child(args: argparse.Namespace) -> None:
    import irbis
    from irbis.ml import TorchEstimator
    from irbis.ml.image_featurizer import ImageFeaturizer

    settings = {"spark.ui.enabled": "false", "spark.sql.files.openCostInBytes": str(64 << 10),
                "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"}
    if args.master.startswith("spark://"):
        settings |= {"spark.cores.max": str(args.executors), "spark.executor.memory": "2g",
                     "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                     "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s"}
    t0 = time.perf_counter()
    spark = irbis.get_spark(args.master, app_name="irbis-cluster-benchmark", **settings)
    out: dict = {"session_s": time.perf_counter() - t0, "features": [], "train": {}}
    stage = ImageFeaturizer(inputCol="content", outputCol="features", miniBatchSize=32, engine="auto")

    def featurize(folder: str, tasks: int) -> tuple[float, int]:
        """Seconds of the job over ``folder`` split into about ``tasks`` tasks, and the tasks Spark made."""
        spark.conf.set("spark.sql.files.minPartitionNum", str(tasks))
        spark.conf.set("spark.sql.files.maxPartitionBytes", str(1 << 30))
        files = spark.read.format("binaryFile").load(folder).select("path", "content")
        t = time.perf_counter()
        stage.transform(files).drop("content").write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t, files.rdd.getNumPartitions()

    t = time.perf_counter()
    featurize(args.folders[0], 2)  # the first job: Python workers start, the network loads
    out["cold_s"] = time.perf_counter() - t
    for folder in args.folders:
        images = len(list(Path(folder).glob("*.jpg")))
        for tasks in (2, 8):
            _, made = featurize(folder, tasks)  # warm-up of this shape
            times = [featurize(folder, tasks)[0] for _ in range(args.repeats)]
            out["features"].append({"images": images, "tasks": tasks, "made": made, "times": times})
            print(f"featurize {images} images in {tasks} tasks: {min(times):.2f} s", flush=True)

    if not args.no_train:
        from peers import digits_frame
        from train_sync import load_digits_split

        xtr, _, ytr, _ = load_digits_split(images=True)
        df = digits_frame(spark, xtr, ytr, partitions=args.executors)
        est = TorchEstimator(network="small_cnn", networkOptions=json.dumps(CNN), inputShape=[3, 32, 32],
                             strategy="sync", numWorkers=args.executors, batchSize=64 // args.executors,
                             learningRate=1e-3, seed=0, showProgress=False)
        est.copy({est.epochs: 1}).fit(df)  # warm-up
        t = time.perf_counter()
        model = est.copy({est.epochs: 2}).fit(df)
        seconds = time.perf_counter() - t
        out["train"] = {"seconds": seconds, "samples_per_s": 2 * len(xtr) / seconds,
                        "loss": model.training_summary[-1]["loss"]}
        print(f"train: {seconds:.1f} s", flush=True)
    spark.stop()
    Path(args.out).write_text(json.dumps(out))


def run_app(master: str, executors: int, folders: list[str], repeats: int, no_train: bool, env: dict) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, __file__, "--child", "--master", master, "--executors", str(executors),
           "--repeats", str(repeats), "--out", path, "--folders", *folders, *(["--no-train"] if no_train else [])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{master} x{executors} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads(Path(path).read_text())


# -- the cost model -------------------------------------------------------------------------------------
TERMS = ("job", "driver_task", "task", "image")


def design(images: float, tasks: float, executors: float) -> list[float]:
    return [1.0, tasks, math.ceil(tasks / executors), images / executors]


def fit_model(runs: list[tuple[int, int, int, float]]) -> dict:
    """The model's terms from ``runs`` ((images, tasks, executors, seconds)), in two steps. The one-executor
    runs, where the driver has a core to itself, give ``job``, ``image`` and the per-task cost (least squares,
    non-negative); on one executor the driver's and the executor's shares of a task add up, so the
    two-executor runs split it: what they take beyond the one-executor terms is the driver's serial share
    (on this host it includes the driver's contention with the executors for the 2 cores: an overestimate)."""
    from scipy.optimize import nnls

    one = [r for r in runs if r[2] == 1]
    a = np.array([[1.0, p, n] for n, p, _, _ in one])
    (job, per_task, image), _ = nnls(a, np.array([s for *_, s in one]))
    shares = []
    for n, p, e, s in runs:
        if e > 1 and p > math.ceil(p / e):
            rest = s - job - image * n / e - per_task * math.ceil(p / e)
            shares.append(rest / (p - math.ceil(p / e)))
    driver_task = float(np.clip(np.mean(shares), 0.0, per_task)) if shares else 0.0
    coef = {"job": job, "driver_task": driver_task, "task": per_task - driver_task, "image": image}
    fitted = np.array([np.dot(design(n, p, e), [coef[t] for t in TERMS]) for n, p, e, _ in runs])
    seconds = np.array([s for *_, s in runs])
    return {"coef": coef, "residual_pct": float(np.max(np.abs(fitted - seconds) / seconds) * 100)}


def project(coef: dict, executors: int, images: int, jpeg_bytes: float, link_gbps: float | None) -> float:
    """Seconds to featurize ``images`` on ``executors`` one-core executors, each reading its share of the
    JPEG bytes over a link of ``link_gbps`` (None: no network)."""
    tasks = math.ceil(images / TASK_IMAGES)
    seconds = float(np.dot(design(images, tasks, executors), [coef[t] for t in TERMS]))
    if link_gbps:
        seconds += images * jpeg_bytes / executors / (link_gbps * 1e9 / 8)
    return seconds


# -- the report -----------------------------------------------------------------------------------------
def best(app: dict, images: int, tasks: int) -> float:
    return min(next(r["times"] for r in app["features"] if r["images"] == images and r["tasks"] == tasks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="48 and 96 images, one timed run, no training")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--link-gbps", type=float, nargs="+", default=[10.0, 1.0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--executors", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--folders", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--no-train", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    from images import write_jpegs
    from irbis.spark.standalone import start_standalone

    sizes = (48, 96) if args.quick else (96, 384)
    repeats = 1 if args.quick else args.repeats
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env |= {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    run = Run(__file__, packages=("torch", "pyspark"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_jpegs(root / "all", max(sizes))
        folders = []
        for n in sizes:
            folder = root / f"jpegs{n}"
            folder.mkdir()
            for f in sorted((root / "all").glob("*.jpg"))[:n]:
                (folder / f.name).symlink_to(f)
            folders.append(str(folder))
        jpeg_bytes = float(np.mean([f.stat().st_size for f in (root / "all").glob("*.jpg")]))
        apps = {"local[2]": run_app("local[2]", 2, folders, repeats, args.quick, env)}
        print("local[2] done", flush=True)
        with start_standalone(root / "cluster", workers=2, cores=1, memory="3g") as cluster:
            for e in (1, 2):
                apps[f"standalone x{e}"] = run_app(cluster.url, e, folders, repeats, args.quick, env)
                print(f"standalone x{e} done", flush=True)
    report(apps, sizes, jpeg_bytes, args, run)


def report(apps: dict, sizes: tuple, jpeg_bytes: float, args: argparse.Namespace, run: Run) -> None:
    big = max(sizes)
    base = best(apps["local[2]"], big, 2)
    lines = [*run.header(f"standalone: a master and 2 workers of 1 core each on this host (separate processes, "
                         f"folders and TMPDIR), driver in client mode; JPEGs of {jpeg_bytes / 1024:.0f} KiB on "
                         "average"),
             "", f"## (f) ImageFeaturizer, {big} JPEGs, fp32, engine auto "
                 f"(best of {args.repeats if not args.quick else 1} "
             "timed runs after a warm-up)", "",
             "| master | executors x cores | tasks | seconds | images/s | vs local[2] | first job s | session s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, app in apps.items():
        cores = 2 if name == "local[2]" else int(name[-1])
        for tasks in (2, 8):
            s = best(app, big, tasks)
            lines.append(f"| {name} | {'1 JVM x 2 slots' if cores == 2 and name == 'local[2]' else f'{cores} x 1'} "
                         f"| {tasks} | {s:.2f} | {big / s:.1f} | {base / s:.2f}x | {app['cold_s']:.1f} | "
                         f"{app['session_s']:.1f} |")
    x1, x2 = best(apps["standalone x1"], big, 2), best(apps["standalone x2"], big, 2)
    lines += ["", f"standalone speed-up, 2 executors against 1 (2 tasks): {x1 / x2:.2f}x "
              f"(the driver and both executors share the 2 cores)"]
    if any(app["train"] for app in apps.values()):
        lines += ["", "## (t) TorchEstimator sync, small CNN on 3x32x32 digits, 2 epochs, global batch 64", "",
                  "| master | workers | seconds | samples/s | vs local[2] | final loss |", "|---|---|---|---|---|---|"]
        tb = apps["local[2]"]["train"]["seconds"]
        for name, app in apps.items():
            t = app["train"]
            lines.append(f"| {name} | {2 if name == 'local[2]' else name[-1]} | {t['seconds']:.1f} | "
                         f"{t['samples_per_s']:.0f} | {tb / t['seconds']:.2f}x | {t['loss']:.3f} |")
    runs = [(r["images"], r["made"], int(name[-1]), min(r["times"]))
            for name, app in apps.items() if name != "local[2]" for r in app["features"]]
    model = fit_model(runs)
    c = model["coef"]
    lines += ["", "## Cost model (standalone runs: the terms from 1 executor, the driver's share from 2)", "",
              f"T = {c['job']:.3f} s per job + {c['driver_task'] * 1e3:.1f} ms per task on the driver + "
              f"{c['task'] * 1e3:.1f} ms per task on its executor + {c['image'] * 1e3:.2f} ms per image per core "
              f"(largest residual {model['residual_pct']:.0f}% over {len(runs)} runs)",
              "", f"## Projection: {PAPER_IMAGES:,} JPEGs (the MMLSpark paper's set) in tasks of {TASK_IMAGES}, "
              "one-core executors", "",
              "| executors | " + " | ".join(f"s at {g:g} Gbit/s | speed-up" for g in args.link_gbps) + " |",
              "|---|" + "---|---|" * len(args.link_gbps)]
    curves = {g: [project(c, e, PAPER_IMAGES, jpeg_bytes, g) for e in range(1, 21)] for g in args.link_gbps}
    for e in (1, 2, 4, 8, 12, 16, 20):
        lines.append(f"| {e} | " + " | ".join(f"{curves[g][e - 1]:.0f} | {curves[g][0] / curves[g][e - 1]:.1f}x"
                                             for g in args.link_gbps) + " |")
    serial = c["job"] + c["driver_task"] * math.ceil(PAPER_IMAGES / TASK_IMAGES)
    lines += ["", f"What bends it: the driver's serial share ({serial:.1f} s for this set: the job and "
              f"{math.ceil(PAPER_IMAGES / TASK_IMAGES)} tasks' scheduling) does not shrink with executors; at 20 it is "
              f"{serial / curves[args.link_gbps[0]][19] * 100:.0f}% of the time. The network adds "
              f"{jpeg_bytes * 8 / 1e9 * 1e3 / min(args.link_gbps):.2f} ms per image per executor at "
              f"{min(args.link_gbps):g} Gbit/s against {c['image'] * 1e3:.1f} ms of compute, so a link of that "
              "speed does not bend it; a shared store slower than the executors' sum would, and so would "
              "executors of several cores that one host's memory bandwidth feeds."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "cluster.txt").write_text(text)
        plot(apps, curves, big, RESULTS / "cluster.png")


def plot(apps: dict, curves: dict, big: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = np.arange(1, 21)
    ax.plot(xs, xs, "k:", label="linear (the shape of MMLSpark's Figure 1)")
    for g, times in curves.items():
        ax.plot(xs, times[0] / np.array(times), label=f"projected, {g:g} Gbit/s links")
    x1 = best(apps["standalone x1"], big, 2)
    ax.plot([1, 2], [1, x1 / best(apps["standalone x2"], big, 2)], "o", color="C3",
            label="measured here (2 cores shared with the driver)")
    ax.set_xlabel("executors (1 core each)")
    ax.set_ylabel("speed-up over 1 executor")
    ax.set_title(f"ImageFeaturizer over {PAPER_IMAGES:,} JPEGs: cost model")
    ax.set_xlim(0, 21)
    ax.set_ylim(0, 21)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
