"""Benchmark the pipeline stages against the SparkML code they replace.

1. FastVectorAssembler vs VectorAssembler: 1M rows x 100 double columns (goal: >= 1.5x faster).
2. TextFeaturizer (fit + transform) vs RegexTokenizer -> StopWordsRemover -> HashingTF -> IDF.
3. EnsembleByKey vs hand-written groupBy/agg (Summarizer.mean, and per-element avg).

Inputs are generated in Spark and cached before timing; each output is fully computed with
the ``noop`` writer. Each measurement is repeated and the median is reported.

Usage: python benchmarks/stages.py [--rows 1000000] [--repeats 3] [--out benchmarks/results/stages.txt]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

from pyspark.ml import Pipeline
from pyspark.ml.feature import IDF, HashingTF, RegexTokenizer, StopWordsRemover, VectorAssembler
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.stat import Summarizer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from irbis.ml.assembler import FastVectorAssembler
from irbis.ml.ensemble_by_key import EnsembleByKey
from irbis.ml.text import TextFeaturizer
from irbis.spark.session import get_spark
from provenance import Run

#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1


def run(df_fn: Callable[[], DataFrame], repeats: int) -> float:
    """Median seconds to build and fully compute the DataFrame returned by ``df_fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        df_fn().write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(log: list[str], title: str, cases: dict[str, Callable[[], DataFrame]], repeats: int) -> dict[str, float]:
    for fn in cases.values():  # warm-up: JIT, codegen caches
        fn().write.format("noop").mode("overwrite").save()
    results = {name: run(fn, repeats) for name, fn in cases.items()}
    base = next(iter(results.values()))
    log.append(f"\n## {title}")
    for name, secs in results.items():
        log.append(f"{name:<58} {secs:8.2f} s   speed-up vs first {base / secs:5.2f}x")
    print("\n".join(log[-len(results) - 1:]), flush=True)
    return results


def bench_assembler(spark, log, rows: int, repeats: int) -> None:
    cols = [f"c{i}" for i in range(100)]
    df = spark.range(rows).select(*[F.rand(i).alias(c) for i, c in enumerate(cols)]).cache()
    df.count()
    arrays = array_to_vector(F.array(*[F.col(c) for c in cols]))
    compare(log, f"assemble {rows} rows x 100 double columns", {
        "SparkML VectorAssembler": lambda: VectorAssembler(inputCols=cols, outputCol="f").transform(df),
        "Irbis FastVectorAssembler": lambda: FastVectorAssembler(inputCols=cols, outputCol="f").transform(df),
        "array_to_vector(array(...)) (FastVectorAssembler after a shuffle)": lambda: df.select("*", arrays.alias("f")),
    }, repeats)
    df.unpersist()


def bench_text(spark, log, docs: int, repeats: int) -> None:
    names = ("the a of and to in is it you that he was for on are with as his they be at one have this from "
             "camera trap deer fox owl night burst frame snow tree").split()
    vocab = F.array(*[F.lit(w) for w in names])
    pick = (F.rand() * len(names)).cast("int") + 1
    words = F.transform(F.sequence(F.lit(1), F.lit(30)), lambda _: F.element_at(vocab, pick))
    df = spark.range(docs).select(F.concat_ws(" ", words).alias("text")).cache()
    df.count()

    def chain():
        pipe = Pipeline(stages=[RegexTokenizer(inputCol="text", outputCol="tok"),
                                StopWordsRemover(inputCol="tok", outputCol="clean"),
                                HashingTF(inputCol="clean", outputCol="tf"), IDF(inputCol="tf", outputCol="f")])
        return pipe.fit(df).transform(df)

    def ours():
        return TextFeaturizer(inputCol="text", outputCol="f", useStopWordsRemover=True).fit(df).transform(df)

    compare(log, f"text featurisation, fit + transform, {docs} documents x 30 words", {
        "SparkML chain (tokenizer, stop words, hashingTF, IDF)": chain, "Irbis TextFeaturizer": ours,
    }, repeats)
    df.unpersist()


def bench_ensemble(spark, log, rows: int, repeats: int) -> None:
    dim = 64
    df = spark.range(rows).select(
        (F.col("id") % (rows // 10)).alias("k"), F.rand(1).alias("x"),
        array_to_vector(F.array(*[F.rand(i + 2) for i in range(dim)])).alias("v"),
    ).cache()
    df.count()

    def per_element():
        arr = df.select("k", "x", vector_to_array("v").alias("a"))
        out = arr.groupBy("k").agg(F.avg("x").alias("x"), *[F.avg(F.col("a")[i]).alias(f"e{i}") for i in range(dim)])
        return out.select("k", "x", array_to_vector(F.array(*[f"e{i}" for i in range(dim)])).alias("v"))

    compare(log, f"ensemble by key: {rows} rows, {rows // 10} keys, a number and a {dim}-dim vector", {
        "hand-written groupBy/agg: avg + Summarizer.mean":
            lambda: df.groupBy("k").agg(F.avg("x"), Summarizer.mean(F.col("v"))),
        "hand-written groupBy/agg: avg per vector element": per_element,
        "Irbis EnsembleByKey": lambda: EnsembleByKey(keys=["k"], cols=["x", "v"]).transform(df),
    }, repeats)
    df.unpersist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "stages.txt"))
    parser.add_argument("--only", choices=["assembler", "text", "ensemble"], help="run one benchmark only")
    args = parser.parse_args()
    this_run = Run(__file__, packages=("pyspark", "numpy", "pyarrow"))
    spark = get_spark("local[2]", **{"spark.ui.enabled": "false", "spark.driver.memory": "6g",
                                     "spark.sql.shuffle.partitions": "4"})
    spark.sparkContext.setLogLevel("ERROR")
    about = [f"{platform.system()} {platform.release()}; master local[2]; "
             f"java {spark.sparkContext._jvm.System.getProperty('java.version')}",
             f"median of {args.repeats} runs after one warm-up; outputs computed with the noop writer"]
    log: list[str] = []
    if args.only in (None, "assembler"):
        bench_assembler(spark, log, args.rows, args.repeats)
    if args.only in (None, "text"):
        bench_text(spark, log, args.docs, args.repeats)
    if args.only in (None, "ensemble"):
        bench_ensemble(spark, log, args.rows, args.repeats)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(this_run.header(*about) + log) + "\n")
    spark.stop()


if __name__ == "__main__":
    main()
