"""``irbis demo``: the camera-trap ladder (or, with ``--text``, the text ladder) on Spark, with its report."""

from __future__ import annotations

import argparse
from typing import Any

from irbis.cli.common import DEMO_OUTPUT, master_option, precision_option


def add_parser(sub: Any) -> None:
    """Add ``demo`` to the sub-commands ``sub``."""
    from irbis.demo.data import SIZES

    demo = sub.add_parser("demo", help="the main job: a camera-trap classifier (Snow Leopard ladder) on Spark",
                          description="Fit and compare raw-pixel logistic regression, EfficientNet-Lite0 features "
                          "cut at 1 and 2 layers, camera-trap augmentation, burst averaging and a trained MLP "
                          "head on camera-trap images split by camera, with 95%% bootstrap intervals and "
                          "camera-grouped cross-validation; write a report and the best pipeline to --output. "
                          "With --text, the text ladder on the drug reviews instead (irbis.demo.text_demo).")
    demo.add_argument("--images", default=None, help="camera-trap set: DIR/metadata.csv (path,label,camera,burst) "
                      "or DIR/<label>/<camera>/<burst>/<image>; default: build one from shipped photographs")
    demo.add_argument("--positive", default="animal", help="label of the class to detect (others are negative)")
    demo.add_argument("--output", default=DEMO_OUTPUT, help="folder for the report, figures and model (--text: "
                      f"{DEMO_OUTPUT}/text by default)")
    master_option(demo)
    precision_option(demo, "the networks' precision")
    demo.add_argument("--size", default="default", choices=list(SIZES),
                      help="size of the built set (time against confidence; ignored with --images)")
    demo.add_argument("--explain", type=int, default=3, help="test images explained with LIME (0: none)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the built set and of the camera split")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.add_argument("--fine-tune", action="store_true", help="one more rung, +F: EfficientNet-Lite0 fine-tuned "
                      "on the training cameras' images (several minutes more)")
    demo.add_argument("--text", action="store_true", help="the text ladder instead: the drug reviews' sentiment by "
                      "TF-IDF + LR, frozen MiniLM embeddings + LR, an LSTM from scratch and MiniLM fine-tuned, each "
                      "chosen by drug-grouped CV, with 95%% bootstrap intervals")
    demo.add_argument("--rungs", default=None, help="--text: comma-separated rungs to climb (default: all of "
                      "TF-IDF+LR, MiniLM+LR, LSTM, MiniLM-tuned)")
    demo.add_argument("--sample", type=int, default=None, help="--text: a random sample of this many reviews of "
                      "each split (a quick run)")
    demo.add_argument("--folds", type=int, default=3, help="--text: drug-grouped cross-validation folds")
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the camera-trap ladder (the input checked before Spark starts) and print its table and report."""
    import time

    from irbis.demo.camera_trap import run_demo
    from irbis.demo.data import check_size
    from irbis.demo.dataset import check_labels, load_metadata
    from irbis.extras import require
    from irbis.spark.session import get_spark, is_connect

    require("irbis demo", ["demo"])  # both demos: the extra brings the text, image and explanation stacks

    if args.text:
        return _run_text(args)
    check_size(args.size)  # check the input before starting Spark: bad input fails in a second
    if args.images:
        check_labels(load_metadata(args.images), args.positive)
    start = time.perf_counter()
    spark = get_spark(args.master, app_name="irbis-demo", **{"spark.ui.showConsoleProgress": "false"})
    if not is_connect(spark):  # a Connect server keeps its own log level
        spark.sparkContext.setLogLevel("ERROR")
    result = run_demo(spark, args.output, args.images, size=args.size, positive=args.positive,
                      precision=args.precision, seed=args.seed, explain=args.explain,
                      progress=not args.no_progress, fine_tune=args.fine_tune)
    print(result.table)
    print(f"best: {result.best}; report {result.output / 'report.html'}, pipeline {result.output / 'model'}")
    print(f"wall time {time.perf_counter() - start:.0f} s")
    return 0


def _run_text(args: argparse.Namespace) -> int:
    import time

    from irbis.demo.text_demo import check_options, run_text_demo
    from irbis.spark.session import get_spark, is_connect

    rungs = check_options([r.strip() for r in args.rungs.split(",")] if args.rungs else None, args.sample,
                          args.folds)
    start = time.perf_counter()
    spark = get_spark(args.master, app_name="irbis-demo-text", **{"spark.ui.showConsoleProgress": "false"})
    if not is_connect(spark):
        spark.sparkContext.setLogLevel("ERROR")
    output = args.output if args.output != DEMO_OUTPUT else f"{DEMO_OUTPUT}/text"
    result = run_text_demo(spark, output, rungs=rungs, folds=args.folds, seed=args.seed, sample=args.sample,
                           progress=not args.no_progress)
    print(result.table)
    print(f"report {result.output / 'report.html'}")
    print(f"wall time {time.perf_counter() - start:.0f} s")
    return 0
