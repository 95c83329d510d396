"""``irbis score`` against one plain ``pipeline.transform(spark.read.parquet(...)).write.parquet(...)`` of the same
input, and a run whose driver is killed at about 70 % and then resumed, in one run on the same cores.

The input is ``--files`` Parquet files of ``--rows`` rows in all: an ``id`` and a vector ``x`` of 128 float32;
the pipeline is a saved PipelineModel of one TorchModel, an MLP 128-1024-1024-16 (fp32), whose output ``y`` is
written with the input's columns. Every part is a process of its own on ``local[2]`` (Spark's start and the
pipeline's load are in each one's time):

  (a) baseline: ``PipelineModel.load``, then ``transform(spark.read.parquet(INPUT)).write.parquet(OUTPUT)``;
  (b) ``irbis score PIPELINE INPUT OUTPUT``, unbroken, with its default units and concurrency;
  (c) ``irbis score`` again into a new output, its process group (the driver: Python and its JVM, which on
      ``local[2]`` runs the executors too) killed with SIGKILL once 70 % of the units are done, then
      ``irbis score ... --resume``: its time as a fraction of (b)'s.

(a) and (b) run first and again after the last part: a shared machine's speed drifts over the run, and each
ratio is taken between the faster runs of each. Checks: (b) and the resumed (c) hold every id once, and their ``y``
equal (a)'s to float32 rounding.

Usage: ``python benchmarks/score_resume.py [--quick]``; writes ``results/score_resume.txt``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from provenance import Run

MEASURING_CODE = "3"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
WIDTH, HIDDEN, OUT = 128, 1024, 16
KILL_AT = 0.7


def prepare(folder: Path, files: int, rows: int) -> None:
    """Write the input files and the saved pipeline into ``folder`` (in a process of its own)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from pyspark.ml import PipelineModel

    from irbis import TorchModel, get_spark

    get_spark("local[2]", app_name="bench-score-prepare")
    rng = np.random.default_rng(0)
    (folder / "input").mkdir()
    per_file = rows // files
    for f in range(files):
        x = rng.normal(size=(per_file, WIDTH)).astype(np.float32)
        ids = np.arange(f * per_file, (f + 1) * per_file, dtype=np.int64)
        column = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), WIDTH).cast(pa.list_(pa.float32()))
        pq.write_table(pa.table({"id": ids, "x": column}), folder / "input" / f"part-{f:03d}.parquet")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                              torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    PipelineModel([TorchModel.from_module(net, inputCol="x", outputCol="y")]).write().save(str(folder / "model"))


def baseline(folder: Path) -> None:
    """(a): one plain transform and write of the whole input (over an earlier one's output)."""
    from pyspark.ml import PipelineModel

    from irbis import get_spark

    spark = get_spark("local[2]", app_name="bench-score-baseline")
    model = PipelineModel.load(str(folder / "model"))
    frame = model.transform(spark.read.parquet(str(folder / "input")))
    frame.write.mode("overwrite").parquet(str(folder / "baseline"))


