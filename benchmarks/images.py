"""Images on disk to features: irbis on Spark vs plain OpenCV + PyTorch loops, in the same run.

The files are JPEGs of mixed sizes (longer side 400-800 px), cut at random from the photographs
that ship with scikit-image and scikit-learn. Methods:

  Features (pretrained EfficientNet-Lite0, pooled 1280-d, preprocessing of its catalogue entry):
  (a) plain loop, 1 process x 2 threads: read, cv2.imdecode, preprocess_rgb, forward_features, fp32
  (a2) the same loop in 2 processes x 1 thread (the layout Spark local[2] uses)
  (a3) plain, best engine: the network exported once with ``torch.onnx.export`` (outside the timing),
      then read, cv2.imdecode, resize + centre crop + normalise in OpenCV/numpy (the catalogue's
      preprocessing, checked against preprocess_rgb), ONNX Runtime or OpenVINO in 1 process x 2
      threads, batch 64: both engines are timed and the faster one is the row (its name in the label).
      What a user could write without Irbis; the one-pass rows are also given against it ("vs (a3)")
  (p) Spark local[2]: binaryFile -> PySpark's predict_batch_udf, whose function decodes, preprocesses
      (the same catalogue preprocessing) and runs the eager network: PySpark's own way, fp32
  (b) Spark local[2]: binaryFile -> ImageFeaturizer(inputCol="content"), decode + preprocess +
      network in one Arrow UDF pass: fp32 with engine auto, onnxruntime, openvino and torch; bf16
      and int8 with engine auto
  (b2) (b) at its best setting with ``fastDecode``: large JPEGs decoded at 1/2..1/8 scale in libjpeg
  (c) Spark local[2]: read_images -> ImageFeaturizer(inputCol="image"), two Python passes, fp32
  Transform chains (resize shorter side 256, centre crop 224, RGB, normalize, to float CHW):
  (t) plain OpenCV loop, 1 process, 2 OpenCV threads (on ``--chain-images`` files)
  (u) Spark local[2]: read_images -> ImageTransformer(outputFormat="array"), two Python passes
  (u1) Spark local[2]: binaryFile -> ImageTransformer(inputCol="content"), one pass
  Scaling: (b) on local-cluster[1,1,2048] vs local-cluster[2,1,2048].

Every method runs in its own process with its own, empty model cache (``IRBIS_HOME``). A Spark
method times two cold starts, each the first job of a new session (its Python workers start and load
the network): "first-ever s" with the cache empty, so an exported engine pays the export of the
network to ONNX (and the int8 quantisation), and "cold s" in a second session that finds the cache
the first one filled (the usual first job of an application). Timed jobs then write to the ``noop``
sink. A plain loop's "cold" is its first run (the network loads, the page cache fills).

Usage: ``python benchmarks/images.py [--images 192] [--repeats 2] [--quick] [--only TEXT ...]``
(``--quick``: 32 images, one timed run, only the features rows, to check that the script runs;
``--only``: the rows whose label contains one of the texts, e.g. ``--only "(p)" "fp32, engine=auto"``
for the cold starts of predict_batch_udf and of the featurizer); the results are printed and, for a full
run, written to ``benchmarks/results/images.txt`` and ``images.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from provenance import Run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: ``openCostInBytes``: Spark counts every file as this many bytes more when it packs files into
#: partitions (4 MiB by default, an HDFS file open); at that cost 192 JPEGs of ~60 KiB became 24 tasks
#: of 8 files, and each Python task costs about 35 ms before any work (a UDF that returns a constant took
#: 1.0 s on 24 tasks, 0.2 s on 2). At 64 KiB (about one JPEG) Spark splits the real bytes evenly over
#: the cores, as a job over many files of ordinary size gets by default.
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.files.maxPartitionBytes": str(32 << 20),
              "spark.sql.files.openCostInBytes": str(64 << 10)}
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1


def write_jpegs(folder: Path, n: int) -> None:
    """``n`` JPEG files, longer side 400-800 px, quality 90, from the shipped photographs."""
    import cv2
    from skimage import data
    from sklearn.datasets import load_sample_images

    photos = [data.chelsea(), data.coffee(), data.rocket(), data.astronaut(),
              data.stereo_motorcycle()[0], *load_sample_images().images]
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        rgb = photos[i % len(photos)]
        h, w = rgb.shape[:2]
        ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        scale = rng.uniform(400, 800) / max(ch, cw)
        crop = cv2.resize(rgb[y:y + ch, x:x + cw], (round(cw * scale), round(ch * scale)),
                          interpolation=cv2.INTER_AREA)
        cv2.imwrite(str(folder / f"img{i:05d}.jpg"), crop[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])


# -- plain loops ---------------------------------------------------------------------------------
def plain_features(files: list[Path], threads: int, batch: int = 32) -> None:
    import cv2
    import torch

    from irbis.kernels.image.network_input import preprocess_rgb
    from irbis.models import ModelRepository, get_entry

    torch.set_num_threads(threads)
    cv2.setNumThreads(threads)
    spec, net = get_entry("efficientnet_lite0").preprocessing, ModelRepository().load_model("efficientnet_lite0")
    with torch.inference_mode():
        for start in range(0, len(files), batch):
            x = []
            for f in files[start:start + batch]:
                bgr = cv2.imdecode(np.frombuffer(f.read_bytes(), np.uint8), cv2.IMREAD_COLOR)
                x.append(preprocess_rgb(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), spec))
            net.forward_features(torch.from_numpy(np.stack(x))).numpy()


def plain_chain(files: list[Path]) -> None:
    import cv2

    cv2.setNumThreads(2)
    for f in files:
        bgr = cv2.imdecode(np.frombuffer(f.read_bytes(), np.uint8), cv2.IMREAD_UNCHANGED)
        h, w = bgr.shape[:2]
        s = 256 / min(h, w)
        bgr = cv2.resize(bgr, (round(w * s), round(h * s)), interpolation=cv2.INTER_LINEAR)
        top, left = (bgr.shape[0] - 224) // 2, (bgr.shape[1] - 224) // 2
        rgb = cv2.cvtColor(bgr[top:top + 224, left:left + 224], cv2.COLOR_BGR2RGB)
        ((rgb.astype(np.float32) - 127.0) / 128.0).transpose(2, 0, 1).copy().reshape(-1)


def plain_engine_features(files: list[Path], run, spec, batch: int = 64) -> None:
    """(a3)'s loop: decode + preprocess in OpenCV/numpy (``plain_ops``), the exported network on an engine,
    batch 64."""
    from plain_ops import preprocess_jpeg

    prep = {"resize_to": spec.resize_to, "input_size": spec.input_size, "mean": spec.mean, "std": spec.std}
    for start in range(0, len(files), batch):
        run(np.stack([preprocess_jpeg(f.read_bytes(), prep) for f in files[start:start + batch]]))


def plain_engine_runs(files: list[Path], repeats: int) -> dict:
    """(a3): export once, check the preprocessing, time ONNX Runtime and OpenVINO; the faster one wins."""
    import cv2
    import torch

    from irbis.kernels.image.network_input import preprocess_rgb
    from irbis.models import ModelRepository, get_entry

    cv2.setNumThreads(2)
    spec, net = get_entry("efficientnet_lite0").preprocessing, ModelRepository().load_model("efficientnet_lite0")
    first = cv2.cvtColor(cv2.imdecode(np.frombuffer(files[0].read_bytes(), np.uint8), cv2.IMREAD_COLOR),
                         cv2.COLOR_BGR2RGB)
    checked = []
    plain_engine_features(files[:1], checked.append, spec)
    assert np.abs(checked[0][0] - preprocess_rgb(first, spec)).max() < 1e-5, "(a3) preprocessing differs"
    path = Path(tempfile.mkdtemp(prefix="irbis-bench-onnx-")) / "features.onnx"
    features = type("Features", (torch.nn.Module,), {"forward": lambda self, x: net.forward_features(x)})()
    with torch.no_grad():
        torch.onnx.export(features.eval(), (torch.zeros(2, 3, *spec.input_size),), str(path), dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("batch")},))
    results = {name: run_plain_loop(lambda run=run: plain_engine_features(files, run, spec), repeats)
               for name, run in (("onnxruntime", _ort_runner(path)), ("openvino", _ov_runner(path)))}
    best = min(results, key=lambda name: np.median(results[name]["times"]))
    return {**results[best], "engine": best, "others": {k: v for k, v in results.items() if k != best}}


def _ort_runner(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def _ov_runner(path: Path):
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                          "INFERENCE_NUM_THREADS": "2", "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    return lambda x: request.infer({0: x})


def _plain_worker(args: tuple[list[str], int]) -> None:
    plain_features([Path(p) for p in args[0]], args[1])


def run_plain(kind: str, folder: Path, repeats: int) -> dict:
    files = sorted(folder.glob("*.jpg"))
    if kind == "plain_engine":
        return plain_engine_runs(files, repeats)
    if kind == "plain2":
        from multiprocessing import get_context

        pool = get_context("spawn").Pool(2)
        run = lambda: pool.map(_plain_worker, [([str(f) for f in files[i::2]], 1) for i in (0, 1)])  # noqa: E731
    elif kind == "plain_chain":
        run = lambda: plain_chain(files)  # noqa: E731
    else:
        run = lambda: plain_features(files, 2)  # noqa: E731
    return run_plain_loop(run, repeats)


def run_plain_loop(run, repeats: int) -> dict:
    start = time.perf_counter()
    run()  # warm-up (loads the network, fills the page cache), timed as "cold"
    cold = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {"times": times, "cold": cold}


# -- Spark ---------------------------------------------------------------------------------------
def spark_job(kind: str, spark, folder: str, precision: str, engine: str):
    from irbis.ml.image import ImageTransformer
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.images import read_images

    if kind == "predict_batch_udf":
        files = spark.read.format("binaryFile").load(folder).select("path", "content")
        udf = predict_batch_udf_features()
        return lambda: files.withColumn("features", udf("content")).drop("content")
    if kind in ("one_pass", "one_pass_fast"):
        files = spark.read.format("binaryFile").load(folder).select("path", "content")
        stage = ImageFeaturizer(inputCol="content", miniBatchSize=32, precision=precision, engine=engine,
                                fastDecode=kind == "one_pass_fast")
        return lambda: stage.transform(files).drop("content")
    if kind == "two_pass":
        stage = ImageFeaturizer(inputCol="image", miniBatchSize=32, precision=precision, engine=engine)
        images = read_images(folder, spark=spark)  # runs its listing job once, here
        return lambda: stage.transform(images).drop("image")
    stage = (ImageTransformer(outputCol="x", outputFormat="array").resize(256, 256, keepAspectRatio=True)
             .centerCrop(224, 224).colorFormat("RGB").normalize(127.0, 128.0))
    if kind == "chain_one_pass":
        files = spark.read.format("binaryFile").load(folder).select("path", "content")
        stage.setInputCol("content")
        return lambda: stage.transform(files).drop("content")
    images = read_images(folder, spark=spark)
    return lambda: stage.transform(images).drop("image")


def predict_batch_udf_features():
    """(p): ``predict_batch_udf`` over the encoded files, its function as a user would write it."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    def make_predict_fn():
        import cv2
        import torch

        from irbis.kernels.image.network_input import preprocess_rgb
        from irbis.models import ModelRepository, get_entry

        spec = get_entry("efficientnet_lite0").preprocessing
        net = ModelRepository().load_model("efficientnet_lite0")

        def predict(content: np.ndarray) -> np.ndarray:
            x = np.stack([preprocess_rgb(cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR),
                                                      cv2.COLOR_BGR2RGB), spec) for b in content.reshape(-1)])
            with torch.inference_mode():
                return net.forward_features(torch.from_numpy(x)).numpy()

        return predict

    return predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()), batch_size=32)


