"""The main job: a camera-trap classifier on Spark that reproduces the Snow Leopard experiment's ladder.

The MMLSpark paper (Hamilton et al., 2018, section 5) classified snow leopards in camera-trap images
and compared, on cameras held out of training, raw-pixel logistic regression (LR120), pretrained
ResNet-50 features with one or two layers cut (RN1, RN2), flip augmentation (+A) and averaging over
each burst (+E). :mod:`irbis.demo.ladder` defines the rungs here (EfficientNet-Lite0 in place of
ResNet-50, plus a trained MLP head, +T).

Every figure is honest about its noise: the test set is whole cameras (frames of a burst are
correlated: a random split would leak), each metric carries a 95 % bootstrap interval over the test
bursts, each step's difference gets a paired interval, and regularisation is chosen by cross-validation
grouped by camera on the training cameras only. The original images are decoded and featurized once
(one cached DataFrame; EN1 and EN2 from the same forward pass of the network); the augmented copies
are featurized only for the better deep cut, chosen by its cross-validated AUC. The best variant's
per-image pipeline is saved with ``PipelineModel.save``.

Examples
--------
>>> result = run_demo(spark, output="demo-out", size="small")   # doctest: +SKIP
>>> print(result.table)                                        # doctest: +SKIP
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.ml import PipelineModel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from irbis.demo.data import check_size
from irbis.demo.dataset import check_labels, check_test_cameras, load_metadata, split_by_camera
from irbis.demo.head import HEAD_GRID
from irbis.demo.job_progress import spark_progress, timed
from irbis.demo.ladder import KEYS, REG_GRID, camera_folds, feature_stages, fit_head, fit_lr, score_test_set
from irbis.demo.report import Scores, Step, format_table, score_variants, write_report
from irbis.ml.image import ImageSetAugmenter
from irbis.spark.images import read_images
from irbis.spark.resources import default_parallelism

__all__ = ["AUGMENT", "DemoResult", "PAPER", "load_demo", "run_demo"]

#: The paper's accuracies (MMLSpark slides; RN2+A+E: its best, no figure given), shown beside ours.
PAPER = {"LR120": 0.656, "EN1": 0.821, "EN2": 0.875, "+A": 0.897}
#: The camera-trap copies of +A: mirrored, a closer view, a darker shot.
AUGMENT: dict[str, Any] = {"flipLeftRight": True, "cropFraction": 0.8, "exposureGain": 0.6}
_FEATURES = {"LR120": "raw", "EN1": "f1", "EN2": "f2"}


@dataclass
class DemoResult:
    """What :func:`run_demo` produced."""

    scores: list[Scores]
    table: str
    best: str
    output: Path
    seconds: dict[str, float] = field(default_factory=dict)
    chosen: dict[str, dict[str, Any]] = field(default_factory=dict)
    folds: pd.DataFrame | None = None


def _load_images(spark: SparkSession, meta: pd.DataFrame, partitions: int,
                 images: DataFrame | None = None) -> tuple[DataFrame, DataFrame]:
    """The decoded images (``images``, :func:`read_images` of the metadata's paths by default) joined with
    their labels, cached in ``partitions`` parts (decoded once): ``(cached, readable)``, the second without
    the images that could not be decoded."""
    images = read_images(meta["path"].tolist(), recursive=False, spark=spark) if images is None else images
    images = images.withColumn("path", F.regexp_replace("path", "^file:", ""))
    labels = spark.createDataFrame(meta[KEYS + ["y", "is_test", "fold"]])
    cached = images.join(labels, "path").repartition(partitions).cache()
    bad = cached.where(F.col("error").isNotNull()).select("path", "error").collect()
    if len(bad) == len(meta):
        raise ValueError(f"none of the {len(meta)} images could be decoded, e.g. {bad[0].path}: {bad[0].error}")
    if bad:
        print(f"skipping {len(bad)} unreadable image(s), e.g. {bad[0].path}: {bad[0].error}")
    return cached, cached.where(F.col("error").isNull()).drop("error")


def _featurize(df: DataFrame, stages: dict[str, list[Any]], names: list[str], cols: list[str]) -> DataFrame:
    """``df`` through the stages of each of ``names``, keeping the feature columns ``cols`` (cached)."""
    for name in names:
        for stage in stages[name]:
            df = stage.transform(df)
    return df.select(*KEYS, "y", "is_test", "fold", "augmentation", *cols).cache()


def _copies(images: DataFrame, stages: dict[str, list[Any]], col: str) -> DataFrame:
    """The augmented copies (not the originals) of every image, featurized with ``col``'s stages (cached)."""
    copies = _with_copies(images).where(F.col("augmentation") != "original")
    return _featurize(copies, stages, [col], [col])


def run_demo(spark: SparkSession, output: str | Path, images: str | Path | None = None, *,
             size: str = "default", positive: str = "animal", precision: str = "fp32", raw_size: int = 120,
             test_fraction: float = 0.25, folds: int = 3, seed: int = 0, n_boot: int = 1000,
             explain: int = 3, progress: bool = True, fine_tune: bool = False) -> DemoResult:
    """Fit and evaluate the ladder; write the report, the figures and the best pipeline to ``output``.

    Parameters
    ----------
    spark : SparkSession
        The session to run on.
    output : str or Path
        Folder for ``report.html``, figures, ``metrics.json``, ``table.txt`` and ``model/``.
    images : str or Path, optional
        A camera-trap set (see :mod:`irbis.demo.dataset` for the layouts). Default: build the set of
        :mod:`irbis.demo.data` of ``size`` into ``output/data``.
    size : {"small", "default", "large"}
        Size of the built set (:data:`irbis.demo.data.SIZES`): time against confidence.
    positive : str
        The label of the class to detect; every other label is the negative class.
    precision : {"fp32", "bf16", "int8"}
        Precision of the network when featurizing; fp32 runs on ONNX Runtime when it is installed
        (``engine="auto"``), the fastest on a CPU and the same top-1 as eager PyTorch.
    raw_size : int
        Side of the raw-pixel baseline's images.
    test_fraction, folds, seed : float, int, int
        Share of the cameras held out for testing, camera-grouped CV folds on the others, and the seed
        of the split, the folds, the bootstrap and the built set.
    n_boot : int
        Bootstrap resamples of the test bursts per interval.
    explain : int
        Test images explained with LIME in the report (0: none).
    progress : bool
        Show progress bars.
    fine_tune : bool
        Climb one more rung, +F: EfficientNet-Lite0 fine-tuned on the training cameras' images by
        :class:`irbis.ml.ImageClassifier` (augmented in the workers), scored over the copies and bursts as
        +E. It takes several minutes on 2 cores, so the default demo leaves it out.
    """
    dims = check_size(size)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    clock: dict[str, float] = {}
    start = time.perf_counter()
    if images is None:
        images = _build_data(out / "data", dims, seed, progress)
    clock["generate"] = time.perf_counter() - start
    meta = _prepare(load_metadata(images), positive, test_fraction, folds, seed)
    stages = feature_stages(precision, raw_size)
    parts = max(2 * default_parallelism(spark), 8)
    with timed(clock, "decode"):
        files = read_images(meta["path"].tolist(), recursive=False, spark=spark)  # lists them: one short job
        with spark_progress(spark, "decode", len(meta), progress):  # the decoding job alone
            cached, data = _load_images(spark, meta, parts, files)
    feats = None
    try:
        with timed(clock, "featurize"), spark_progress(spark, "featurize (raw, EN1, EN2)", len(meta), progress):
            feats = _featurize(data.withColumn("augmentation", F.lit("original")), stages, ["raw", "deep"],
                               ["raw", "f1", "f2"])
            if feats.count() < len(meta):
                print("some image(s) of the metadata could not be read or matched; using the others")
        scored, chosen, models = {}, {}, {}
        for name, col in _FEATURES.items():
            # the bar's parts: each fit of the CV, the refit on every training camera, the scoring
            with timed(clock, name), spark_progress(spark, f"cross-validate and score {name}", len(meta), progress,
                                                     steps=_cv_fits(folds) + 2) as bar:
                models[name], chosen[name] = fit_lr(feats.where(~F.col("is_test")), col, folds, on_fit=bar.step)
                bar.step()
                scored[name] = score_test_set(models[name], feats.where(F.col("is_test")), col, False, False)
        better = max(("EN1", "EN2"), key=lambda n: max(chosen[n]["cv_auc"].values()))
        _augmented_rungs(spark, data, feats, stages, better, (folds, seed), scored, chosen, models, clock,
                         (len(meta), progress))
        if fine_tune:
            with timed(clock, "+F"), spark_progress(spark, "fine-tune EfficientNet-Lite0 (+F)", len(meta), progress,
                                                     steps=2) as bar:
                models[FINE_TUNED], chosen[FINE_TUNED] = _fine_tuned_rung(data, seed)
                bar.step()
                scored[FINE_TUNED] = score_test_set(models[FINE_TUNED], _with_copies(data.where(F.col("is_test"))),
                                                    "image", True, True)
    finally:
        if feats is not None:
            feats.unpersist()
        cached.unpersist()
    return _finish(spark, out, meta, images, scored, chosen, models, stages, better,
                   dict(positive=positive, precision=precision, n_boot=n_boot, seed=seed, explain=explain),
                   clock, start)


def _cv_fits(folds: int, grid: dict[str, tuple[float, ...]] | None = None) -> int:
    """The fits of a cross-validation over ``folds`` folds: one per fold and setting of ``grid`` (the
    logistic regressions' :data:`REG_GRID` by default)."""
    settings = len(REG_GRID) if grid is None else math.prod(len(v) for v in grid.values())
    return folds * settings


def _augmented_rungs(spark: SparkSession, data: DataFrame, feats: DataFrame, stages: dict[str, list[Any]],
                     better: str, cv: tuple[int, int], scored: dict[str, pd.DataFrame], chosen: dict[str, Any],
                     models: dict[str, Any], clock: dict[str, float], bars: tuple[int, bool]) -> None:
    """+A, +E and +T on the better deep cut: fit on the training cameras' originals and copies.

    ``cv``: the number of CV folds and the seed (of the head); ``bars``: the number of original images
    and whether to show progress bars.
    """
    col, (folds, seed), (n, show) = _FEATURES[better], cv, bars
    copies = len(AUGMENT)  # one copy per augmentation of AUGMENT
    with timed(clock, "featurize copies"), spark_progress(spark, f"featurize the augmented copies ({better})",
                                                           copies * n, show):
        augmented = _copies(data, stages, col)
        augmented.count()  # once, before the parallel CV fits read it
    try:
        both = feats.select(*KEYS, "y", "is_test", "fold", "augmentation", col).unionByName(augmented)
        train, test = both.where(~F.col("is_test")), both.where(F.col("is_test"))
        name = f"{better}+A"
        with timed(clock, "+A +E"), spark_progress(spark, "cross-validate and score +A, +E", n, show,
                                                    steps=_cv_fits(folds) + 3) as bar:
            models[name], chosen[name] = fit_lr(train, col, folds, on_fit=bar.step)
            bar.step()
            scored[name] = score_test_set(models[name], test, col, True, False)
            bar.step()
            scored[f"{name}+E"] = score_test_set(models[name], test, col, True, True)
        models[f"{name}+E"] = models[name]  # +E averages the same per-image model's scores at test time
        with timed(clock, "+T"), spark_progress(spark, "cross-validate and train the MLP head (+T)", n, show,
                                                 steps=_cv_fits(folds, HEAD_GRID) + 2) as bar:
            models[f"{name}+E+T"], chosen[f"{name}+E+T"] = fit_head(train, col, seed, on_fit=bar.step)
            bar.step()
            scored[f"{name}+E+T"] = score_test_set(models[f"{name}+E+T"], test, col, True, True)
    finally:
        augmented.unpersist()


#: The fine-tuned rung's name in the table.
FINE_TUNED = "+F"
#: +F's training: the layers after this one train (the rest keeps its pretrained weights), for this many epochs.
FINE_TUNE = {"freezeUntil": "_blocks.10", "epochs": 3, "batchSize": 16}


def _with_copies(images: DataFrame) -> DataFrame:
    """The originals and their augmented copies (AUGMENT), as images with an ``augmentation`` column."""
    aug = ImageSetAugmenter(inputCol="image", outputCol="image", variantCol="augmentation", **AUGMENT)
    return aug.transform(images)


def _fine_tuned_rung(data: DataFrame, seed: int) -> tuple[Any, dict[str, Any]]:
    """+F: EfficientNet-Lite0 fine-tuned on the training cameras' images (random crops, flips, darker and grey
    frames drawn in the workers), two data-parallel Spark tasks."""
    from irbis.ml.image_classifier import ImageClassifier

    augmentation = [{"op": "random_resized_crop", "scale": [0.6, 1.0]}, {"op": "flip", "flip_code": 1, "p": 0.5},
                    {"op": "color_jitter", "brightness": 0.4, "contrast": 0.2, "p": 0.5}, {"op": "grey", "p": 0.2}]
    clf = ImageClassifier(imageCol="image", labelCol="y", numClasses=2, seed=seed, numWorkers=2, showProgress=False,
                          classWeights="balanced", augmentation=json.dumps(augmentation), **FINE_TUNE)
    model = clf.fit(data.where(~F.col("is_test")).select("image", "y"))
    return model, {**FINE_TUNE, "final training loss": round(model.training_summary[-1]["loss"], 4)}


def _prepare(meta: pd.DataFrame, positive: str, test_fraction: float, folds: int, seed: int) -> pd.DataFrame:
    """Labels, the camera split and the camera-grouped folds (checked before any Spark job)."""
    meta["y"] = check_labels(meta, positive)
    meta["is_test"] = split_by_camera(meta, meta["y"].to_numpy(), test_fraction, seed)
    check_test_cameras(meta)
    meta["fold"] = camera_folds(meta["camera"].to_numpy(), meta["is_test"].to_numpy(), folds, seed)
    return meta


def _finish(spark: SparkSession, out: Path, meta: pd.DataFrame, images: Any, scored: dict[str, pd.DataFrame],
            chosen: dict[str, Any], models: dict[str, Any], stages: dict[str, list[Any]], better: str,
            opts: dict[str, Any], clock: dict[str, float], start: float) -> DemoResult:
    rows, steps = score_variants(scored, _descriptions(better), _builds_on(better), n_boot=opts["n_boot"],
                                 seed=opts["seed"])
    best = max(rows, key=lambda r: (r.roc_auc, r.accuracy)).variant
    col = _FEATURES["EN1" if best.startswith("EN1") else "EN2" if best.startswith("EN2") else "LR120"]
    _save_model(out, best, [] if best == FINE_TUNED else stages[col], models[best], opts["positive"])
    table = format_table(rows, steps)
    (out / "table.txt").write_text(table + "\n")
    with timed(clock, "report"):
        notes = _notes(meta, images, opts, best, better, chosen, clock)
        notes.update(_head_note(steps, f"{better}+A+E+T"))
        write_report(out, rows, steps, scored, ("other", opts["positive"]), notes, _paper(better),
                     extra={"best": best, "chosen": chosen, "folds": _fold_table(meta).to_dict("records")})
    if opts["explain"]:
        from irbis.demo.inside import explain_images
        wrong = scored[best].assign(err=lambda d: (d["score"] >= 0.5) != (d["y"] == 1))
        picks = wrong.sort_values(["err", "score"], ascending=False)["path"].head(opts["explain"]).tolist()
        with timed(clock, "LIME"):
            explain_images(spark, out, picks)
    clock["total"] = time.perf_counter() - start
    (out / "seconds.json").write_text(json.dumps({k: round(v, 1) for k, v in clock.items()}, indent=2))
    return DemoResult(rows, table, best, out, clock, chosen, _fold_table(meta))


def _fold_table(meta: pd.DataFrame) -> pd.DataFrame:
    """Each camera's split: ``camera``, ``is_test`` and its CV ``fold`` (-1 for the test cameras)."""
    return meta[["camera", "is_test", "fold"]].drop_duplicates().reset_index(drop=True)


def load_demo(output: str | Path) -> DemoResult:
    """The results of a finished :func:`run_demo` in ``output``, read back from its files (``metrics.json``,
    ``table.txt``, ``seconds.json``): to compare runs or draw from one without climbing the ladder again. The
    phases' seconds come back as ``seconds.json`` keeps them, to a tenth of a second.

    Raises
    ------
    FileNotFoundError
        When ``output`` holds no finished run (``seconds.json``, written last, names the file missing).
    ValueError
        When ``metrics.json`` was written by an Irbis that kept no CV choices and folds in it.
    """
    out = Path(output)
    for name in ("metrics.json", "table.txt", "seconds.json"):
        if not (out / name).is_file():
            raise FileNotFoundError(f"{out} holds no finished camera-trap demo run: {name} is missing "
                                    "(run_demo writes seconds.json last)")
    metrics = json.loads((out / "metrics.json").read_text())
    if "chosen" not in metrics:
        raise ValueError(f"{out / 'metrics.json'} was written by an older Irbis, which kept no CV choices and folds; "
                         "run the demo again")
    scores = [Scores(**{**v, "confusion": tuple(map(tuple, v["confusion"])), "accuracy_ci": tuple(v["accuracy_ci"]),
                        "roc_auc_ci": tuple(v["roc_auc_ci"])}) for v in metrics["variants"]]
    return DemoResult(scores, (out / "table.txt").read_text().rstrip("\n"), metrics["best"], out,
                      json.loads((out / "seconds.json").read_text()), metrics["chosen"],
                      pd.DataFrame(metrics["folds"], columns=["camera", "is_test", "fold"]))


def _descriptions(better: str) -> dict[str, str]:
    a = f"{better}+A"
    return {"LR120": "logistic regression on raw 120x120 pixels",
            "EN1": "EfficientNet-Lite0, 1 layer cut (pooled 1280-d head) + LR",
            "EN2": "EfficientNet-Lite0, 2 layers cut (pooled 320-d last block, before the 1x1 head conv) + LR",
            a: f"{better} trained on flipped, closer (80% crop) and darker (x0.6) copies; test scores averaged",
            f"{a}+E": f"{a} with scores averaged over each burst (EnsembleByKey)",
            FINE_TUNED: f"EfficientNet-Lite0 fine-tuned after {FINE_TUNE['freezeUntil']} on the training cameras' "
                        f"images ({FINE_TUNE['epochs']} epochs, ImageClassifier, augmented in the workers); scores "
                        "averaged over the copies and each burst as +E",
            f"{a}+E+T": f"{a}+E with an MLP head (standardised features; width, weight decay and epochs by "
                        "grouped CV, the simplest within one standard error of the best) trained data-parallel by "
                        "TorchEstimator instead of LR"}


def _head_note(steps: list[Step], head: str) -> dict[str, str]:
    """The report's word on +T when it scores below +E, the rung it builds on (empty otherwise)."""
    step = next((st for st in steps if st.variant == head), None)
    if step is None or (step.accuracy[0] >= 0 and step.roc_auc[0] >= 0):
        return {}
    diff = "; ".join(f"{m.replace('_', ' ')} {getattr(step, m)[0]:+.3f} [{getattr(step, m)[1]:+.3f}, "
                     f"{getattr(step, m)[2]:+.3f}] ({step.verdict(m)})" for m in ("accuracy", "roc_auc"))
    return {f"{head} against {step.base}": (
        f"the MLP head scores below the logistic regression it replaces: {diff}. Both see the same "
        "features of the same training images and copies, with the same averaging over copies and bursts, "
        "and the head's width, weight decay and epochs were chosen by the same camera-grouped CV; with this "
        "few training cameras the head's extra capacity fits them rather than new cameras, and the linear "
        "model is the better choice here")}


def _builds_on(better: str) -> dict[str, str]:
    a = f"{better}+A"
    return {"EN1": "LR120", "EN2": "EN1", a: better, f"{a}+E": a, f"{a}+E+T": f"{a}+E", FINE_TUNED: f"{a}+E+T"}


def _paper(better: str) -> dict[str, float]:
    return {"LR120": PAPER["LR120"], "EN1": PAPER["EN1"], "EN2": PAPER["EN2"], f"{better}+A": PAPER["+A"]}


def _build_data(folder: Path, size: tuple[int, int, int], seed: int, progress: bool) -> Path:
    from tqdm.auto import tqdm

    from irbis.demo.data import build_camera_trap_set

    cameras, bursts, frames = size
    with tqdm(total=cameras * bursts * frames, desc="build camera-trap photos", unit="img",
              disable=not progress) as bar:
        return build_camera_trap_set(folder, cameras=cameras, bursts_per_camera=bursts,
                                     frames_per_burst=frames, seed=seed, progress=bar.update)


def _save_model(out: Path, variant: str, stages: list[Any], model: Any, positive: str) -> None:
    head = "+T" in variant
    last = model.stages if isinstance(model, PipelineModel) else [model]  # +T: standardisation + MLP
    PipelineModel(stages=[*stages, *last]).write().overwrite().save(str(out / "model"))
    card = {"variant": variant, "input": "image (Spark image struct, read_images)",
            "output": ("logits[0], logits[1]; P({0!r}) = softmax(logits)[1]" if head
                       else "probability[1] = P({0!r})").format(positive),
            "positive_label": positive,
            "test_time": {"average_over_augmented_copies": "+A" in variant, "copies": AUGMENT if "+A" in variant
                          else {}, "average_over_burst": "+E" in variant}}
    (out / "model.json").write_text(json.dumps(card, indent=2))


def _notes(meta: pd.DataFrame, images: Any, opts: dict[str, Any], best: str, better: str,
           chosen: dict[str, Any], clock: dict[str, float]) -> dict[str, str]:
    test = meta[meta["is_test"]]
    folds = meta[~meta["is_test"]].groupby("fold")["camera"].unique()
    return {
        "images": f"{len(meta)} from {images} ({int(meta['y'].sum())} labelled {opts['positive']!r})",
        "test cameras": ", ".join(sorted(test["camera"].unique()))
        + f" ({len(test)} images, {test.groupby(['camera', 'burst']).ngroups} bursts)",
        "cross-validation folds (training cameras only)": "; ".join(
            f"{k}: {', '.join(sorted(v))}" for k, v in folds.items()),
        "chosen by grouped CV": "; ".join(f"{k}: {v}" for k, v in chosen.items()),
        "better deep cut (by CV AUC on the training cameras)": better,
        "intervals": f"95% percentile bootstrap over the test bursts ({opts['n_boot']} resamples)",
        "featurization precision": opts["precision"],
        "saved pipeline": f"model/ ({best}; per-image, see model.json for the test-time averaging)",
        "seconds": ", ".join(f"{k} {v:.1f}" for k, v in clock.items()),
    }
