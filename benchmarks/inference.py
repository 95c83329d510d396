"""Inference throughput: TorchModel and ONNXModel on Spark vs plain PyTorch and PySpark's predict_batch_udf.

For each network (pretrained EfficientNet-Lite0, ResNet-50) and 224x224x3 float inputs, side by side:

  (a) plain PyTorch loop, one process, batch 64, 2 threads, fp32            -- the limit of this machine
  (b) irbis TorchModel on Spark local[2] (fp32, bf16, int8)
  (c) pyspark.ml.functions.predict_batch_udf on Spark local[2], fp32          -- PySpark's own way
  (d) irbis ONNXModel on Spark local[2], fp32

Every Spark method runs in a fresh process with its own Spark session (so model caches and worker
memory do not leak between methods): a cold job first (starts the Python workers, loads the network),
then timed jobs that read parquet, score, and write to the ``noop`` sink. After the timed jobs the
resident memory of the Python workers is read from /proc (RSS, and PSS, which splits shared pages
fairly between the processes that map them).

The precision check scores real photographs (the scikit-image / scikit-learn photos, each in 24
random crops and flips) at fp32 and at each reduced precision and reports top-1 agreement.

Usage: ``python benchmarks/inference.py [--images 256] [--repeats 2] [--models effnet,resnet50]``
Results are printed and written to ``benchmarks/results/inference.txt``, ``inference.json`` and
``inference.png`` (a bar chart).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODELS = {"effnet": "efficientnet_lite0", "resnet50": "resnet50"}


# -- networks ------------------------------------------------------------------------------------
def model_source(key: str, workdir: Path) -> str:
    """modelPath for TorchModel: a repository name, or a model folder with random ResNet-50 weights."""
    if key == "effnet":
        return "efficientnet_lite0"
    import torch

    from irbis.models import build_model

    folder = workdir / "resnet50"
    if not folder.exists():
        folder.mkdir(parents=True)
        torch.manual_seed(0)
        (folder / "architecture.json").write_text(json.dumps({"architecture": "resnet50", "options": {}}))
        torch.save(build_model("resnet50").state_dict(), folder / "weights.pt")
    return str(folder)


def load_plain(key: str, workdir: Path):
    """The network as a plain eager fp32 module (what a user would write)."""
    from irbis.kernels.inference import load_network, resolve_source

    return load_network(resolve_source(model_source(key, workdir)))


def onnx_file(key: str, workdir: Path) -> str:
    import torch

    path = workdir / f"{key}.onnx"
    if not path.exists():
        torch.onnx.export(load_plain(key, workdir), (torch.zeros(1, 3, 224, 224),), str(path),
                          input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "n"}, "output": {0: "n"}}, dynamo=False)
    return str(path)


# -- (a) plain loop ----------------------------------------------------------------------------------
def run_plain(key: str, n: int, repeats: int, workdir: Path) -> dict:
    import torch

    torch.set_num_threads(2)
    net = load_plain(key, workdir)
    x = np.random.default_rng(0).normal(size=(n, 3, 224, 224)).astype(np.float32)
    times = []
    with torch.inference_mode():
        net(torch.from_numpy(x[:64]))  # warm-up, not timed
        for _ in range(repeats):
            start = time.perf_counter()
            for i in range(0, n, 64):
                net(torch.from_numpy(x[i:i + 64]))
            times.append(time.perf_counter() - start)
    return {"times": times}


# -- (b), (c), (d) on Spark ------------------------------------------------------------------------------
def write_parquet(path: Path, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    path.mkdir(parents=True, exist_ok=True)
    per_file = max(1, n // 8)
    for f in range(8):
        x = rng.normal(size=(per_file, 3 * 224 * 224)).astype(np.float32)
        arr = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 3 * 224 * 224).cast(pa.list_(pa.float32()))
        pq.write_table(pa.table({"id": np.arange(f * per_file, (f + 1) * per_file), "image": arr}),
                       path / f"part-{f}.parquet")


def scorer(method: str, key: str, workdir: Path, precision: str):
    """A function DataFrame -> DataFrame for the method."""
    if method == "torchmodel":
        from irbis import TorchModel

        stage = TorchModel(modelPath=model_source(key, workdir), inputCol="image", outputCol="out",
                           inputShape=[3, 224, 224], precision=precision, outputType="array")
        return stage.transform
    if method == "onnxmodel":
        from irbis import ONNXModel

        stage = ONNXModel(modelPath=onnx_file(key, workdir), inputCol="image", outputCol="out",
                          inputShape=[3, 224, 224], outputType="array")
        return stage.transform
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    source = model_source(key, workdir)

    def make_predict_fn():
        import torch

        from irbis.kernels.inference import load_network, resolve_source

        net = load_network(resolve_source(source))

        def predict(x):
            with torch.inference_mode():
                return net(torch.from_numpy(x)).numpy()

        return predict

    udf = predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()), batch_size=64,
                            input_tensor_shapes=[[3, 224, 224]])
    return lambda df: df.withColumn("out", udf("image"))


def python_worker_memory() -> dict:
    """RSS and PSS (MiB) summed over this machine's PySpark Python worker processes."""
    rss = pss = 0
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"pyspark.daemon" not in cmd and b"pyspark.worker" not in cmd:
                continue
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
            count += 1
        except OSError:
            continue
    return {"processes": count, "rss_mib": rss / 1024, "pss_mib": pss / 1024}


