"""Batch inference from files to Parquet, as a user has the input: Irbis on Spark against the best plain loop,
sentence-transformers, Ray Data and Daft, side by side in one run on the same cores and precision.

Two jobs, each from the same files to Parquet files of the outputs:

* **texts**: the ~1,000 drug reviews (``irbis.demo.reviews``) in one Parquet file, written once with pyarrow
  as a small table is kept, to all-MiniLM-L6-v2 embeddings (``maxLength`` 256);
* **images**: ``--images`` JPEG files (longer side 400-800 px, cut from the photographs that ship with
  scikit-image and scikit-learn, as ``images.py`` makes them) to EfficientNet-Lite0's pooled features.

The sides, each at its own best settings, each measured here in this run:

* the best plain loop without Spark: ``text.py``'s (b) (tokenizers + the fastest fp32 engine, sorted, cut by a
  token budget) and ``images.py``'s (a3) (OpenCV decode and resize + the exported network on the faster of
  ONNX Runtime and OpenVINO); the bound: the same arithmetic in one process, on both cores;
* sentence-transformers' ``encode`` alone (texts), at its best batch size;
* Irbis on Spark ``local[2]``: ``TextEmbedder`` over the one Parquet file *as Spark reads it* (one partition)
  and over the same file after ``repartition(2)``; ``ImageFeaturizer`` over the folder read with
  ``binaryFile`` on *Spark's default file split* and on the tuned split of ``images.py``
  (``openCostInBytes`` 64 KiB); fp32 (engine auto) and the reduced precision where the CPU has bf16
  instructions; every row writes Parquet;
* Ray Data and Daft, run by ``peer_pipelines.py`` in the peers' environment (``make peers``), at each
  setting of ``RAY_SETTINGS`` / ``DAFT_SETTINGS`` (actors, batch size); the best setting is the row.

Every side runs once untimed (Spark's workers and Ray's actors start, models load) and then ``REPEATS`` times;
a row is the best timed run ("warm"), and the untimed run is shown too ("first run": where a side loads its
model in every job, as Daft's ``embed_text`` does, it is what one job pays). Each side runs in its own
process.

Usage: ``python benchmarks/inference_peers.py [--images 384] [--quick]``; writes
``results/inference_peers.txt`` and ``.json`` (``--quick``: fewer images, one setting each, nothing written).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from provenance import Run

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
REPEATS = 2
RAY_SETTINGS = [{"actors": 1, "batch": 64}, {"actors": 2, "batch": 64}, {"actors": 2, "batch": 256}]
DAFT_SETTINGS = [{"actors": 1, "batch": 64}, {"actors": 1, "batch": 256}, {"actors": 2, "batch": 64}]
#: Daft's ``embed_text`` picks its own concurrency: only its batch size is a setting.
DAFT_TEXT_SETTINGS = [{"batch": 64}, {"batch": 256}, {"batch": 32}]
#: Spark's file split for the tuned image rows (images.py's SPARK_CONF); the default split sets nothing.
TUNED_SPLIT = {"spark.sql.files.maxPartitionBytes": str(32 << 20), "spark.sql.files.openCostInBytes": str(64 << 10)}
PACKAGES = ("torch", "pyspark", "sentence-transformers", "onnxruntime", "openvino", "opencv-python-headless",
            "numpy", "pyarrow")


def timed_runs(run: Any, repeats: int = REPEATS) -> dict[str, Any]:
    """One untimed run, then ``repeats`` timed ones (``images.py``'s plain-loop timing): their seconds."""
    from images import run_plain_loop

    found = run_plain_loop(run, repeats)
    return {"untimed": found["cold"], "times": found["times"]}


# -- the Irbis parts, each in its own process -------------------------------------------------------------
def part_text_irbis(args: argparse.Namespace) -> dict:
    from irbis.kernels.engines import native_bf16
    from irbis.ml import TextEmbedder
    from irbis.spark.session import get_spark

    spark = get_spark("local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    read = spark.read.parquet(str(args.parquet))
    layouts = {"one Parquet file as read": read, "one Parquet file, repartition(2)": read.repartition(2)}
    rows = {}
    out = tempfile.mkdtemp(prefix="irbis-peers-out-")
    for precision in ("fp32", *(["bf16"] if native_bf16() else [])):
        stage = TextEmbedder(inputCol="review", outputCol="embedding", maxLength=256, outputFormat="array",
                             precision=precision)
        for layout, frame in layouts.items():
            job = stage.transform(frame)
            rows[f"{precision}, {layout}"] = {
                **timed_runs(lambda: job.write.mode("overwrite").parquet(out)),
                "partitions": frame.rdd.getNumPartitions() if layout.endswith("as read") else 2}
    spark.stop()
    return rows


def part_images_irbis(args: argparse.Namespace) -> dict:
    from irbis.kernels.engines import native_bf16
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.spark.session import get_spark

    rows = {}
    out = tempfile.mkdtemp(prefix="irbis-peers-out-")
    for split, conf in (("Spark's default file split", {}), ("tuned file split", TUNED_SPLIT)):
        spark = get_spark("local[2]", **{"spark.ui.enabled": "false", **conf})
        spark.sparkContext.setLogLevel("ERROR")
        files = spark.read.format("binaryFile").load(str(args.folder)).select("path", "content")
        partitions = files.rdd.getNumPartitions()
        for precision in ("fp32", *(["bf16"] if native_bf16() else [])):
            stage = ImageFeaturizer(inputCol="content", outputCol="features", miniBatchSize=32, precision=precision)
            job = stage.transform(files).drop("content")
            rows[f"{precision}, {split}"] = {**timed_runs(lambda: job.write.mode("overwrite").parquet(out)),
                                             "partitions": partitions}
        spark.stop()
    return rows


def part_text_plain(args: argparse.Namespace) -> dict:
    import text

    st = text.part_st(argparse.Namespace(copies=1, st_batches=[16, 32]))
    plain = text.part_plain(argparse.Namespace(copies=1, budget=args.budget, reference=args.reference))
    return {"st": st["texts_per_s"], "plain": plain["texts_per_s"]}


def part_images_plain(args: argparse.Namespace) -> dict:
    import images

    files = sorted(Path(args.folder).glob("*.jpg"))
    result = images.plain_engine_runs(files, REPEATS)
    return {"engine": result["engine"], "times": result["times"], "untimed": result["cold"]}  # its timed_runs


PARTS = {"text_irbis": part_text_irbis, "images_irbis": part_images_irbis, "text_plain": part_text_plain,
         "images_plain": part_images_plain}


def run_part(name: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--part", name, "--parquet", str(args.parquet), "--folder",
               str(args.folder), "--reference", str(args.reference), "--budget", str(args.budget)]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"part {name} failed: {(done.stderr or done.stdout)[-3000:]}")
    return json.loads(lines[-1])


# -- the run ---------------------------------------------------------------------------------------------
def inputs(args: argparse.Namespace, root: Path) -> None:
    """The one Parquet file of reviews, the JPEG folder, the ONNX export of the image network and the texts'
    reference embeddings, made once for every side."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    import images
    import text
    from irbis.models import ModelRepository, get_entry

    reviews = text.texts(1)
    args.parquet = root / "reviews.parquet"
    pq.write_table(pa.table({"id": np.arange(len(reviews)), "review": reviews}), args.parquet)
    args.reference = root / "reference.npy"
    text.save_reference(1, args.reference)
    args.folder = root / "jpegs"
    images.write_jpegs(args.folder, args.images)
    entry = get_entry("efficientnet_lite0")
    spec, net = entry.preprocessing, ModelRepository().load_model("efficientnet_lite0")
    args.onnx = root / "features.onnx"
    features = type("Features", (torch.nn.Module,), {"forward": lambda self, x: net.forward_features(x)})()
    with torch.no_grad():
        torch.onnx.export(features.eval(), (torch.zeros(2, 3, *spec.input_size),), str(args.onnx), dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("batch")},))
    args.prep = json.dumps({"resize_to": spec.resize_to, "input_size": list(spec.input_size),
                            "mean": list(spec.mean), "std": list(spec.std)})
    args.text_model = text.folder()


def peers(args: argparse.Namespace, job: str) -> dict[str, dict]:
    from peer_pipelines import run_peer

    found = {}
    for peer, settings in (("ray", RAY_SETTINGS), ("daft", DAFT_TEXT_SETTINGS if job == "text" else DAFT_SETTINGS)):
        if job == "text":
            result = run_peer(peer, "text", str(args.parquet), args.text_model, settings[:args.settings], REPEATS)
        else:
            result = run_peer(peer, "images", str(args.folder), str(args.onnx), settings[:args.settings], REPEATS,
                              prep=args.prep)
        found[peer] = result
        print(peer, job, json.dumps(result), flush=True)
    return found


def rate(n: int, run: dict) -> float:
    return n / min(run["times"])


def report(args: argparse.Namespace, parts: dict, header: list[str]) -> str:
    lines = [*header]
    for job, unit, n in (("text", "texts/s", len(np.load(args.reference))), ("images", "img/s", args.images)):
        plain, irbis, peer = parts[f"{job}_plain"], parts[f"{job}_irbis"], parts[f"{job}_peers"]
        rows: list[tuple[str, str, float, float]] = []  # side, setting, warm rate, first-run rate
        if job == "text":
            best_plain = max(plain["plain"].values())
            engine = max(plain["plain"], key=plain["plain"].get)
            rows.append(("plain tokenizers + engine, sorted, no Spark (the bound)", f"{engine} fp32", best_plain,
                         float("nan")))
            st = max(plain["st"], key=plain["st"].get)
            rows.append(("sentence-transformers encode", st, plain["st"][st], float("nan")))
        else:
            best_plain = rate(n, plain)
            rows.append(("plain OpenCV + exported network, no Spark (the bound)", f"{plain['engine']} fp32",
                         best_plain, n / plain["untimed"]))
        stage = "TextEmbedder" if job == "text" else "ImageFeaturizer"
        for setting, run in irbis.items():
            rows.append((f"Irbis {stage}, local[2]", f"{setting} ({run['partitions']} partition"
                         f"{'s' if run['partitions'] != 1 else ''})", rate(n, run), n / run["untimed"]))
        peer_best: dict[str, float] = {}
        for name, label in (("ray", "Ray Data map_batches, actors"), ("daft", "Daft")):
            result = peer[name]
            if "error" in result:
                rows.append((label, f"not run: {result['error']}", float("nan"), float("nan")))
                continue
            for setting, run in result["results"].items():
                if run["rows"] != n:
                    raise SystemExit(f"{name} wrote {run['rows']} rows of {n}")
                s = json.loads(setting)
                actors = f"{s['actors']} actor(s), " if "actors" in s else ""
                rows.append((label, f"fp32, {actors}batch {s['batch']}", rate(n, run), n / run["untimed"]))
                peer_best[name] = max(peer_best.get(name, 0.0), rate(n, run))
        lines += ["", f"## {job}", "",
                  f"| side | setting | {unit} warm | {unit} first run | vs the bound | vs Daft | vs Ray Data |",
                  "|---|---|---|---|---|---|---|"]
        for side, setting, warm, first in rows:
            def ratio(ref: float | None, value: float = warm) -> str:
                return f"{value / ref:.2f}x" if ref and value == value else "-"
            first_text = f"{first:.1f}" if first == first else "-"
            warm_text = f"{warm:.1f}" if warm == warm else "-"
            lines.append(f"| {side} | {setting} | {warm_text} | {first_text} | {ratio(best_plain)} | "
                         f"{ratio(peer_best.get('daft'))} | {ratio(peer_best.get('ray'))} |")
        versions = {name: peer[name].get("versions") for name in ("ray", "daft") if "versions" in peer[name]}
        if versions:
            lines += ["", "Peers' environment: " + "; ".join(
                f"{name}: " + ", ".join(f"{k} {v}" for k, v in found.items()) for name, found in versions.items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--quick", action="store_true", help="64 images, one setting per peer, nothing written")
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    for name in ("parquet", "folder", "reference"):
        parser.add_argument(f"--{name}", type=Path, help=argparse.SUPPRESS)
    from irbis.kernels.text_encoder import TEXT_TOKEN_BUDGET

    parser.add_argument("--budget", type=int, default=TEXT_TOKEN_BUDGET, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        print(json.dumps(PARTS[args.part](args)))
        return
    args.settings = 1 if args.quick else len(RAY_SETTINGS)
    if args.quick:
        args.images = 64
    run = Run(__file__, packages=PACKAGES)
    inputs(args, Path(tempfile.mkdtemp(prefix="irbis-peers-")))
    parts = {}
    for job in ("text", "images"):
        for side in ("plain", "irbis"):
            parts[f"{job}_{side}"] = run_part(f"{job}_{side}", args)
            print(job, side, json.dumps(parts[f"{job}_{side}"]), flush=True)
        parts[f"{job}_peers"] = peers(args, job)
    header = run.header(f"local[2] and every peer on {os.cpu_count()} cores; texts: {len(np.load(args.reference))} "
                        f"drug reviews in one Parquet file, all-MiniLM-L6-v2, maxLength 256; images: {args.images} "
                        "JPEG files to EfficientNet-Lite0 features",
                        f"every side: one untimed run (its first run), then the best of {REPEATS} timed runs "
                        "(warm); every Spark and peer row writes Parquet; Ray Data on "
                        f"{2 * (os.cpu_count() or 1)} logical CPUs")
    report_text = report(args, parts, header)
    print(report_text)
    if args.quick:
        return
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "inference_peers.txt").write_text(report_text)
    (RESULTS / "inference_peers.json").write_text(json.dumps({"provenance": header, **parts}, indent=1,
                                                             default=str))


if __name__ == "__main__":
    main()