def part(name: str, folder: Path) -> float:
    """Run this script's part ``name`` in a process of its own; its wall time."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--part", name, "--folder", str(folder)], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def score_command(folder: Path, output: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "irbis.cli", "score", str(folder / "model"), str(folder / "input"),
            str(folder / output), "--master", "local[2]", *extra]


def done_units(output: Path) -> int:
    """The units with a marker (its file committed)."""
    return sum(1 for p in (output / "_irbis_score" / "done").glob("unit=*") if any(p.glob("part-*")))


def planned_units(output: Path) -> int:
    import json

    plan = next((output / "_irbis_score" / "plan").glob("part-*"), None)
    return len(json.loads(plan.read_text())["units"]) if plan else 0


def timed(command: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - t0, done.stdout.strip().splitlines()[-1]


def killed_run(folder: Path) -> tuple[float, int, int]:
    """(c)'s first run, killed with SIGKILL once 70 % of the units are done: its time, units done, planned."""
    output = folder / "resumed"
    t0 = time.perf_counter()
    driver = subprocess.Popen(score_command(folder, "resumed"), cwd=ROOT, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while driver.poll() is None:
        units = planned_units(output)
        if units and done_units(output) >= KILL_AT * units:
            os.killpg(driver.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    driver.wait()
    seconds = time.perf_counter() - t0
    time.sleep(2)  # the killed JVM's memory goes back before the resume starts
    return seconds, done_units(output), planned_units(output)


def rows_of(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``id`` and ``y`` of a Parquet dataset, by id."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table(columns=["id", "y"])
    ids = table.column("id").to_numpy()
    y = np.stack([v["values"] if isinstance(v, dict) else v for v in table.column("y").to_pylist()])
    y = y.astype(np.float32)
    order = np.argsort(ids, kind="stable")
    return ids[order], y[order]


def compare(path: Path, ids: np.ndarray, y: np.ndarray) -> str:
    """How ``path``'s rows compare with the baseline's ``ids`` and ``y``."""
    got_ids, got_y = rows_of(path)
    duplicates = len(got_ids) - len(np.unique(got_ids))
    missing = len(np.setdiff1d(ids, got_ids))
    same = duplicates == 0 and missing == 0 and np.array_equal(got_ids, ids)
    diff = float(np.abs(got_y - y).max()) if same else float("nan")
    return (f"{len(got_ids)} rows, {duplicates} duplicate, {missing} missing; max |y - baseline y| {diff:.2e}"
            f" -> {'EQUAL' if same and diff <= 1e-4 * max(1.0, float(np.abs(y).max())) else 'DIFFERENT'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=48)
    parser.add_argument("--rows", type=int, default=960_000)
    parser.add_argument("--quick", action="store_true", help="a tenth of the rows")
    parser.add_argument("--output", default=str(RESULTS / "score_resume.txt"))
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        folder = Path(args.folder)
        if args.part == "prepare":
            prepare(folder, args.files, args.rows // 10 if args.quick else args.rows)
        else:
            baseline(folder)
        return

    run = Run(__file__)
    rows = args.rows // 10 if args.quick else args.rows
    with tempfile.TemporaryDirectory(prefix="bench-score-") as tmp:
        folder = Path(tmp)
        subprocess.run([sys.executable, __file__, "--part", "prepare", "--folder", tmp, "--files", str(args.files),
                        "--rows", str(args.rows), *(["--quick"] if args.quick else [])], check=True, cwd=ROOT)
        first_base_s = part("baseline", folder)
        print(f"(a) baseline {first_base_s:.1f} s", flush=True)
        full_s, full_said = timed(score_command(folder, "unbroken"))
        print(f"(b) irbis score {full_s:.1f} s: {full_said}", flush=True)
        killed_s, units_done, units = killed_run(folder)
        print(f"(c) killed after {killed_s:.1f} s with {units_done} of {units} units done", flush=True)
        resume_s, resume_said = timed(score_command(folder, "resumed", "--resume"))
        print(f"(c) resumed {resume_s:.1f} s: {resume_said}", flush=True)
        again_base_s = part("baseline", folder)
        print(f"(a) baseline again {again_base_s:.1f} s", flush=True)
        base_s = min(first_base_s, again_base_s)
        again_full_s, _ = timed(score_command(folder, "unbroken2"))
        print(f"(b) irbis score again {again_full_s:.1f} s", flush=True)
        first_full_s, full_s = full_s, min(full_s, again_full_s)
        ids, y = rows_of(folder / "baseline")
        unbroken = compare(folder / "unbroken", ids, y)
        resumed = compare(folder / "resumed", ids, y)
    lines = [
        *run.header(f"{rows} rows in {args.files} Parquet files (id, x: 128 float32); a saved PipelineModel of a "
                    f"TorchModel MLP {WIDTH}-{HIDDEN}-{HIDDEN}-{OUT}; every part a process of its own on local[2], "
                    "Spark's start and the pipeline's load included",
                    "a busy shared 2-core machine (other jobs ran beside this one): the figures are of this run"),
        "",
        "| part | wall s | vs (a) | vs (b) |",
        "|---|---|---|---|",
        f"| (a) baseline: transform(spark.read.parquet).write.parquet, the faster of {first_base_s:.1f} (first) "
        f"and {again_base_s:.1f} (last) | {base_s:.1f} | 1.00 | |",
        f"| (b) irbis score, unbroken, the faster of {first_full_s:.1f} (first) and {again_full_s:.1f} (last) | "
        f"{full_s:.1f} | {full_s / base_s:.2f} | 1.00 |",
        f"| (c) irbis score killed (SIGKILL) with {units_done} of {units} units done | {killed_s:.1f} | "
        f"{killed_s / base_s:.2f} | {killed_s / full_s:.2f} |",
        f"| (c) irbis score --resume | {resume_s:.1f} | {resume_s / base_s:.2f} | {resume_s / full_s:.2f} |",
        "",
        f"(b) first said: {full_said}",
        f"(c) resume said: {resume_said}",
        f"resume / unbroken run: {resume_s / full_s:.0%} (goal: at most 40 %)",
        f"(b) against (a): {unbroken}",
        f"(c) resumed against (a): {resumed}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