def run_spark(method: str, key: str, n: int, repeats: int, workdir: Path, precision: str) -> dict:
    from irbis import get_spark

    spark = get_spark("local[2]", **{"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    data = workdir / f"data-{n}"
    df = spark.read.parquet(str(data))
    score = scorer(method, key, workdir, precision)
    start = time.perf_counter()
    score(df).write.format("noop").mode("overwrite").save()
    cold = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        score(df).write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - start)
    memory = python_worker_memory()
    spark.stop()
    return {"times": times, "cold": cold, "memory": memory}


# -- precision check on real photographs -----------------------------------------------------------------------
def photo_batch(crops_per_photo: int = 24) -> np.ndarray:
    import cv2
    from skimage import data
    from sklearn.datasets import load_sample_images

    from irbis.models import get_entry, preprocess_rgb

    spec = get_entry("efficientnet_lite0").preprocessing
    photos = [data.chelsea(), data.coffee(), data.rocket(), data.astronaut(), data.stereo_motorcycle()[0],
              *load_sample_images().images]
    rng = np.random.default_rng(0)
    batch = []
    for rgb in photos:
        h, w = rgb.shape[:2]
        for _ in range(crops_per_photo):
            ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
            y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
            crop = np.ascontiguousarray(rgb[y:y + ch, x:x + cw])
            if rng.random() < 0.5:
                crop = cv2.flip(crop, 1)
            batch.append(preprocess_rgb(crop, spec))
    return np.stack(batch)


def precision_agreement(key: str, workdir: Path) -> dict:
    import torch

    from irbis.kernels.inference import make_torch_predict_fn, resolve_source

    torch.set_num_threads(2)
    x = photo_batch()
    source = resolve_source(model_source(key, workdir))
    ref = make_torch_predict_fn(source, precision="fp32")(x).argmax(1)
    return {p: float((make_torch_predict_fn(source, precision=p)(x).argmax(1) == ref).mean())
            for p in ("bf16", "int8")} | {"photos": int(len(x))}


# -- driver ----------------------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    workdir = Path(args.workdir)
    if args.child == "plain":
        result = run_plain(args.model, args.images, args.repeats, workdir)
    elif args.child == "agreement":
        result = precision_agreement(args.model, workdir)
    else:
        result = run_spark(args.child, args.model, args.images, args.repeats, workdir, args.precision)
    print("RESULT " + json.dumps(result))


def spawn(kind: str, key: str, n: int, repeats: int, workdir: Path, precision: str = "fp32") -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--model", key, "--images", str(n), "--repeats",
           str(repeats), "--workdir", str(workdir), "--precision", precision]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{kind} {key} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


