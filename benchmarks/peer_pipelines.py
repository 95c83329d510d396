"""Ray Data and Daft, the batch-inference peers of Irbis's text and image stages, each as its own guides show
it, from the same input files to Parquet. The inference benchmarks (``text.py``, ``images.py``) run this file
in the peers' own environment (``make peers``: ``.venv-peers``; Daft pins a pyarrow older than the one
PySpark's side uses here), one process per peer and job, and print its rows beside Irbis's.

* **Ray Data** (``ray[data]``): ``read_parquet`` / ``read_binary_files`` → ``map_batches`` with an actor class
  that loads the model once (the batch-inference guide's pattern) → ``write_parquet``. Ray is started with
  ``--ray-cpus`` logical CPUs (4 on 2 cores: an actor that holds every CPU would otherwise starve the read
  and decode tasks), each actor asks for one, and the model's threads are the cores over the actors. With
  more than one actor the rows are repartitioned into blocks first, or one file's one block reaches one actor.
* **Daft**: texts with ``daft.functions.embed_text`` (provider ``transformers``: sentence-transformers on
  torch), images with a decode function (``@daft.func.batch``) and a class UDF over ONNX Runtime
  (``@daft.cls``, ``@daft.method.batch``), ``write_parquet``.

Each setting of ``--settings`` (a JSON list of ``{"actors": .., "batch": ..}``) runs once untimed (start,
model loading) and then ``--repeats`` times; the output is one JSON line: per setting the timed runs' seconds
and the untimed one's, and the packages' versions. This file imports nothing of Irbis.

Usage (as the benchmarks call it)::

    python peer_pipelines.py --peer ray --job text --input reviews.parquet --model FOLDER --settings '[...]'
    python peer_pipelines.py --peer daft --job images --input JPEG_FOLDER --model features.onnx \
        --prep '{"resize_to": 256, "input_size": [224, 224], "mean": [127, 127, 127], "std": [128, 128, 128]}'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_ops import preprocess_jpeg  # noqa: E402

CORES = os.cpu_count() or 1


def threads_per(actors: int) -> int:
    """The model's threads in each of ``actors`` copies: the cores shared out, at least one."""
    return max(1, CORES // actors)


# -- texts -----------------------------------------------------------------------------------------------
class SentenceEmbedder:
    """Ray Data's actor: sentence-transformers loaded once per actor, ``encode`` per batch (it sorts each
    batch by length itself)."""

    def __init__(self, folder: str, max_length: int, threads: int, column: str) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.model = SentenceTransformer(folder, device="cpu")
        self.model.max_seq_length = max_length
        self.column = column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch[self.column]]
        batch["embedding"] = self.model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
        return batch


def text_ray(args: argparse.Namespace, setting: dict[str, int], out: str) -> None:
    import ray

    actors, batch = setting["actors"], setting["batch"]
    data = ray.data.read_parquet(args.input)
    if actors > 1:
        data = data.repartition(4 * actors)
    data.map_batches(SentenceEmbedder, fn_constructor_args=(args.model, args.max_length, threads_per(actors),
                                                            args.column),
                     batch_size=batch, concurrency=actors, num_cpus=1, batch_format="numpy").write_parquet(out)


def text_daft(args: argparse.Namespace, setting: dict[str, int], out: str) -> None:
    import daft
    import torch
    from daft.functions import embed_text

    torch.set_num_threads(CORES)
    frame = daft.read_parquet(args.input)
    frame = frame.with_column("embedding", embed_text(daft.col(args.column), provider="transformers",
                                                      model=args.model, batch_size=setting["batch"]))
    frame.write_parquet(out)


