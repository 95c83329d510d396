"""The main job: a camera-trap classifier on Spark that reproduces the Snow Leopard experiment's ladder.

The MMLSpark paper (Hamilton et al., 2018, section 5) classified snow leopards in camera-trap images
and compared, on cameras held out of training:

=========  ==========================================================================================
LR120      logistic regression on the raw pixels, resized to 120 x 120
EN1, EN2   pretrained network features with 1 / 2 final layers cut off + logistic regression (the paper
           used ResNet-50, "RN1"/"RN2"; Irbis ships pretrained weights for EfficientNet-Lite0 only, so
           EN1 is its pooled 1280-d feature and EN2 its 1280 x 7 x 7 head activation)
EN1+A      EN1 trained on the images and their left-right mirror images; test scores averaged over both
EN1+A+E    EN1+A with the scores averaged over each camera burst (frames of one trigger)
=========  ==========================================================================================

The paper built +A and +E on RN2, its better deep variant; here the pooled EN1 features are the
better ones (EN2's unpooled 7 x 7 map ties each feature to a position in the frame, and a linear model
on 62,720 such features generalises poorly from a few hundred images), so +A and +E build on EN1.

Each image is decoded, mirrored and featurized once (one cached DataFrame with the raw pixels and both
feature columns); the variants then fit Spark ML ``LogisticRegression`` on its columns. The test set
is whole cameras (frames of a burst are correlated: a random split would leak). The best variant's
per-image pipeline (feature stages + fitted logistic regression) is saved with ``PipelineModel.save``.

Examples
--------
>>> result = run_demo(spark, output="demo-out")        # doctest: +SKIP
>>> print(result.table)                                # doctest: +SKIP
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.ml import PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.functions import vector_to_array
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from irbis.demo.dataset import check_labels, load_metadata, split_by_camera
from irbis.demo.progress import spark_progress
from irbis.demo.report import Scores, format_table, score, write_report
from irbis.ml.ensemble import EnsembleByKey
from irbis.ml.featurizer import ImageFeaturizer
from irbis.ml.image import ImageSetAugmenter, ImageTransformer, UnrollImage
from irbis.spark.images import read_images

__all__ = ["DemoResult", "VARIANTS", "run_demo"]

#: variant -> (feature column, augmented training, burst ensembling, description)
VARIANTS: dict[str, tuple[str, bool, bool, str]] = {
    "LR120": ("raw", False, False, "logistic regression on raw 120x120 pixels"),
    "EN1": ("f1", False, False, "EfficientNet-Lite0, 1 layer cut (pooled 1280-d) + LR"),
    "EN2": ("f2", False, False, "EfficientNet-Lite0, 2 layers cut (1280x7x7) + LR"),
    "EN1+A": ("f1", True, False, "EN1 trained on both flips, test scores averaged over flips"),
    "EN1+A+E": ("f1", True, True, "EN1+A with scores averaged over each camera burst"),
}
_KEYS = ["path", "label", "camera", "burst"]


@dataclass
class DemoResult:
    """What :func:`run_demo` produced."""

    scores: list[Scores]
    table: str
    best: str
    output: Path
    seconds: dict[str, float] = field(default_factory=dict)


def _feature_stages(precision: str, raw_size: int) -> dict[str, list[Any]]:
    """The per-image stages that turn an ``image`` column into each feature column."""
    resize = ImageTransformer(inputCol="image", outputCol="small").resize(raw_size, raw_size, interpolation="area")
    return {
        "raw": [resize, UnrollImage(inputCol="small", outputCol="raw")],
        "f1": [ImageFeaturizer(inputCol="image", outputCol="f1", cutOutputLayers=1, precision=precision)],
        "f2": [ImageFeaturizer(inputCol="image", outputCol="f2", cutOutputLayers=2, precision=precision)],
    }


def _load_images(spark: SparkSession, meta: pd.DataFrame) -> DataFrame:
    images = read_images(meta["path"].tolist(), recursive=False, spark=spark)
    images = images.withColumn("path", F.regexp_replace("path", "^file:", ""))
    bad = images.where(F.col("error").isNotNull()).select("path", "error").collect()
    if len(bad) == len(meta):
        raise ValueError(f"none of the {len(meta)} images could be decoded, e.g. {bad[0].path}: {bad[0].error}")
    if bad:
        print(f"skipping {len(bad)} unreadable image(s), e.g. {bad[0].path}: {bad[0].error}")
    labels = spark.createDataFrame(meta[_KEYS + ["y", "is_test"]])
    return images.where(F.col("error").isNull()).drop("error").join(labels, "path").cache()


def _featurize(images: DataFrame, stages: dict[str, list[Any]], partitions: int) -> DataFrame:
    """Mirror every image, then compute raw pixels and both feature columns in one cached pass."""
    df = ImageSetAugmenter(inputCol="image", outputCol="image", flipLeftRight=True,
                           variantCol="augmentation").transform(images.repartition(partitions))
    for name in ("raw", "f1", "f2"):
        for stage in stages[name]:
            df = stage.transform(df)
    return df.select(*_KEYS, "y", "is_test", "augmentation", "raw", "f1", "f2").cache()


def _fit(train: DataFrame, col: str, reg: float) -> Any:
    lr = LogisticRegression(featuresCol=col, labelCol="y", regParam=reg, maxIter=100,
                            probabilityCol="probability", rawPredictionCol="raw_prediction")
    return lr.fit(train)


def _test_scores(model: Any, test: DataFrame, col: str, augmented: bool, bursts: bool) -> pd.DataFrame:
    scored = model.transform(test.select(*_KEYS, "y", "augmentation", col))
    scored = scored.withColumn("score", vector_to_array("probability")[1]).select(*_KEYS, "y", "score")
    if augmented:  # average each image's scores over its mirror copies
        scored = (EnsembleByKey(keys=_KEYS + ["y"], cols=["score"], colNames=["image_score"])
                  .transform(scored).withColumnRenamed("image_score", "score"))
    if bursts:  # average over the frames of each burst, keeping one row per image
        scored = (EnsembleByKey(keys=["camera", "burst"], cols=["score"], colNames=["burst_score"],
                                collapseGroup=False).transform(scored)
                  .drop("score").withColumnRenamed("burst_score", "score"))
    return scored.select("path", "y", "score").toPandas().sort_values("path", ignore_index=True)


def run_demo(spark: SparkSession, output: str | Path, images: str | Path | None = None, *,
             positive: str = "animal", precision: str = "bf16", raw_size: int = 120,
             reg_param: float = 0.05, test_fraction: float = 0.25, seed: int = 0,
             data_size: tuple[int, int, int] = (8, 8, 4), progress: bool = True) -> DemoResult:
    """Fit and evaluate the ladder; write the report, the figures and the best pipeline to ``output``.

    Parameters
    ----------
    spark : SparkSession
        The session to run on.
    output : str or Path
        Folder for ``report.html``, figures, ``metrics.json``, ``table.txt`` and ``model/``.
    images : str or Path, optional
        A camera-trap set (see :mod:`irbis.demo.dataset` for the layouts). Default: build the set of
        :mod:`irbis.demo.data` into ``output/data`` (``data_size`` = cameras, bursts per camera,
        frames per burst).
    positive : str
        The label of the class to detect; every other label is the negative class.
    precision : {"fp32", "bf16", "int8"}
        Precision of the network when featurizing.
    raw_size : int
        Side of the raw-pixel baseline's images.
    reg_param : float
        L2 regularisation of every logistic regression.
    test_fraction, seed : float, int
        Share of the cameras held out for testing, and the seed of that split (and of the built set).
    progress : bool
        Show progress bars.
    """
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    clock: dict[str, float] = {}
    start = time.perf_counter()
    if images is None:
        images = _build_data(out / "data", data_size, seed, progress)
    meta = load_metadata(images)
    meta["y"] = check_labels(meta, positive)
    meta["is_test"] = split_by_camera(meta, meta["y"].to_numpy(), test_fraction, seed)
    stages = _feature_stages(precision, raw_size)
    with spark_progress(spark, "decode, mirror and featurize", progress):
        data = _load_images(spark, meta)
        found = data.count()
        if found < len(meta):
            print(f"{len(meta) - found} image(s) of the metadata could not be read or matched; using {found}")
        feats = _featurize(data, stages, partitions=max(2 * spark.sparkContext.defaultParallelism, 8))
        feats.count()
        data.unpersist()
    clock["featurize"] = time.perf_counter() - start
    rows, curves, models = [], {}, {}
    try:
        for name, (col, augmented, bursts, text) in VARIANTS.items():
            t0 = time.perf_counter()
            with spark_progress(spark, f"fit and score {name}", progress):
                train = feats.coalesce(spark.sparkContext.defaultParallelism).where(~F.col("is_test"))
                if not augmented:
                    train = train.where(F.col("augmentation") == "original")
                key = (col, augmented)
                if key not in models:
                    models[key] = _fit(train, col, reg_param)
                test = feats.where(F.col("is_test"))
                if not augmented:
                    test = test.where(F.col("augmentation") == "original")
                scored = _test_scores(models[key], test, col, augmented, bursts)
            rows.append(score(name, text, scored["y"].to_numpy(), scored["score"].to_numpy()))
            curves[name] = (scored["y"].to_numpy(), scored["score"].to_numpy())
            clock[name] = time.perf_counter() - t0
    finally:
        feats.unpersist()
    best = max(rows, key=lambda r: (r.roc_auc, r.accuracy)).variant
    col, augmented, _, _ = VARIANTS[best]
    _save_model(out, best, stages[col], models[(col, augmented)], positive)
    clock["total"] = time.perf_counter() - start
    table = format_table(rows)
    (out / "table.txt").write_text(table + "\n")
    notes = _notes(meta, images, positive, precision, best, clock)
    write_report(out, rows, curves, ("other", positive), notes)
    return DemoResult(rows, table, best, out, clock)


def _build_data(folder: Path, size: tuple[int, int, int], seed: int, progress: bool) -> Path:
    from tqdm.auto import tqdm

    from irbis.demo.data import build_camera_trap_set

    cameras, bursts, frames = size
    with tqdm(total=cameras * bursts * frames, desc="build camera-trap photos", unit="img",
              disable=not progress) as bar:
        return build_camera_trap_set(folder, cameras=cameras, bursts_per_camera=bursts,
                                     frames_per_burst=frames, seed=seed, progress=bar.update)


def _save_model(out: Path, variant: str, stages: list[Any], lr_model: Any, positive: str) -> None:
    col, augmented, bursts, text = VARIANTS[variant]
    PipelineModel(stages=[*stages, lr_model]).write().overwrite().save(str(out / "model"))
    card = {"variant": variant, "description": text, "input": "image (Spark image struct, read_images)",
            "output": f"probability[1] = P({positive!r})", "positive_label": positive,
            "test_time": {"average_over_left_right_flip": augmented, "average_over_burst": bursts}}
    (out / "model.json").write_text(json.dumps(card, indent=2))


def _notes(meta: pd.DataFrame, images: Any, positive: str, precision: str, best: str,
           clock: dict[str, float]) -> dict[str, str]:
    test = meta[meta["is_test"]]
    return {
        "images": f"{len(meta)} from {images} ({int(meta['y'].sum())} labelled {positive!r})",
        "test cameras": ", ".join(sorted(test["camera"].unique())) + f" ({len(test)} images)",
        "train cameras": ", ".join(sorted(meta.loc[~meta["is_test"], "camera"].unique())),
        "featurization precision": precision,
        "saved pipeline": f"model/ ({best}; per-image, see model.json for the test-time averaging)",
        "seconds": ", ".join(f"{k} {v:.1f}" for k, v in clock.items()),
    }