METHODS = [
    ("(a) plain PyTorch, 1 proc x 2 threads, fp32", "plain", "fp32"),
    ("(b) irbis TorchModel, local[2], fp32", "torchmodel", "fp32"),
    ("(b) irbis TorchModel, local[2], bf16", "torchmodel", "bf16"),
    ("(b) irbis TorchModel, local[2], int8", "torchmodel", "int8"),
    ("(c) PySpark predict_batch_udf, local[2], fp32", "predict_batch_udf", "fp32"),
    ("(d) irbis ONNXModel, local[2], fp32", "onnxmodel", "fp32"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", default="effnet,resnet50")
    parser.add_argument("--child", default=None)
    parser.add_argument("--model", default="effnet")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="irbis-bench-"))
    lines = [f"# benchmarks/inference.py  {time.strftime('%Y-%m-%d %H:%M')}",
             f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
             f"python {platform.python_version()}; " + versions(),
             f"# images per run: {args.images} (each model; ResNet-50 gets half), timed runs: {args.repeats}, "
             "224x224x3 float32 inputs", ""]
    report: dict = {}
    for key in args.models.split(","):
        n = args.images if key == "effnet" else max(64, args.images // 2)
        write_parquet(workdir / f"data-{n}", n)
        rows = {}
        for label, kind, precision in METHODS:
            rows[label] = spawn(kind, key, n, args.repeats, workdir, precision)
            rows[label]["images_per_s"] = n / float(np.median(rows[label]["times"]))
            print(label, f"{rows[label]['images_per_s']:.1f} img/s", flush=True)
        agreement = spawn("agreement", key, n, 1, workdir) if key == "effnet" else None
        report[key] = {"images": n, "rows": rows, "agreement": agreement}
        lines += table(MODELS[key], n, rows, agreement)
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "inference.txt").write_text(text + "\n")
    (RESULTS / "inference.json").write_text(json.dumps(report, indent=1))
    plot(report, RESULTS / "inference.png")


def plot(report: dict, path: Path) -> None:
    """Bar chart of images/s per method, one panel per network."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(report), figsize=(6 * len(report), 4), squeeze=False)
    for ax, (key, r) in zip(axes[0], report.items()):
        labels = [label.split(") ", 1)[1].replace(", local[2]", "") for label in r["rows"]]
        values = [row["images_per_s"] for row in r["rows"].values()]
        ax.barh(labels[::-1], values[::-1], color=["#888"] * (len(values) - 1) + ["#c44"])
        ax.set_title(f"{MODELS[key]}: images/s on 2 cores")
        ax.set_xlabel("images per second (higher is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(model: str, n: int, rows: dict, agreement: dict | None) -> list[str]:
    plain = rows[METHODS[0][0]]["images_per_s"]
    pbu = rows[METHODS[4][0]]["images_per_s"]
    out = [f"## {model}  ({n} images per run)", "",
           "| method | images/s (median) | vs (a) plain | vs (c) predict_batch_udf | cold job s | workers RSS MiB | workers PSS MiB |",
           "|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        mem = r.get("memory") or {}
        out.append(f"| {label} | {r['images_per_s']:.1f} | {r['images_per_s'] / plain:.2f}x | "
                   f"{r['images_per_s'] / pbu:.2f}x | {r.get('cold', float('nan')):.1f} | "
                   f"{mem.get('rss_mib', float('nan')):.0f} | {mem.get('pss_mib', float('nan')):.0f} |")
    if agreement:
        out += ["", f"top-1 agreement with fp32 on {agreement['photos']} crops of real photographs: "
                    f"bf16 {agreement['bf16']:.3f}, int8 {agreement['int8']:.3f}"]
    return out + [""]


def versions() -> str:
    import importlib.metadata as md

    return ", ".join(f"{p} {md.version(p)}" for p in ("torch", "pyspark", "onnxruntime", "numpy", "pyarrow"))


if __name__ == "__main__":
    main()