# -- images ----------------------------------------------------------------------------------------------
class OrtFeatures:
    """Ray Data's actor: the exported network on ONNX Runtime, loaded once per actor."""

    def __init__(self, path: str, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        features = self.session.run(None, {self.name: np.stack(list(batch["x"]))})[0]
        return {"path": batch["path"], "features": features}


def decode_batch(prep: dict[str, Any]) -> Any:
    """Ray Data's decode step (tasks): the encoded files to the network's inputs."""
    def decode(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"path": batch["path"], "x": np.stack([preprocess_jpeg(b, prep) for b in batch["bytes"]])}

    return decode


def images_ray(args: argparse.Namespace, setting: dict[str, int], out: str) -> None:
    import ray

    actors, batch = setting["actors"], setting["batch"]
    prep = json.loads(args.prep)
    (ray.data.read_binary_files(args.input, include_paths=True)
     .map_batches(decode_batch(prep), batch_size=batch, batch_format="numpy")
     .map_batches(OrtFeatures, fn_constructor_args=(args.model, threads_per(actors)), batch_size=batch,
                  concurrency=actors, num_cpus=1, batch_format="numpy")
     .write_parquet(out))


def images_daft(args: argparse.Namespace, setting: dict[str, int], out: str) -> None:
    import daft
    from daft import DataType

    prep = json.loads(args.prep)
    height, width = prep["input_size"]
    actors, batch = setting["actors"], setting["batch"]

    @daft.func.batch(return_dtype=DataType.tensor(DataType.float32(), (3, height, width)), batch_size=batch)
    def decode(contents: Any) -> np.ndarray:
        return np.stack([preprocess_jpeg(b, prep) for b in contents.to_pylist()])

    @daft.cls(max_concurrency=actors)
    class Features:
        def __init__(self, path: str, threads: int) -> None:
            self.run = OrtFeatures(path, threads)

        @daft.method.batch(return_dtype=DataType.embedding(DataType.float32(), 1280), batch_size=batch)
        def __call__(self, x: Any) -> np.ndarray:
            return self.run.session.run(None, {self.run.name: np.stack(x.to_pylist()).astype(np.float32)})[0]

    features = Features(args.model, threads_per(actors))
    frame = daft.from_glob_path(os.path.join(args.input, "*.jpg"))
    frame = frame.with_column("x", decode(daft.col("path").download()))
    frame = frame.with_column("features", features(daft.col("x"))).select("path", "features")
    frame.write_parquet(out)


JOBS = {("ray", "text"): text_ray, ("daft", "text"): text_daft,
        ("ray", "images"): images_ray, ("daft", "images"): images_daft}
PACKAGES = {"ray": ("ray", "pyarrow", "torch", "sentence-transformers", "onnxruntime"),
            "daft": ("daft", "pyarrow", "torch", "sentence-transformers", "onnxruntime")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=("ray", "daft"), required=True)
    parser.add_argument("--job", choices=("text", "images"), required=True)
    parser.add_argument("--input", required=True, help="a Parquet file of texts, or a folder of JPEG files")
    parser.add_argument("--model", required=True, help="a sentence-transformers folder, or an ONNX file")
    parser.add_argument("--column", default="review", help="the texts' column")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--prep", default="{}", help="the images' preprocessing (plain_ops.preprocess_jpeg)")
    parser.add_argument("--settings", default='[{"actors": 1, "batch": 64}]')
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ray-cpus", type=int, default=2 * CORES)
    args = parser.parse_args()
    if args.peer == "ray":
        import ray

        ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
    job = JOBS[args.peer, args.job]
    work = Path(tempfile.mkdtemp(prefix="peer-out-"))
    results = {}
    for setting in json.loads(args.settings):
        times = []
        for run in range(1 + args.repeats):
            out = work / f"run{run}"
            start = time.perf_counter()
            job(args, setting, str(out))
            times.append(time.perf_counter() - start)
            rows = _rows_written(out)
            shutil.rmtree(out, ignore_errors=True)
        results[json.dumps(setting, sort_keys=True)] = {"untimed": times[0], "times": times[1:], "rows": rows}
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"results": results, "versions": {p: version(p) for p in PACKAGES[args.peer]},
                      "ray_cpus": args.ray_cpus if args.peer == "ray" else None}))


#: The peers' environment that ``make peers`` builds (or the interpreter in ``IRBIS_PEERS_PYTHON``).
PEERS_PYTHON = Path(__file__).resolve().parents[1] / ".venv-peers" / "bin" / "python"


def run_peer(peer: str, job: str, input_path: str, model: str, settings: list[dict[str, int]], repeats: int,
             **options: Any) -> dict[str, Any]:
    """Run one peer's job in the peers' environment (called from a benchmark, in Irbis's): its JSON result,
    or ``{"error": why}`` where the environment is missing or the run failed."""
    import subprocess

    python = Path(os.environ.get("IRBIS_PEERS_PYTHON", PEERS_PYTHON))
    if not python.exists():
        return {"error": f"no peers' environment at {python.name}: run `make peers`"}
    command = [str(python), __file__, "--peer", peer, "--job", job, "--input", input_path, "--model", model,
               "--settings", json.dumps(settings), "--repeats", str(repeats)]
    for key, value in options.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": ((done.stderr or done.stdout).strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def _rows_written(out: Path) -> int:
    """The rows of the Parquet files a run wrote (each run is checked to have written every input row)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in out.rglob("*.parquet"))


if __name__ == "__main__":
    main()
