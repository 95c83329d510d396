"""The Arrow-native stage base against the best plain loops, in the same run.

Each row is measured in its own process (a Spark method: one cold job, then timed jobs writing to the
``noop`` sink). Sections:

  chains (``--chain-images`` JPEGs, longer side 400-800 px): resize shorter side 256 (aspect kept),
  centre crop 224, flip left-right
    (t1) plain OpenCV loop, 1 process x 2 OpenCV threads, producing the same image bytes
    (t2) the same loop in 2 processes x 1 thread (the layout of Spark local[2])
    (u) binaryFile -> ImageTransformer(outputFormat="image"), one pass, local[2]
    (u2) the chain + normalize to float CHW: plain loop (2 procs) vs ImageTransformer(outputFormat="array")
  features (``--images`` JPEGs, pretrained EfficientNet-Lite0, pooled 1280-d, fp32)
    (b) binaryFile -> ImageFeaturizer(inputCol="content"), one pass
    (c) read_images -> ImageFeaturizer(inputCol="image"), two passes
    (f) read_images -> fuse([ImageTransformer (the card's chain), TorchModel(outputLayer="_flatten")])
  vectors (``--vectors`` rows of array<float> 3x224x224 in Parquet)
    (p) the same inference kernel (make_torch_predict_fn) in a plain loop over the same batches,
        1 process x 2 threads and 2 processes x 1 thread
    (n) TorchModel over the array column, local[2]

The peak resident memory of the Python workers is sampled during the (u2) job (``/proc``) and set
beside the size of the input Arrow batches.

Usage: ``python benchmarks/arrow_base.py [--chain-images 1000] [--images 192] [--vectors 256]``;
results are printed and written to ``benchmarks/results/arrow_base.txt``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from images import SPARK_CONF, write_jpegs  # noqa: E402
from provenance import Run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODEL = "efficientnet_lite0"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1


# -- plain loops ---------------------------------------------------------------------------------
def _chain_one(data: bytes, normalize: bool) -> np.ndarray:
    import cv2

    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    h, w = bgr.shape[:2]
    size = (int(256 * w / h), 256) if h <= w else (256, int(256 * h / w))
    bgr = cv2.resize(bgr, size, interpolation=cv2.INTER_LINEAR)
    top, left = int(round((bgr.shape[0] - 224) / 2)), int(round((bgr.shape[1] - 224) / 2))
    out = cv2.flip(bgr[top:top + 224, left:left + 224], 1)
    if normalize:
        return ((out.astype(np.float32) - 127.0) / 128.0).transpose(2, 0, 1).copy().reshape(-1)
    return out


def plain_chain(paths: list[str], threads: int, normalize: bool) -> None:
    import cv2

    cv2.setNumThreads(threads)
    for p in paths:
        _chain_one(Path(p).read_bytes(), normalize)


def plain_vectors(path: str, threads: int, part: int, parts: int) -> None:
    import pyarrow.parquet as pq

    from irbis.kernels.inference import make_torch_predict_fn, set_threads

    set_threads(threads)
    predict = make_torch_predict_fn({"kind": "repository", "name": MODEL}, batch_size=64,
                                    output_layer="_flatten")
    table = pq.read_table(path)
    values = table.column("x").combine_chunks().flatten().to_numpy().reshape(-1, 3, 224, 224)
    for start in range(part * 64, len(values), 64 * parts):
        predict(values[start:start + 64])


def run_plain(kind: str, data: str, repeats: int) -> dict:
    from multiprocessing import get_context

    paths = sorted(str(p) for p in Path(data).glob("*.jpg"))
    pool = get_context("spawn").Pool(2)  # started once; its start-up counts in the cold run only
    runs = {
        "chain1": lambda: plain_chain(paths, 2, False),
        "chain2": lambda: pool.starmap(plain_chain, [(paths[0::2], 1, False), (paths[1::2], 1, False)]),
        "norm2": lambda: pool.starmap(plain_chain, [(paths[0::2], 1, True), (paths[1::2], 1, True)]),
        "vec1": lambda: plain_vectors(data, 2, 0, 1),
        "vec2": lambda: pool.starmap(plain_vectors, [(data, 1, 0, 2), (data, 1, 1, 2)]),
    }
    try:
        return _timed(runs[kind], repeats)
    finally:
        pool.terminate()


def _timed(run, repeats: int) -> dict:
    start = time.perf_counter()
    run()
    cold = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {"times": times, "cold": cold}


# -- Spark ---------------------------------------------------------------------------------------
def card_chain(stage):
    return (stage.resize(256, 256, keepAspectRatio=True, interpolation="bicubic").centerCrop(224, 224)
            .colorFormat("RGB").normalize(127.0, 128.0))


def spark_job(kind: str, spark, data: str):
    from irbis.ml import ImageFeaturizer, ImageTransformer, TorchModel, fuse
    from irbis.spark.images import read_images

    files = lambda: spark.read.format("binaryFile").load(data).select("path", "content")  # noqa: E731
    if kind in ("chain", "norm"):
        stage = ImageTransformer(inputCol="content", outputCol="x",
                                 outputFormat="image" if kind == "chain" else "array")
        stage = stage.resize(256, 256, keepAspectRatio=True).centerCrop(224, 224).flip(1)
        if kind == "norm":
            stage = stage.normalize(127.0, 128.0)
        return lambda: stage.transform(files()).drop("content")
    if kind == "one_pass":
        stage = ImageFeaturizer(inputCol="content", miniBatchSize=32)
        return lambda: stage.transform(files()).drop("content")
    if kind == "two_pass":
        stage = ImageFeaturizer(inputCol="image", miniBatchSize=32)
        images = read_images(data, spark=spark)
        return lambda: stage.transform(images).drop("image")
    if kind == "fused":
        chain = card_chain(ImageTransformer(inputCol="image", outputCol="pixels", outputFormat="array"))
        net = TorchModel(network=MODEL, inputCol="pixels", outputCol="features", inputShape=[3, 224, 224],
                         outputLayer="_flatten", miniBatchSize=32)
        model = fuse([chain, net])
        images = read_images(data, spark=spark)
        return lambda: model.transform(images).drop("image")
    stage = TorchModel(network=MODEL, inputCol="x", outputCol="features", inputShape=[3, 224, 224],
                       outputLayer="_flatten", miniBatchSize=64)
    return lambda: stage.transform(spark.read.parquet(data))


class WorkerMemory:
    """Samples the summed and the largest resident memory of Spark's Python workers."""

    def __init__(self) -> None:
        self.peak_total = self.peak_one = 0
        self.idle_one = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def sizes() -> list[int]:
        out = []
        for pid in os.listdir("/proc"):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd:
                    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                    out.append(rss)
            except (OSError, ValueError):
                continue
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            sizes = self.sizes()
            if sizes:
                self.peak_total = max(self.peak_total, sum(sizes))
                self.peak_one = max(self.peak_one, max(sizes))
            time.sleep(0.02)

    def __enter__(self) -> "WorkerMemory":
        sizes = self.sizes()
        self.idle_one = max(sizes) if sizes else 0
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_spark(kind: str, data: str, repeats: int) -> dict:
    from irbis.spark.session import get_spark

    conf = dict(SPARK_CONF)
    if kind in ("chain", "norm"):
        # Size binaryFile partitions by bytes (about 8 per run): with Spark's default 4 MB "open cost"
        # per file, 60 KB JPEGs make partitions of a few files and the fixed cost of each Python task
        # dominates. This is the setting a user reading many small files chooses.
        conf.update({"spark.sql.files.openCostInBytes": "0", "spark.sql.files.maxPartitionBytes": str(8 << 20)})
    if kind == "vectors":
        # One partition per Parquet row group (32 rows): an even number of equal tasks for 2 cores.
        conf["spark.sql.files.maxPartitionBytes"] = str(16 << 20)
    spark = get_spark("local[2]", **conf)
    spark.sparkContext.setLogLevel("ERROR")
    job = spark_job(kind, spark, data)
    times, memory = [], None
    for i in range(repeats + 1):
        start = time.perf_counter()
        if i == repeats and kind == "norm":
            with WorkerMemory() as memory:
                job().write.format("noop").mode("overwrite").save()
        else:
            job().write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - start)
    result = {"times": times[1:], "cold": times[0]}
    if memory is not None:
        result["memory"] = {"peak_total": memory.peak_total, "peak_one": memory.peak_one,
                            "idle_one": memory.idle_one,
                            "batch_rows": int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"))}
    spark.stop()
    return result


# -- driver --------------------------------------------------------------------------------------
METHODS = [  # label, kind, spark?, data set, section
    ("(t1) plain OpenCV loop, 1 proc x 2 threads, image bytes", "chain1", False, "chain", "chain"),
    ("(t2) plain OpenCV loop, 2 procs x 1 thread, image bytes", "chain2", False, "chain", "chain"),
    ("(u) binaryFile -> ImageTransformer(image), one pass, local[2]", "chain", True, "chain", "chain"),
    ("(t3) plain loop + normalize to float CHW, 2 procs x 1 thread", "norm2", False, "chain", "float"),
    ("(u2) binaryFile -> ImageTransformer(array), one pass, local[2]", "norm", True, "chain", "float"),
    ("(b) binaryFile -> ImageFeaturizer, one pass, local[2]", "one_pass", True, "features", "features"),
    ("(c) read_images -> ImageFeaturizer, two passes, local[2]", "two_pass", True, "features", "features"),
    ("(f) read_images -> fuse(ImageTransformer, TorchModel), local[2]", "fused", True, "features", "features"),
    ("(p1) plain loop, same kernel, 1 proc x 2 threads", "vec1", False, "vectors", "vectors"),
    ("(p2) plain loop, same kernel, 2 procs x 1 thread", "vec2", False, "vectors", "vectors"),
    ("(n) TorchModel on array<float> 3x224x224, local[2]", "vectors", True, "vectors", "vectors"),
]


def write_vectors(path: Path, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from skimage import data

    from irbis.kernels.image.network_input import preprocess_rgb
    from irbis.models import get_entry

    spec, photos = get_entry(MODEL).preprocessing, [data.chelsea(), data.coffee(), data.astronaut(), data.rocket()]
    rows = np.stack([preprocess_rgb(photos[i % 4], spec).reshape(-1) for i in range(n)])
    values = pa.array(rows.reshape(-1))
    pq.write_table(pa.table({"x": pa.FixedSizeListArray.from_arrays(values, rows.shape[1]).cast(
        pa.list_(pa.float32()))}), path, row_group_size=32)


def spawn(kind: str, spark: bool, data: str, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--data", data, "--repeats", str(repeats)]
    if spark:
        cmd.append("--spark")
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def table(rows: dict, counts: dict) -> list[str]:
    out = []
    baselines = {"chain": ("(t1)", "(t2)"), "float": ("(t3)",), "features": ("(b)",), "vectors": ("(p1)", "(p2)")}
    for section, refs in baselines.items():
        members = {k: v for k, v in rows.items() if v["section"] == section}
        best = max((v["per_s"] for k, v in members.items() if k.split(" ")[0] in refs), default=1.0)
        out += [f"## {section} ({counts[section]} rows; ratio against the best of {', '.join(refs)})", "",
                "| method | rows/s (median) | ratio | timed runs s | cold s |", "|---|---|---|---|---|"]
        for label, r in members.items():
            runs = " / ".join(f"{t:.2f}" for t in r["times"])
            out.append(f"| {label} | {r['per_s']:.1f} | {r['per_s'] / best:.2f}x | {runs} | {r['cold']:.1f} |")
        out.append("")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chain-images", type=int, default=1000)
    parser.add_argument("--images", type=int, default=192)
    parser.add_argument("--vectors", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated kinds to run")
    parser.add_argument("--child", default=None)
    parser.add_argument("--spark", action="store_true")
    parser.add_argument("--data", default=None)
    args = parser.parse_args()
    if args.child:
        run = run_spark if args.spark else run_plain
        print("RESULT " + json.dumps(run(args.child, args.data, args.repeats)))
        return
    root = Path(tempfile.mkdtemp(prefix="irbis-bench-arrow-"))
    data = {"chain": root / "chain", "features": root / "features", "vectors": root / "vectors.parquet"}
    counts = {"chain": args.chain_images, "float": args.chain_images, "features": args.images,
              "vectors": args.vectors}
    write_jpegs(data["chain"], args.chain_images)
    write_jpegs(data["features"], args.images)
    write_vectors(data["vectors"], args.vectors)
    run = Run(__file__, packages=("torch", "pyspark", "opencv-python-headless", "numpy", "pyarrow"))
    rows, memory = {}, None
    only = set(filter(None, args.only.split(",")))
    for label, kind, spark, which, section in METHODS:
        if only and kind not in only:
            continue
        result = spawn(kind, spark, str(data[which]), args.repeats)
        result.update(section=section, per_s=counts[section] / float(np.median(result["times"])))
        memory = result.get("memory", memory)
        rows[label] = result
        print(label, f"{result['per_s']:.1f} rows/s", flush=True)
    lines = [*run.header(), ""]
    lines += table(rows, counts)
    if memory:
        jpeg_mb = sum(f.stat().st_size for f in data["chain"].glob("*.jpg")) / 2**20
        lines += ["## Python worker memory during (u2)", "",
                  f"- input: {args.chain_images} JPEGs, {jpeg_mb:.1f} MiB, Arrow batches of up to "
                  f"{memory['batch_rows']} rows (one partition's files), i.e. up to {jpeg_mb:.1f} MiB",
                  f"- largest worker: idle {memory['idle_one'] / 2**20:.0f} MiB, peak "
                  f"{memory['peak_one'] / 2**20:.0f} MiB (growth "
                  f"{(memory['peak_one'] - memory['idle_one']) / 2**20:.0f}"
                  f" MiB); all workers together at peak {memory['peak_total'] / 2**20:.0f} MiB", ""]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "arrow_base.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
