"""The demo's LR120 rung: the time of its camera-grouped CV against its solver settings, in one session.

LR120 is a logistic regression on raw 120 x 120 pixels (43,200 features) with regParam chosen by
Spark ML's ``CrossValidator`` with ``foldCol`` (whole training cameras). Each row runs
:func:`irbis.demo.ladder.fit_lr` with one setting on the same cached raw features of the demo's set
and reports the CV seconds, the CV AUC of each regParam, and the test accuracy and ROC AUC (with the
95 % bootstrap interval over the test bursts, so that "within noise" can be read off).

Settings: the solver's ``maxIter`` and ``tol``, the regParam grid, ``standardization``,
``elasticNetParam``, the number of partitions of the CV's rows (``parallelism``; the same number of
fits run at once), and whether the selected training rows are cached before the CV.

Usage: ``python benchmarks/demo_lr.py [--size default] [--quick]``; results are printed and written
to ``benchmarks/results/demo_lr.json``. ``--quick`` runs the small set and three settings.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from provenance import Run

#: (name, fit_lr keyword arguments, cache the CV's rows first); the first row is the demo's setting.
SETTINGS: list[tuple[str, dict[str, Any], bool]] = [
    ("demo", {}, False),
    ("maxIter 20", {"maxIter": 20}, False),
    ("maxIter 20, tol 1e-4", {"maxIter": 20, "tol": 1e-4}, False),
    ("maxIter 10", {"maxIter": 10}, False),
    ("grid (0.1, 1)", {"grid": (0.1, 1.0)}, False),
    ("no standardization", {"standardization": False}, False),
    ("elasticNet 0.5", {"elasticNetParam": 0.5}, False),
    ("1 partition, 1 fit at a time", {"parallelism": 1}, False),
    ("cached rows", {}, True),
    ("maxIter 20, cached rows", {"maxIter": 20}, True),
]
QUICK = ["demo", "maxIter 20", "cached rows"]
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1


def _raw_features(spark: Any, size: str, folder: Path) -> tuple[Any, Any, Any]:
    """The demo's set of ``size`` (built into ``folder``), its metadata and cached raw 120 x 120 pixels."""
    from irbis.demo.camera_trap import _build_data, _featurize, _load_images, _prepare
    from irbis.demo.data import check_size
    from irbis.demo.dataset import load_metadata
    from irbis.demo.ladder import feature_stages

    if not (folder / "metadata.csv").is_file():
        _build_data(folder, check_size(size), 0, False)
    meta = _prepare(load_metadata(folder), "animal", 0.25, 3, 0)
    _, data = _load_images(spark, meta, max(2 * spark.sparkContext.defaultParallelism, 8))
    feats = _featurize(data.withColumn("augmentation", F.lit("original")), feature_stages("fp32", 120), ["raw"],
                       ["raw"])
    feats.count()
    return meta, feats.where(~F.col("is_test")), feats.where(F.col("is_test"))


def _run(name: str, options: dict[str, Any], cache: bool, train: Any, test: Any, n_boot: int) -> dict[str, Any]:
    from irbis.demo.ladder import fit_lr, score_test_set
    from irbis.demo.stats import accuracy, bootstrap_ci, roc_auc

    rows = train.select("raw", "y", "fold").cache() if cache else train
    if cache:
        rows.count()
    t0 = time.perf_counter()
    model, chosen = fit_lr(rows, "raw", 3, **options)
    seconds = time.perf_counter() - t0
    if cache:
        rows.unpersist()
    scored = score_test_set(model, test, "raw", False, False)
    groups = scored["camera"] + "/" + scored["burst"].astype(str)
    acc = bootstrap_ci(accuracy, scored["y"].to_numpy(), scored["score"].to_numpy(), groups.to_numpy(), n_boot=n_boot)
    auc = bootstrap_ci(roc_auc, scored["y"].to_numpy(), scored["score"].to_numpy(), groups.to_numpy(), n_boot=n_boot)
    row = {"setting": name, "cv_seconds": round(seconds, 1), **chosen,
           "test_accuracy": [round(v, 3) for v in acc], "test_roc_auc": [round(v, 3) for v in auc]}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="default", help="the demo set's --size")
    parser.add_argument("--data", type=Path, help="folder of the set (built there when missing); default: a temp dir")
    parser.add_argument("--quick", action="store_true", help="the small set and three settings (a smoke run)")
    parser.add_argument("--only", nargs="*", help="run only these settings (by name)")
    args = parser.parse_args()
    run = Run(__file__, packages=("pyspark", "numpy", "pyarrow"))
    from irbis.spark.session import get_spark

    size = "small" if args.quick else args.size
    names = QUICK if args.quick else (args.only or [s[0] for s in SETTINGS])
    spark = get_spark()
    with tempfile.TemporaryDirectory() as tmp:
        meta, train, test = _raw_features(spark, size, args.data or Path(tmp) / "data")
        rows = [_run(name, opts, cache, train, test, 200 if args.quick else 1000)
                for name, opts, cache in SETTINGS if name in names]
    result = {"provenance": run.header(), "size": size, "images": len(meta), "machine": platform.platform(),
              "cores": spark.sparkContext.defaultParallelism, "spark": spark.version, "rows": rows}
    out = Path(__file__).parent / "results" / "demo_lr.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
