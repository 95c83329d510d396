"""Inference throughput: TorchModel and ONNXModel on Spark vs plain PyTorch and PySpark's predict_batch_udf.

For each network (pretrained EfficientNet-Lite0, ResNet-50) and 224x224x3 float inputs, side by side:

  (a) plain PyTorch eager NCHW loop, one process, batch 64, 2 threads, fp32
  (a1) plain ONNX Runtime loop (the network exported by torch.export's ONNX exporter), 2 threads, fp32
  (a2) plain, best engine on this machine: the fastest of eager channels-last PyTorch, ONNX Runtime
       and OpenVINO in plain loops, as 1 process x 2 threads and as 2 processes x 1 thread, fp32
  (a3) Spark data movement alone, local[2]: the same DataFrame through a pandas UDF that returns a
       constant (parquet read, list<float> to Arrow, Arrow to the Python workers and back): the floor
       that any Spark stage pays, so the gap between (a2) and (b) splits into Spark's share and Irbis's
  (a3b) the same floor with the images stored as a binary tensor column (raw float32 bytes per row,
       ``irbis.kernels.blocks.tensor_bytes``) through an Arrow UDF, as the network stages read it
  (a4) plain loops of the reduced precisions that keep the answers: OpenVINO bf16 (stem in fp32, the
       rest in bf16) and ONNX Runtime static int8 (calibrated on shipped scikit-image photographs),
       1 process x 2 threads
  (b) irbis TorchModel on Spark local[2]: engine auto/torch/onnxruntime/openvino at fp32, and the
      reduced precisions (bf16: auto, openvino; int8: auto, torch, onnxruntime); at fp32 also on the
      binary tensor column (``inputShape`` + ``inputDtype``)
  (c) pyspark.ml.functions.predict_batch_udf on Spark local[2], fp32          -- PySpark's own way
  (d) irbis ONNXModel on Spark local[2], fp32, on the file that torch.onnx.export writes by default
      (its torch.export-based exporter), as a user would hand it over

Every Spark method runs in a fresh process with its own Spark session (so model caches and worker
memory do not leak between methods): a cold job first (starts the Python workers, loads the network),
then timed jobs that read parquet, score, and write to the ``noop`` sink. After the timed jobs the
resident memory of the Python workers is read from /proc (RSS, and PSS, which splits shared pages
fairly between the processes that map them), with how many of them loaded torch (an exported engine's
workers need not, once the export is in the machine's cache).

The precision check scores real photographs (the scikit-image / scikit-learn photos, each in 24
random crops and flips) at fp32 and at each reduced precision and reports top-1 agreement.

Usage: ``python benchmarks/inference.py [--images 256] [--repeats 2] [--models effnet,resnet50] [--quick]``
(``--quick``: 64 images, one timed run, EfficientNet-Lite0 only, to check that the script runs).
Results are printed and written to ``benchmarks/results/inference.txt``, ``inference.json`` and
``inference.png`` (a bar chart), or to ``--output FILE`` and the ``.json`` and ``.png`` beside it (the kept
runs: ``inference_effnet.txt`` from ``--models effnet``, ``inference_resnet50.txt`` for ResNet-50).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from provenance import Run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODELS = {"effnet": "efficientnet_lite0", "resnet50": "resnet50"}
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1


# -- networks ------------------------------------------------------------------------------------
def model_source(key: str, workdir: Path) -> str:
    """network for TorchModel: a repository name, or a model folder with random ResNet-50 weights."""
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
    """The network as a user exports it for ONNXModel: ``torch.onnx.export`` with its default exporter."""
    import torch

    path = workdir / f"{key}.onnx"
    if not path.exists():
        torch.onnx.export(load_plain(key, workdir), (torch.zeros(1, 3, 224, 224),), str(path),
                          input_names=["input"], output_names=["output"],
                          dynamic_shapes={"x": {0: torch.export.Dim("n", min=1, max=4096)}})
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


def run_plain_engine(key: str, engine: str, n: int, repeats: int, workdir: Path, threads: int,
                     barrier: str = "", precision: str = "fp32") -> dict:
    """A plain loop of one engine, batch 64: eager channels-last torch (fp32), or the exported network.

    With ``barrier`` (a folder), the timed runs start once every process of the layout has warmed up.
    """
    import torch

    torch.set_num_threads(threads)
    x = np.random.default_rng(0).normal(size=(n, 3, 224, 224)).astype(np.float32)
    if engine == "torch":
        net = load_plain(key, workdir).to(memory_format=torch.channels_last)

        def run(batch):
            with torch.inference_mode():
                return net(torch.from_numpy(batch).contiguous(memory_format=torch.channels_last))
    else:
        from irbis.kernels.engines import ENGINES
        from irbis.kernels.engines.export import export_onnx

        path = export_onnx(lambda: load_plain(key, workdir), None, (3, 224, 224), f"bench-{key}", workdir)
        run = ENGINES[engine].load(str(path), threads=threads, device="cpu", precision=precision,
                                   **calibration_options(precision))
    run(x[:64])  # warm-up, not timed
    wait_for_peers(barrier)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(0, n, 64):
            run(x[i:i + 64])
        times.append(time.perf_counter() - start)
    return {"times": times}


def calibration_options(precision: str) -> dict:
    """For int8: the default calibration sample (shipped photographs, EfficientNet-Lite0's preprocessing)."""
    if precision != "int8":
        return {}
    from irbis.kernels.calibration import make_calibration
    from irbis.models import get_entry

    return {"calibration": make_calibration("", get_entry("efficientnet_lite0").preprocessing),
            "shape": (3, 224, 224)}


def calibration_folder(workdir: Path) -> str:
    """A calibrationData folder for networks outside the repository: the default sample as .npy rows."""
    folder = workdir / "calibration"
    if not folder.exists():
        folder.mkdir()
        options = calibration_options("int8")
        np.save(folder / "rows.npy", options["calibration"].batch(options["shape"]))
    return str(folder)


def wait_for_peers(barrier: str, peers: int = 2) -> None:
    if not barrier:
        return
    folder = Path(barrier)
    (folder / str(os.getpid())).touch()
    while len(list(folder.iterdir())) < peers:
        time.sleep(0.05)


ENGINES_PLAIN = ("torch", "onnxruntime", "openvino")


def best_plain(key: str, n: int, repeats: int, workdir: Path) -> dict:
    """Every engine's plain loop as 1 process x 2 threads and 2 processes x 1 thread; the fastest wins."""
    from irbis.kernels.engines import ENGINES

    found = {}
    for engine in [e for e in ENGINES_PLAIN if e == "torch" or ENGINES[e].installed()]:
        one = spawn("plain_engine", key, n, repeats, workdir, engine=engine, threads=2)
        found[f"{engine} 1x2"] = n / float(np.median(one["times"]))
        barrier = Path(tempfile.mkdtemp(dir=workdir, prefix="barrier-"))
        half = max(64, n // 2)
        two = spawn_many([("plain_engine", key, half, repeats, workdir, dict(engine=engine, threads=1,
                                                                             barrier=str(barrier)))] * 2)
        found[f"{engine} 2x1"] = sum(half / float(np.median(r["times"])) for r in two)
    best = max(found, key=found.get)
    return {"times": [n / found[best]] * repeats, "choice": best, "all": found}


# -- (b), (c), (d) on Spark ------------------------------------------------------------------------------
def write_parquet(path: Path, n: int, binary: bool = False) -> None:
    """n random images in 8 files: ``image`` as array<float>, or as a binary tensor column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from irbis.kernels.blocks import tensor_bytes

    rng = np.random.default_rng(0)
    path.mkdir(parents=True, exist_ok=True)
    per_file = max(1, n // 8)
    for f in range(8):
        x = rng.normal(size=(per_file, 3 * 224 * 224)).astype(np.float32)
        arr = (tensor_bytes(x) if binary else
               pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 3 * 224 * 224).cast(pa.list_(pa.float32())))
        pq.write_table(pa.table({"id": np.arange(f * per_file, (f + 1) * per_file), "image": arr}),
                       path / f"part-{f}.parquet")


def scorer(method: str, key: str, workdir: Path, precision: str, engine: str = "auto"):
    """A function DataFrame -> DataFrame for the method."""
    if method == "torchmodel":
        from irbis import TorchModel

        stage = TorchModel(network=model_source(key, workdir), inputCol="image", outputCol="out",
                           inputShape=[3, 224, 224], precision=precision, outputFormat="array", engine=engine,
                           calibrationData=calibration_folder(workdir) if key != "effnet" else "")
        return stage.transform
    if method == "onnxmodel":
        from irbis import ONNXModel

        stage = ONNXModel(network=onnx_file(key, workdir), inputCol="image", outputCol="out",
                          inputShape=[3, 224, 224], outputFormat="array")
        return stage.transform
    if method in ("spark_floor", "spark_floor_arrow"):
        return spark_floor(arrow=method == "spark_floor_arrow")
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


def spark_floor(arrow: bool = False):
    """(a3): a pandas UDF over the image column that returns a constant per row (no network);
    (a3b, ``arrow``): the same as an Arrow UDF, the kind the network stages use."""
    import warnings

    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.functions import arrow_udf, pandas_udf
    from pyspark.util import PythonEvalType

    if arrow:
        def constant(images):
            return pa.array(np.zeros(len(images), np.float32))
        make, kind = arrow_udf, PythonEvalType.SQL_SCALAR_ARROW_UDF
    else:
        def constant(images):
            return pd.Series(np.zeros(len(images), np.float32))
        make, kind = pandas_udf, PythonEvalType.SQL_SCALAR_PANDAS_UDF
    with warnings.catch_warnings():  # the eval type is given, not inferred from type hints
        warnings.simplefilter("ignore", UserWarning)
        udf = make(constant, "float", kind)
    return lambda df: df.withColumn("out", udf("image"))


def python_workers() -> list[int]:
    """The process ids of this session's PySpark Python workers and daemons (the descendants of this
    process: other Spark applications on the machine are left out)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if not _descends_from(int(pid), os.getpid()):
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd:
            found.append(int(pid))
    return found


def python_worker_memory() -> dict:
    """RSS and PSS (MiB) summed over this session's PySpark Python worker processes
    (:func:`python_workers`), and how many of them have loaded torch (mapped ``libtorch_cpu``): an
    exported engine's workers need not."""
    rss = pss = 0
    count = with_torch = 0
    for pid in python_workers():
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
            count += 1
            with_torch += b"libtorch_cpu" in Path(f"/proc/{pid}/maps").read_bytes()
        except OSError:
            continue
    return {"processes": count, "rss_mib": rss / 1024, "pss_mib": pss / 1024, "with_torch": with_torch}


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's id, after the command name
    return False


def run_spark(method: str, key: str, n: int, repeats: int, workdir: Path, precision: str,
              engine: str = "auto") -> dict:
    from irbis import get_spark

    spark = get_spark("local[2]", **{"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    method, _, layout = method.partition(":")  # "torchmodel:binary" reads the binary tensor column
    data = workdir / (f"data-bin-{n}" if layout == "binary" else f"data-{n}")
    df = spark.read.parquet(str(data))
    score = scorer(method, key, workdir, precision, engine)
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
def precision_agreement(key: str, workdir: Path) -> dict:
    import torch

    from irbis.demo.photos import photo_crops
    from irbis.kernels.inference import make_torch_predict_fn, resolve_source

    torch.set_num_threads(2)
    x = photo_crops(MODELS[key])
    source = resolve_source(model_source(key, workdir))
    ref = make_torch_predict_fn(source, precision="fp32", engine="torch")(x).argmax(1)
    settings = {"bf16": ("bf16", "auto"), "int8": ("int8", "auto"), "bf16 openvino": ("bf16", "openvino"),
                "bf16 torch": ("bf16", "torch"), "int8 onnxruntime": ("int8", "onnxruntime"),
                "int8 torch": ("int8", "torch")}
    return {name: float((make_torch_predict_fn(source, precision=p, engine=e)(x).argmax(1) == ref).mean())
            for name, (p, e) in settings.items()} | {"photos": int(len(x))}


# -- driver ----------------------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    workdir = Path(args.workdir)
    if args.child == "plain":
        result = run_plain(args.model, args.images, args.repeats, workdir)
    elif args.child == "plain_engine":
        result = run_plain_engine(args.model, args.engine, args.images, args.repeats, workdir, args.threads,
                                  args.barrier, args.precision)
    elif args.child == "agreement":
        result = precision_agreement(args.model, workdir)
    else:
        result = run_spark(args.child, args.model, args.images, args.repeats, workdir, args.precision,
                           args.engine)
    print("RESULT " + json.dumps(result))


def _command(kind: str, key: str, n: int, repeats: int, workdir: Path, precision: str = "fp32",
             engine: str = "auto", threads: int = 2, barrier: str = "") -> list[str]:
    return [sys.executable, __file__, "--child", kind, "--model", key, "--images", str(n), "--repeats",
            str(repeats), "--workdir", str(workdir), "--precision", precision, "--engine", engine,
            "--threads", str(threads), "--barrier", barrier]


def _result(kind: str, key: str, stdout: str, stderr: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{kind} {key} failed:\n{stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def spawn(kind: str, key: str, n: int, repeats: int, workdir: Path, precision: str = "fp32", **kw: Any) -> dict:
    out = subprocess.run(_command(kind, key, n, repeats, workdir, precision, **kw), capture_output=True, text=True,
                         env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    return _result(kind, key, out.stdout, out.stderr)


def spawn_many(jobs: list[tuple]) -> list[dict]:
    """Run child processes at the same time (a process x thread layout); their results in order."""
    procs = [subprocess.Popen(_command(kind, key, n, repeats, workdir, **kw), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for kind, key, n, repeats, workdir, kw in jobs]
    return [_result(job[0], job[1], *p.communicate()) for job, p in zip(jobs, procs)]


METHODS = [  # label, kind (":binary": the images as a binary tensor column), precision, engine
    ("(a) plain PyTorch eager NCHW, 1 proc x 2 threads, fp32", "plain", "fp32", ""),
    ("(a1) plain ONNX Runtime, 1 proc x 2 threads, fp32", "plain_engine", "fp32", "onnxruntime"),
    ("(a2) plain, best engine on this machine, fp32", "best_plain", "fp32", ""),
    ("(a3) Spark data movement alone: same DataFrame through a pandas UDF that returns a constant",
     "spark_floor", "fp32", ""),
    ("(a3b) Spark data movement alone, binary tensor column (Arrow UDF returning a constant)",
     "spark_floor_arrow:binary", "fp32", ""),
    ("(a4) plain OpenVINO, 1 proc x 2 threads, bf16 (stem fp32)", "plain_engine", "bf16", "openvino"),
    ("(a4) plain ONNX Runtime, 1 proc x 2 threads, int8 static", "plain_engine", "int8", "onnxruntime"),
    ("(b) irbis TorchModel, local[2], fp32, engine=auto", "torchmodel", "fp32", "auto"),
    ("(b) irbis TorchModel, local[2], fp32, engine=auto, binary tensor column", "torchmodel:binary", "fp32", "auto"),
    ("(b) irbis TorchModel, local[2], fp32, engine=onnxruntime, binary tensor column", "torchmodel:binary", "fp32",
     "onnxruntime"),
    ("(b) irbis TorchModel, local[2], fp32, engine=openvino, binary tensor column", "torchmodel:binary", "fp32",
     "openvino"),
    ("(b) irbis TorchModel, local[2], fp32, engine=torch", "torchmodel", "fp32", "torch"),
    ("(b) irbis TorchModel, local[2], fp32, engine=onnxruntime", "torchmodel", "fp32", "onnxruntime"),
    ("(b) irbis TorchModel, local[2], fp32, engine=openvino", "torchmodel", "fp32", "openvino"),
    ("(b) irbis TorchModel, local[2], bf16, engine=auto", "torchmodel", "bf16", "auto"),
    ("(b) irbis TorchModel, local[2], bf16, engine=openvino", "torchmodel", "bf16", "openvino"),
    ("(b) irbis TorchModel, local[2], int8, engine=auto", "torchmodel", "int8", "auto"),
    ("(b) irbis TorchModel, local[2], int8, engine=torch", "torchmodel", "int8", "torch"),
    ("(b) irbis TorchModel, local[2], int8, engine=onnxruntime", "torchmodel", "int8", "onnxruntime"),
    ("(c) PySpark predict_batch_udf, local[2], fp32", "predict_batch_udf", "fp32", ""),
    ("(d) irbis ONNXModel, local[2], fp32", "onnxmodel", "fp32", ""),
    ("(d) irbis ONNXModel, local[2], fp32, binary tensor column", "onnxmodel:binary", "fp32", ""),
]
PLAIN, BEST = METHODS[0][0], METHODS[2][0]
PBU = next(label for label, kind, _, _ in METHODS if kind == "predict_batch_udf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", default="effnet,resnet50")
    parser.add_argument("--child", default=None)
    parser.add_argument("--model", default="effnet")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--barrier", default="")
    parser.add_argument("--quick", action="store_true", help="64 images, 1 timed run, EfficientNet-Lite0")
    parser.add_argument("--output", default=str(RESULTS / "inference.txt"),
                        help="the results file (its .json and .png beside it)")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.images, args.repeats, args.models = 64, 1, "effnet"
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="irbis-bench-"))
    run = Run(__file__, packages=("torch", "pyspark", "onnxruntime", "openvino", "numpy", "pyarrow"))
    about = [f"images per run: {args.images} (each model; ResNet-50 gets half), timed runs: {args.repeats}, "
             "224x224x3 float32 inputs", f"Python workers' environment (get_spark): {worker_tunables()}"]
    lines: list[str] = []
    report: dict = {}
    for key in args.models.split(","):
        n = args.images if key == "effnet" else max(64, args.images // 2)
        write_parquet(workdir / f"data-{n}", n)
        write_parquet(workdir / f"data-bin-{n}", n, binary=True)
        rows = {}
        for label, kind, precision, engine in METHODS:
            rows[label] = (best_plain(key, n, args.repeats, workdir) if kind == "best_plain" else
                           spawn(kind, key, n, args.repeats, workdir, precision, engine=engine or "auto"))
            rows[label]["images_per_s"] = n / float(np.median(rows[label]["times"]))
            print(label, f"{rows[label]['images_per_s']:.1f} img/s", flush=True)
        agreement = spawn("agreement", key, n, 1, workdir) if key == "effnet" else None
        report[key] = {"images": n, "rows": rows, "agreement": agreement}
        lines += table(MODELS[key], n, rows, agreement)
    header = run.header(*about)
    text = "\n".join([*header, "", *lines])
    print(text)
    if args.quick:
        return
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps({"provenance": header, **report}, indent=1))
    plot(report, out.with_suffix(".png"))


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
    plain, best, pbu = (rows[label]["images_per_s"] for label in (PLAIN, BEST, PBU))
    out = [f"## {model}  ({n} images per run)", "",
           "| method | images/s (median) | vs (a) plain NCHW | vs (a2) best plain | vs (c) predict_batch_udf | "
           "cold job s | workers RSS MiB | workers PSS MiB | workers with torch |",
           "|---|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        mem = r.get("memory") or {}
        out.append(f"| {label} | {r['images_per_s']:.1f} | {r['images_per_s'] / plain:.2f}x | "
                   f"{r['images_per_s'] / best:.2f}x | {r['images_per_s'] / pbu:.2f}x | "
                   f"{r.get('cold', float('nan')):.1f} | "
                   f"{mem.get('rss_mib', float('nan')):.0f} | {mem.get('pss_mib', float('nan')):.0f} | "
                   f"{mem.get('with_torch', '')} |")
    found = rows[BEST]
    out += ["", f"(a2) best plain: {found['choice']}; all layouts (img/s): "
                + ", ".join(f"{k} {v:.1f}" for k, v in found["all"].items())]
    if agreement:
        found = ", ".join(f"{k} {v:.3f}" for k, v in agreement.items() if k != "photos")
        out += ["", f"top-1 agreement with fp32 on {agreement['photos']} crops of real photographs: {found}"]
    return out + [""]


def worker_tunables() -> str:
    """The glibc tunables get_spark gives the Python workers (huge pages let the engines free their buffers)."""
    from irbis.spark.session import worker_environment

    return ", ".join(f"{k.rsplit('.', 1)[1]}={v}" for k, v in worker_environment().items())


if __name__ == "__main__":
    main()