def run_spark(kind: str, master: str, folder: Path, repeats: int, precision: str, engine: str) -> dict:
    """Two sessions in turn: the first job of each is a cold start (empty cache, then filled)."""
    from irbis.spark.session import get_spark

    times = []
    for session in range(2):
        spark = get_spark(master, **SPARK_CONF)
        spark.sparkContext.setLogLevel("ERROR")
        job = spark_job(kind, spark, str(folder), precision, engine)
        for _ in range(1 + (repeats if session else 0)):
            start = time.perf_counter()
            job().write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - start)
        spark.stop()
    return {"first": times[0], "cold": times[1], "times": times[2:]}


# -- driver --------------------------------------------------------------------------------------
#: The plain row a user could write without Irbis with the best engine; the one-pass rows are compared to it.
PLAIN_BEST = "(a3) plain, best engine: OpenCV decode+resize -> exported network, 1 proc x 2 threads, batch 64, fp32"
METHODS = [  # label, kind, master, precision, engine, section
    ("(a) plain loop, 1 proc x 2 threads, fp32", "plain", "", "fp32", "torch", "features"),
    ("(a2) plain loop, 2 procs x 1 thread, fp32", "plain2", "", "fp32", "torch", "features"),
    (PLAIN_BEST, "plain_engine", "", "fp32", "", "features"),
    ("(p) binaryFile -> predict_batch_udf (decode + eager network), local[2], fp32", "predict_batch_udf",
     "local[2]", "fp32", "torch", "features"),
    *[(f"(b) binaryFile -> ImageFeaturizer (one pass), local[2], {precision}, engine={engine}", "one_pass",
       "local[2]", precision, engine, "features")
      for precision, engine in (("fp32", "auto"), ("fp32", "onnxruntime"), ("fp32", "openvino"), ("fp32", "torch"),
                                ("bf16", "auto"), ("int8", "auto"))],
    ("(b2) (b) with fastDecode (JPEG decoded at 1/2..1/8 scale), local[2], bf16, engine=auto", "one_pass_fast",
     "local[2]", "bf16", "auto", "features"),
    ("(c) read_images -> ImageFeaturizer (two passes), local[2], fp32, engine=auto", "two_pass", "local[2]", "fp32",
     "auto", "features"),
    ("(t) plain OpenCV loop, 1 proc, 2 OpenCV threads", "plain_chain", "", "fp32", "", "chain"),
    ("(u) read_images -> ImageTransformer(array), local[2]", "chain", "local[2]", "fp32", "", "chain"),
    ("(u1) binaryFile -> ImageTransformer(array) (one pass), local[2]", "chain_one_pass", "local[2]",
     "fp32", "", "chain"),
    ("(s1) (b) on local-cluster[1,1,2048], fp32, engine=auto", "one_pass", "local-cluster[1,1,2048]", "fp32", "auto",
     "scaling"),
    ("(s2) (b) on local-cluster[2,1,2048], fp32, engine=auto", "one_pass", "local-cluster[2,1,2048]", "fp32", "auto",
     "scaling"),
]
#: The reference row of each section (the first row of the section).
REFERENCES = {section: next(m[0] for m in METHODS if m[-1] == section) for section in ("features", "chain", "scaling")}


