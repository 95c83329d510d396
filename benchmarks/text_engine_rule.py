"""The basis of ``engine="auto"``'s rule for text networks at fp32 on the CPU: each engine inside Irbis, on this
machine's CPU, in the layout a user has.

all-MiniLM-L6-v2 over the ~1,000 drug reviews (``irbis.demo.reviews``), maxLength 256, the stages' token budget.
Two parts, each engine in a process of its own (so one engine's threads and memory do not reach the next):

  runner  Irbis's text runner without Spark on one thread, a Spark task's share on local[2];
  stage   ``TextEmbedder(engine=...)`` end to end on local[2], from one Parquet file as Spark reads it (one
          partition), to Spark's ``noop`` sink, as a user runs it.

Every figure is the best of ``REPEATS`` timed runs after one untimed run (the engine's export and load, Spark's
start). The CPU decides the order: the results file names the CPU's model (and the header its matrix
instructions), and :mod:`irbis.kernels.text_encoder` cites the runs behind the rule on each CPU it has met.

Usage: ``python benchmarks/text_engine_rule.py [--engines torch openvino onnxruntime]``; writes
``results/text_engine_rule.txt`` (a run on another CPU: ``--out`` names another file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import Run
from text import MAX_LENGTH, MODEL, spark_frame, texts, timed

HERE = Path(__file__).resolve().parent
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
REPEATS = 2
PACKAGES = ("torch", "pyspark", "tokenizers", "onnxruntime", "openvino", "numpy")


def part_runner(engine: str) -> float:
    from irbis.kernels.text_encoder import TEXT_TOKEN_BUDGET, text_runner
    from irbis.kernels.threads import set_threads
    from irbis.models.text_networks import text_source

    set_threads(1)
    data = texts(1)
    runner = text_runner(text_source(MODEL), engine=engine, precision="fp32", max_length=MAX_LENGTH,
                         token_budget=TEXT_TOKEN_BUDGET)
    return len(data) / timed(lambda: runner.encode(data), repeats=REPEATS)


def part_stage(engine: str) -> float:
    from irbis.ml import TextEmbedder
    from irbis.spark.session import get_spark

    spark = get_spark("local[2]")
    data = texts(1)
    frame = spark_frame(spark, data, Path(tempfile.mkdtemp(prefix="irbis-text-rule-")) / "reviews.parquet")
    out = TextEmbedder(inputCol="review", outputCol="e", maxLength=MAX_LENGTH, engine=engine,
                       outputFormat="array").transform(frame)
    rate = len(data) / timed(lambda: out.write.format("noop").mode("overwrite").save(), repeats=REPEATS)
    spark.stop()
    return rate


PARTS = {"runner": part_runner, "stage": part_stage}


def run_part(part: str, engine: str) -> float | str:
    done = subprocess.run([sys.executable, __file__, "--part", part, "--engine", engine], capture_output=True,
                          text=True, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return "failed: " + " ".join((done.stderr or done.stdout).strip().splitlines()[-1:])
    return float(json.loads(lines[-1])["texts_per_s"])


def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``)."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["torch", "openvino", "onnxruntime"])
    parser.add_argument("--out", default="text_engine_rule.txt", help="the results file's name")
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        print(json.dumps({"texts_per_s": PARTS[args.part](args.engine)}))
        return
    from irbis.kernels.engines import auto_order

    run = Run(__file__, packages=PACKAGES)
    rates = {(part, e): run_part(part, e) for part in PARTS for e in args.engines}
    for key, rate in rates.items():
        print(*key, rate, flush=True)
    lines = [*run.header(f"CPU: {cpu_model()}; all-MiniLM-L6-v2, {len(texts(1))} drug reviews, maxLength "
                         f"{MAX_LENGTH}, fp32; each figure the best of {REPEATS} timed runs after an untimed one"),
             "", "| engine | runner, 1 thread (texts/s) | vs torch | TextEmbedder, local[2], one Parquet file as read "
             "(texts/s) | vs torch |", "|---|---|---|---|---|"]
    for e in args.engines:
        cells = []
        for part in PARTS:
            rate, base = rates[part, e], rates.get((part, "torch"))
            numeric = isinstance(rate, float)
            cells += [f"{rate:.1f}" if numeric else rate,
                      f"{rate / base:.2f}x" if numeric and isinstance(base, float) else ""]
        lines.append(f"| {e} | " + " | ".join(cells) + " |")
    stage = {e: r for (p, e), r in rates.items() if p == "stage" and isinstance(r, float)}
    lines += ["", f"Fastest TextEmbedder engine here: {max(stage, key=stage.get) if stage else 'none ran'}; "
              f"auto's order for fp32 text on the CPU: {list(auto_order('cpu', 'fp32', 'text'))}"]
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "results" / args.out).write_text(text)


if __name__ == "__main__":
    main()
