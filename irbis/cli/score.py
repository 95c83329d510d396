"""``irbis score``: a saved pipeline over a folder of files, unit by unit, resumable after its driver dies."""

from __future__ import annotations

import argparse
from typing import Any

from irbis.cli.common import master_option, mode_option


def add_parser(sub: Any) -> None:
    """Add ``score`` to the sub-commands ``sub``."""
    score = sub.add_parser(
        "score", help="a saved pipeline over images, Parquet, CSV or .txt files, written as parquet unit by unit; "
        "--resume finishes a run whose driver died",
        description="Score the files of INPUT with the saved PipelineModel PIPELINE into the Parquet dataset OUTPUT. "
        "The input is split once into units (groups of whole files), planned in OUTPUT/_irbis_score; each unit is "
        "written whole by its own Spark job, several at once. Run again with --resume, only the units without a "
        "complete output run: OUTPUT then holds the rows of one complete run, each once.")
    score.add_argument("pipeline", help="folder of a saved PipelineModel")
    score.add_argument("input", help="folder (searched recursively) or file of images, Parquet or CSV files, or "
                                     ".txt files (one text per file); any filesystem Spark reads")
    score.add_argument("output", help="the output folder (a Parquet dataset, partitioned by unit); any filesystem "
                                      "Spark writes")
    score.add_argument("--resume", action="store_true", help="finish the run that OUTPUT holds: score only the "
                       "units without a complete output (the input must be unchanged)")
    mode_option(score)
    score.add_argument("--input-format", default="auto", choices=["auto", "images", "parquet", "csv", "text"],
                       help="the kind of input files (auto: by the endings of most of them)")
    score.add_argument("--column", default="text", help="the column of a .txt file's text (--input-format text)")
    score.add_argument("--glob", help="only the file names that match this glob (default: those of the kind)")
    score.add_argument("--files-per-unit", type=int, help="input files per unit (default: split by size into "
                       "5 x concurrency units, or more of at most 256 MiB)")
    score.add_argument("--concurrency", type=int, help="units scored at once (default: the session's default "
                       "parallelism)")
    master_option(score)
    score.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Score the units of the plan that are not done yet and say what was done."""
    from irbis.ml.score import score
    from irbis.spark.session import get_spark

    spark = get_spark(args.master, app_name="irbis-score")
    result = score(args.pipeline, args.input, args.output, resume=args.resume, mode=args.mode,
                   kind=args.input_format, column=args.column, pathGlobFilter=args.glob,
                   filesPerUnit=args.files_per_unit, concurrency=args.concurrency, spark=spark)
    print(f"scored {len(result.scored)} of {result.units} units into {result.output} in {result.seconds:.1f} s"
          + (f" ({result.skipped} were done before)" if result.skipped else ""))
    return 0