def spawn(kind: str, master: str, folder: Path, repeats: int, precision: str, engine: str) -> dict:
    home = tempfile.mkdtemp(prefix="irbis-bench-home-")  # an empty model cache per method
    cmd = [sys.executable, __file__, "--child", kind, "--master", master, "--folder", str(folder),
           "--repeats", str(repeats), "--precision", precision, "--engine", engine]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", IRBIS_HOME=home)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    shutil.rmtree(home, ignore_errors=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{kind} on {master or 'plain'} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def table(rows: dict) -> list[str]:
    """One table per section: each row against the section's first row and, for the one-pass featurizer
    rows, against (a3), the plain loop on the best engine."""
    out = []
    for section, ref_label in REFERENCES.items():
        members = {label: r for label, r in rows.items() if r["section"] == section}
        if not members:
            continue
        ref = rows.get(ref_label, {}).get("images_per_s")
        best = rows.get(PLAIN_BEST, {}).get("images_per_s") if section == "features" else None
        extra = " vs (a3) |" if section == "features" else ""
        out += [f"## {section}", "", f"| method | images/s (median) | vs {ref_label.split(')')[0]}) |{extra} "
                "timed runs s | cold s | first-ever s |", "|---|---|---|" + "---|" * (4 + bool(extra))]
        for label, r in members.items():
            runs = " / ".join(f"{t:.1f}" for t in r["times"])
            first = f"{r['first']:.1f}" if "first" in r else "-"
            ratio = f" {_ratio(r, best) if r['kind'] in ONE_PASS else '-'} |" if extra else ""
            out.append(f"| {label}{_engine_note(r)} | {r['images_per_s']:.1f} | {_ratio(r, ref)} |{ratio} "
                       f"{runs} | {r['cold']:.1f} | {first} |")
        out.append("")
    return out


#: The kinds of the one-pass ImageFeaturizer rows (binary files decoded in the featurizer's own pass).
ONE_PASS = ("one_pass", "one_pass_fast")


def _ratio(row: dict, reference: float | None) -> str:
    return f"{row['images_per_s'] / reference:.2f}x" if reference else "-"


def _engine_note(row: dict) -> str:
    """(a3)'s engine, and the other engine's speed in that run."""
    if "engine" not in row:
        return ""
    others = ", ".join(f"{name} {r['images_per_s']:.1f} img/s" for name, r in row["others"].items())
    return f": {row['engine']}" + (f" ({others})" if others else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=192)
    parser.add_argument("--chain-images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", default=None)
    parser.add_argument("--master", default="")
    parser.add_argument("--folder", default=None)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--quick", action="store_true", help="32 images, 1 timed run, the features rows only")
    parser.add_argument("--only", nargs="+", default=None, help="only the rows whose label contains one of these")
    args = parser.parse_args()
    if args.quick:
        args.images, args.chain_images, args.repeats = 32, 32, 1
    if args.child:
        folder = Path(args.folder)
        result = (run_spark(args.child, args.master, folder, args.repeats, args.precision, args.engine)
                  if args.master
                  else run_plain(args.child, folder, args.repeats))
        print("RESULT " + json.dumps(result))
        return
    root = Path(tempfile.mkdtemp(prefix="irbis-bench-images-"))
    folder, chain_folder = root / "jpegs", root / "chain-jpegs"
    write_jpegs(folder, args.images)
    write_jpegs(chain_folder, 0 if args.quick else args.chain_images)
    mb = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
    run = Run(__file__, packages=("torch", "pyspark", "opencv-python-headless", "numpy", "pyarrow"))
    rows = {}
    for label, kind, master, precision, engine, section in METHODS:
        if args.quick and section != "features":
            continue
        n, where = (args.chain_images, chain_folder) if section == "chain" else (args.images, folder)
        if args.only and not any(text in label for text in args.only):
            continue
        rows[label] = spawn(kind, master, where, args.repeats, precision, engine)
        for r in [rows[label], *rows[label].get("others", {}).values()]:
            r["images_per_s"] = n / float(np.median(r["times"]))
        rows[label].update(section=section, kind=kind)
        print(label, f"{rows[label]['images_per_s']:.1f} img/s", flush=True)
    header = run.header(f"{args.images} JPEG files ({mb:.1f} MiB, longer side 400-800 px) for features and "
                        f"scaling, {args.chain_images} for the chains; timed runs: {args.repeats}; "
                        f"Spark conf {SPARK_CONF}")
    text = "\n".join(header + [""] + table(rows))
    print(text)
    if args.quick or args.only:  # a check that the script runs, or a few rows: not a result to keep
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "images.txt").write_text(text + "\n")
    (RESULTS / "images.json").write_text(json.dumps({"provenance": header, **rows}, indent=1))


if __name__ == "__main__":
    main()
